// The flat bf16 SwiGLU forward's silu table: silu(min.NaN(g, c)) for every bf16 gate g with magnitude bits in
// [TK_TABLE_LOW_BITS, TK_TABLE_HIGH_BITS), in shared memory. Positive gates sit at float index (bits - low), negative
// ones 2^13 floats further on, so a word of two gates gives both byte offsets at once: 4 * (magnitude - low) in each
// 16-bit half (one multiply-add: the halves' products do not interfere, as 4 * (m - low) < 2^14 in the window) and
// the gate's own sign bit (bit 15 of each half) kept in place (one LOP3), i.e. 2^15 bytes further on.
// TK_TABLE_MINUS_LOW_OFFSETS is -4 * low in both halves (mod 2^32). tests/cpu/test_swiglu_bf16_words.py checks the
// mapping over every bf16 pattern.
// The step's window test on the magnitude bits folded by tk_track_gate_bits_bf16x8 (swiglu_words.cuh).
__device__ __forceinline__ int tk_gate_bits_in_table(unsigned largest, unsigned smallest) {
  return max(largest & 0xffffu, largest >> 16) < TK_TABLE_HIGH_BITS && min(smallest & 0xffffu, smallest >> 16) >= TK_TABLE_LOW_BITS;
}
__device__ __forceinline__ void tk_silu_lookup_bf16x8(const void* gate, const float* table, float* dst) {
  const unsigned* g = (const unsigned*)gate;
  const char* base = (const char*)table;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    // 4 * magnitude - 4 * low in each half as one multiply-add (in PTX: nvcc turns the C form into a shift, a mask
    // and an add).
    unsigned scaled;
    asm("mad.lo.u32 %0, %1, 4, %2;" : "=r"(scaled) : "r"(g[i] & 0x7fff7fffu), "r"(TK_TABLE_MINUS_LOW_OFFSETS));
    const unsigned offsets = scaled | (g[i] & 0x80008000u);
    dst[2 * i] = *(const float*)(base + (offsets & 0xffffu));
    dst[2 * i + 1] = *(const float*)(base + (offsets >> 16));
  }
}
__device__ __forceinline__ float tk_bf16_bits_to_float(int bits) { return __uint_as_float((unsigned)bits << 16); }
