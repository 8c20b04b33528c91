// PTX prmt.b32 as it is. __byte_perm clears bit 3 of each selector nibble first (PRMT's sign-replicating
// bit), one LOP3 a lookup whose selector nvcc cannot prove clean; callers of tk_prmt pass selectors whose
// nibbles have bit 3 clear (kernel_src.quant.nibbles).
__device__ __forceinline__ unsigned tk_prmt(unsigned low, unsigned high, unsigned selector) {
  unsigned r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(low), "r"(high), "r"(selector));
  return r;
}
