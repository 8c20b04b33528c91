// Eight bf16 elements at a 2-byte aligned address, loaded as the five aligned words that cover them (four
// when the address is 4-byte aligned: the fifth load repeats the fourth) and funnelled into place by one byte
// permute a word. Every word read holds an element of the vector, so no read leaves the memory the vector lies
// in. __ldg keeps them global loads (the address goes through an integer, which would make plain loads
// generic ones).
// The address is formed on the FMA pipe, by two unsigned 32 x 32 -> 64-bit multiply-adds (row * 2 row_stride
// onto base + 2 col, both int32 >= 0), the fifth word is one of two predicated loads at fixed offsets (no
// address of its own), and the permute's selector is a multiply-add of the half-word bit: the per_token_cast
// kernel that loads this way is bound by its integer pipe. Needs prmt.cuh before it.
template <typename T> __device__ __forceinline__ void tk_load_bf16x8_words(const T* base, int row, int row_stride, int col, void* dst) {
  const unsigned long long address = (unsigned long long)(unsigned)row * (2u * (unsigned)row_stride)
                                     + ((unsigned long long)base + 2ull * (unsigned)col);
  const unsigned* w = (const unsigned*)(address & ~3ull);
  const unsigned half_word = (unsigned)address & 2u;  // 2 when the vector starts in the high half of a word
  const unsigned w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3);
  unsigned w4;
  asm("{.reg .pred p; setp.ne.u32 p, %2, 0; @p ld.global.nc.u32 %0, [%1+16]; @!p ld.global.nc.u32 %0, [%1+12];}"
      : "=r"(w4) : "l"(w), "r"(half_word));
  // 0x5432 from the high half. tk_prmt (PRMT_PRELUDE), not __byte_perm, whose selector nvcc masks.
  const unsigned selector = 0x3210u + half_word * 0x1111u;
  unsigned* d = (unsigned*)dst;
  d[0] = tk_prmt(w0, w1, selector);
  d[1] = tk_prmt(w1, w2, selector);
  d[2] = tk_prmt(w2, w3, selector);
  d[3] = tk_prmt(w3, w4, selector);
}
