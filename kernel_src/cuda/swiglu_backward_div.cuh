// The SwiGLU backward's two divisions of an element, 1 / b (the sigmoid) and a / b, from one reciprocal. Needs
// rcp_div.cuh before it and TK_FAST_DIV_MAX, TK_FAST_DIV_MIN_BELOW (float literals) defined.
//   * tk_rcp_rn_fast (MUFU.RCP and the Newton step) is instruction for instruction nvcc's fast path of rcp.rn.f32,
//     which nvcc takes for every b whose exponent field is in [1, 252]: for b = 1 + exp(-a) in [1, 2^116] it is
//     1 / b correctly rounded, by NVIDIA's guarantee (r = b y0 - 1 is a multiple of 2^-47 there, so nvcc's flush
//     of a subnormal -r never applies);
//   * tk_div_rn_fast_by(a, b, tk_rcp_rn_fast(b)) is tk_div_rn_fast(a, b) of swiglu_div.cuh, with its range argument.
// The step's range test also lets a = +-0 through (tk_div_fast_in_range_or_zero): b = 1 + exp(-0) = 2 exactly, so
// y = 1/2 from any MUFU.RCP result within an ulp, and the quotient is a zero of a's sign, as IEEE 0 / 2. So the
// smallest |a| is taken over nonzero gates only: tk_abs_below_or_nan_at_zero(a) is |a| one ulp toward zero (its bits
// less one), and NaN for +-0 (0x00000000 - 1 and 0x80000000 - 1 are NaN patterns), which min skips; it is compared
// against TK_FAST_DIV_MIN_BELOW, the float just below the forward's TK_FAST_DIV_MIN.
// tk_opaque_zero (0, hidden from nvcc in a volatile asm) keeps the redo's loads from being merged with the step's own.
__device__ __forceinline__ float tk_abs_below_or_nan_at_zero(float a) { return fabsf(__int_as_float(__float_as_int(a) - 1)); }
__device__ __forceinline__ int tk_div_fast_in_range_or_zero(float largest, float smallest_below) {
  return largest <= TK_FAST_DIV_MAX && smallest_below >= TK_FAST_DIV_MIN_BELOW;
}
__device__ __forceinline__ int tk_opaque_zero() { int z; asm volatile("mov.u32 %0, 0;" : "=r"(z)); return z; }
