// The SwiGLU forward's division a / b for b = 1 + exp(-a), rounded to nearest, without a branch. Needs rcp_div.cuh
// (tk_rcp_rn_fast, tk_div_rn_fast_by) before it and TK_FAST_DIV_MAX, TK_FAST_DIV_MIN (float literals) defined.
//
// It is nvcc's own fast path of div.rn.f32 (MUFU.RCP, one Newton step, quotient, residual, correction) without the
// FCHK operand test and the branch to the slow path, which would make each element's division a basic block of its
// own. A step computes all of its elements this way and tests once (tk_div_fast_in_range over the largest and
// smallest |a| of the step) that every operand pair lies where the sequence is correctly rounded; otherwise the
// caller computes the step again with IEEE `/`:
//   * with TK_FAST_DIV_MIN <= |a| <= TK_FAST_DIV_MAX (2^-64 and 80), b <= 1 + e^80 < 2^116, so 1 / b, the quotient
//     and the residual are normal floats far from overflow, where every step scales exactly by powers of two;
//   * so the results are those of the same instructions on significands in [1, 2), where nvcc's FCHK lets its own
//     div.rn.f32 take this path, which NVIDIA guarantees to be IEEE-correct;
//   * independently of nvcc: with MUFU.RCP correctly rounded the Newton step gives y = RN(1 / b), and then
//     RN(q + (a - b q) y) = RN(a / b) (Markstein's theorem; Cornea-Hasegan, Golliver, Markstein, ARITH 1999).
//     tests/cpu/test_swiglu_division.py checks this; the GPU tests run every bf16 gate, including the one SwiGLU
//     operand pair (a = 2^-23) that a reciprocal 1 ulp off (MUFU.RCP's documented bound) would get wrong.
// NaN (in a, hence in b), +-inf and zero fail the range test. The residual is formed negated (b q - a) and the
// correction subtracted: the same values as nvcc's a - b q and its addition, and a zero keeps its sign.
__device__ __forceinline__ float tk_div_rn_fast(float a, float b) { return tk_div_rn_fast_by(a, b, tk_rcp_rn_fast(b)); }
__device__ __forceinline__ int tk_div_fast_in_range(float largest, float smallest) {
  return largest <= TK_FAST_DIV_MAX && smallest >= TK_FAST_DIV_MIN;
}
