// Correctly rounded float32 division without nvcc's FCHK operand test and slow-path branch, for block_scale
// (kernel_src.quant.common, fast_division=True) and the SwiGLU casts. tk_rcp_rn_fast is nvcc's own fast path of
// rcp.rn.f32: RN(1 / b) for every b whose exponent field is in [1, 252]. tk_div_rn_fast_by(a, b, y) is RN(a / b)
// from y = RN(1 / b) by one Markstein correction, q0 = RN(a y), q = RN(q0 - y RN(b q0 - a)), for operands whose
// reciprocal, quotient and residual stay normal and far from overflow (the caller checks the range).
__device__ __forceinline__ float tk_rcp_rn_fast(float b) {
  float y; asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(b));
  return __fmaf_rn(y, __fmaf_rn(-b, y, 1.0f), y);
}
__device__ __forceinline__ float tk_div_rn_fast_by(float a, float b, float y) {
  const float q = __fmul_rn(a, y);
  return __fmaf_rn(-y, __fmaf_rn(b, q, -a), q);
}
