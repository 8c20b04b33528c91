// PTX max.xorsign.abs.f32 (one FMNMX.XORSIGN): max(|a|, |b|) with the sign of a xor b. e2m1_finite_top_nibble
// (kernel_src.quant.common) takes max(|v|, 1) with v's sign from it, the binade of its rounding add.
__device__ __forceinline__ float tk_max_xorsign_abs(float a, float b) {
  float r;
  asm("max.xorsign.abs.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
