// Lane-wise max / min of two bf16 pairs held in uint32 words (__hmax2 / __hmin2, which nvcc fuses into one
// three-input VHMNMX.BF16_V2 per two new words; like fmaxf, both return the other operand for a NaN). They take
// words because per_block_cast also reads them as uint32 for the widening, and tilelang's storage rewrite
// rejects a local buffer viewed both as uint32 and as bfloat16x2.
#include <cuda_bf16.h>
__device__ __forceinline__ unsigned tk_bf16x2_max(unsigned a, unsigned b) {
  __nv_bfloat162 r = __hmax2(*reinterpret_cast<__nv_bfloat162 *>(&a), *reinterpret_cast<__nv_bfloat162 *>(&b));
  return *reinterpret_cast<unsigned *>(&r);
}
__device__ __forceinline__ unsigned tk_bf16x2_min(unsigned a, unsigned b) {
  __nv_bfloat162 r = __hmin2(*reinterpret_cast<__nv_bfloat162 *>(&a), *reinterpret_cast<__nv_bfloat162 *>(&b));
  return *reinterpret_cast<unsigned *>(&r);
}
