// The SwiGLU forwards' bf16 input handled as the 32-bit words that hold two elements each. Needs TK_DIV_MAX_BITS,
// TK_DIV_MIN_BITS (the bf16 bits of TK_FAST_DIV_MAX and TK_FAST_DIV_MIN, unsigned literals) and TK_FAST_DIV_MIN
// (swiglu_div.cuh) defined.
// * Widening: a bf16 is the upper half of its float32, so the element in the high half is the word with its low
//   half cleared (one LOP3) and the one in the low half the word shifted up (one SHF).
// * Range tests fold the magnitude bits (word & 0x7fff7fff, one LOP3 a word) four elements at a time with Hopper's
//   three-input 16x2 integer max and min (VIMNMX3.U16x2): for bf16 magnitudes integer order is value order, and
//   zero, subnormals, inf and NaN (above inf) lie outside every window tested here.
// * The clamp-count reach: the signed 16x2 max over gate words and |up| words (VIMNMX3.S16x2, one for 4 elements).
//   Positive bf16 are ordered as their signed 16-bit patterns and every negative one is below every positive one,
//   so some l > c >= 0 or |r| > c makes the max exceed c; a NaN max (or c < 0) sends the step to the exact recount
//   as well, which counts with float compares (counts never depend on this test, only the cost does).
// * The per-channel forward's division range test on the raw gates' magnitude bits: tk_div_rn_fast needs every
//   clamped gate a = min.NaN(g, c) in [FAST_DIV_MIN, FAST_DIV_MAX]. If every |g| is (bf16 bits in [TK_DIV_MIN_BITS,
//   TK_DIV_MAX_BITS]) and c >= FAST_DIV_MIN (+inf without a clamp; NaN fails), then a = g, or a = c with
//   FAST_DIV_MIN <= c < g <= FAST_DIV_MAX. A vector that fails only because of its raw gates (a gate far above a
//   small clamp) takes the exact path, which gives the same bits (both paths are correctly rounded), only slower.
// * The per-channel forward's clamp skip: with every |gate| and every |up| at most c (their largest magnitude bits
//   read as floats: NaN fails) and c > 0, min.NaN(g, c) = g and min.NaN(max.NaN(r, -c), c) = r for every element,
//   signed zeros included (c > 0 rules out c = -0, where min.NaN(+0, -0) = -0), so the three FMNMX.NAN of each
//   element can go. A thread with some value beyond c keeps them.
// tests/cpu/test_swiglu_bf16_words.py checks these tests over every bf16 value.
__device__ __forceinline__ void tk_widen_bf16x8(const void* src, float* dst) {
  const unsigned* w = (const unsigned*)src;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    dst[2 * i] = __uint_as_float(w[i] << 16);
    dst[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void tk_widen_bf16x2(const void* src, float* dst) {
  const unsigned w = *(const unsigned*)src;
  dst[0] = __uint_as_float(w << 16);
  dst[1] = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void tk_track_gate_bits_bf16x8(const void* gate, unsigned* largest, unsigned* smallest) {
  const unsigned* g = (const unsigned*)gate;
  const unsigned m0 = g[0] & 0x7fff7fffu, m1 = g[1] & 0x7fff7fffu, m2 = g[2] & 0x7fff7fffu, m3 = g[3] & 0x7fff7fffu;
  largest[0] = __vimax3_u16x2(__vimax3_u16x2(largest[0], m0, m1), m2, m3);
  smallest[0] = __vimin3_u16x2(__vimin3_u16x2(smallest[0], m0, m1), m2, m3);
}
__device__ __forceinline__ void tk_track_reach_bf16x8(const void* gate, const void* up, unsigned* reach) {
  const unsigned* g = (const unsigned*)gate;
  const unsigned* u = (const unsigned*)up;
  #pragma unroll
  for (int i = 0; i < 4; ++i) reach[0] = __vimax3_s16x2(reach[0], g[i], u[i] & 0x7fff7fffu);
}
__device__ __forceinline__ int tk_gate_bits_in_div_range(unsigned largest, unsigned smallest, float c) {
  return max(largest & 0xffffu, largest >> 16) <= TK_DIV_MAX_BITS && min(smallest & 0xffffu, smallest >> 16) >= TK_DIV_MIN_BITS
      && c >= TK_FAST_DIV_MIN;
}
__device__ __forceinline__ void tk_track_magnitude_bf16x8(const void* src, unsigned* largest) {
  const unsigned* w = (const unsigned*)src;
  largest[0] = __vimax3_u16x2(__vimax3_u16x2(largest[0], w[0] & 0x7fff7fffu, w[1] & 0x7fff7fffu), w[2] & 0x7fff7fffu,
                              w[3] & 0x7fff7fffu);
}
// Both bf16 halves of w, read as floats, at most c (a NaN half, or a NaN c, is not).
__device__ __forceinline__ int tk_halves_at_most(unsigned w, float c) {
  return __uint_as_float(w & 0xffff0000u) <= c && __uint_as_float(w << 16) <= c;
}
__device__ __forceinline__ int tk_clamps_are_identity(unsigned gate_largest, unsigned up_largest, float c) {
  return tk_halves_at_most(__vmaxu2(gate_largest, up_largest), c) && c > 0.0f;
}
__device__ __forceinline__ int tk_reach_exceeds(unsigned reach, float c) { return !tk_halves_at_most(reach, c); }
// Whether pred holds on every lane that runs this with it (a vote of the active lanes: some of the forward's tests sit
// under per-lane conditions). A path test that lanes of one warp answer differently makes the warp run both paths one
// after the other; where the other path is right for every value too (IEEE division, the clamps), the warp takes it
// whenever one lane needs it.
__device__ __forceinline__ int tk_warp_all(int pred) { return __all_sync(__activemask(), pred); }
__device__ __forceinline__ int tk_up_clamp_is_identity(unsigned reach, float c) { return tk_halves_at_most(reach, c) && c > 0.0f; }
// c rounded down to bf16, in both halves: for a bf16 x, x > c exactly when x > that (no bf16 lies strictly between
// c and the bf16 below it), and x < -c when x < its negation; a NaN c stays NaN, which compares false as c does.
__device__ __forceinline__ unsigned tk_bf16x2_clamp_pair(float c) {
  const unsigned bits = __float_as_uint(c);
  unsigned h = bits >> 16;  // toward zero: down for c >= 0
  if ((bits >> 31) != 0 && (bits & 0xffffu) != 0) h += 1;  // below zero, down is away from it
  if ((bits & 0x7fffffffu) > 0x7f800000u) h = 0x7fc0u;  // NaN
  return h | (h << 16);
}
// The clamp counts of 8 gates and ups (g > c, u > c, u < -c, the float compares' results), a bf16x2 compare a pair
// of elements for each: a mask of 16 bits a true half, so each count is a population count over 16.
__device__ __forceinline__ void tk_count_clamped_bf16x8(const void* gate, const void* up, unsigned c_pair, int* counts) {
  const unsigned* g = (const unsigned*)gate;
  const unsigned* u = (const unsigned*)up;
  const unsigned minus_c_pair = c_pair ^ 0x80008000u;
  int gate_above = 0, up_above = 0, up_below = 0;
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned mask;
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(g[i]), "r"(c_pair));
    gate_above += __popc(mask);
    asm("set.gt.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(u[i]), "r"(c_pair));
    up_above += __popc(mask);
    asm("set.lt.u32.bf16x2 %0, %1, %2;" : "=r"(mask) : "r"(u[i]), "r"(minus_c_pair));
    up_below += __popc(mask);
  }
  counts[0] += gate_above >> 4;
  counts[1] += up_above >> 4;
  counts[2] += up_below >> 4;
}
