// The per-row SwiGLU forward's row amax for rows of a warp or more (2^tpr_log2 >= 32 lanes); TK_NUM_WARPS is the
// CTA's warp count. amax is a max of |act| from +0 through max(), which skips NaN: +0 or above (+inf included),
// never NaN or -0, so its bits as unsigned integers order as the floats do, and one redux.sync.max.u32
// (__reduce_max_sync) is the warp's max, bit for bit the max a butterfly of FMNMX gives.
// Rows wider than a warp: a named barrier (bar.sync id, count) joins only the warps of one row group (ids 1.. ; 0 is
// __syncthreads), so warps of other rows never wait; a group is the row's warps, or 4 warps holding several rows (so
// that at most 8 ids are used). The partials go through one of two buffers by step parity: the next step's barrier
// keeps a fast warp from overwriting values a slow one still reads. Lane i then reads the partial of the row's warp
// i mod (its warps), at most 32 of them, and a second redux gives the row's max. Written in CUDA so that tilelang's
// shared-memory sync pass does not put a __syncthreads of the whole CTA around them.
__device__ __forceinline__ float tk_row_max_wide(float* partials, float amax, int tid, int tpr_log2, int parity) {
  const unsigned warp_max = __reduce_max_sync(0xffffffffu, __float_as_uint(amax));
  if (tpr_log2 == 5) return __uint_as_float(warp_max);
  unsigned* slot = reinterpret_cast<unsigned*>(partials) + parity * TK_NUM_WARPS;
  if ((tid & 31) == 0) slot[tid >> 5] = warp_max;
  const int group_log2 = max(tpr_log2, 7);
  asm volatile("bar.sync %0, %1;" :: "r"(1 + (tid >> group_log2)), "r"(1 << group_log2) : "memory");
  const int row_warps_log2 = tpr_log2 - 5;
  const unsigned partial = slot[((tid >> tpr_log2) << row_warps_log2) + (tid & 31 & ((1 << row_warps_log2) - 1))];
  return __uint_as_float(__reduce_max_sync(0xffffffffu, partial));
}
