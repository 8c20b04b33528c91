// An empty asm that claims to change the four words of a 16-byte vector. per_channel_cast converts its e4m3
// input to float32 twice, for the amax and again for the cast; placed before the cast it keeps nvcc from
// holding the first conversions live until then (for sm_100a nvcc otherwise does, and spills), at no
// instruction.
__device__ __forceinline__ void tk_opaque_vector(void* vector) {
  unsigned* w = (unsigned*)vector;
  asm volatile("" : "+r"(w[0]), "+r"(w[1]), "+r"(w[2]), "+r"(w[3]));
}
