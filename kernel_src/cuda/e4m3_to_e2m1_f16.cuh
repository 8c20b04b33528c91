// per_token_requant's e4m3 -> e2m1 encoders in f16 lanes, two elements an instruction.
//
// Under a power-of-two factor 2^x: e4m3 pairs widen exactly to f16 pairs, q * 2^x is exact in f16 (tiny
// products round, but stay far below 0.25, the first e2m1 rounding boundary, and keep their sign), and the
// rounding-add encoder of kernel_src.quant.common works on f16 lanes. Everything is doubled, p = 2 q 2^x:
// s = 2^e + p * 2^-9, 2^e the binade of max(|p|, 2) with p's sign (max.xorsign.abs), has the e2m1 step of
// p / 2's binade on its last mantissa bit, so f16's round-to-nearest-even rounds p / 2 onto the grid, and s's
// bits hold the code: k mantissa steps (0..4, its low byte) plus twice the binade's index (exponent 16, 17, 18
// for p / 2 below 2, 4, 8: the exponent's two low bits, doubled), which never passes 7, and the sign (bit 7 of
// the high byte). The products are never formed: s / 2^(x+1) = q 2^-9 + (the binade of max(|q|, 2^-x)) is one
// FMA on q, with s's mantissa and sign, and x + 1 is added back to the exponent bytes the code reads
// (tk_e2m1_word_of_f16x8). The bytes of four lanes are gathered by two permutes and the codes worked out four
// at a time, with the shifts and adds as multiply(-add)s, on the FMA pipe, which the kernel leaves mostly idle
// where the integer pipe (permutes, masks, conversions) bounds it; the even and odd elements' codes are paired
// by one multiply-add. It needs |q 2^x| <= 6 (no clamp), -13 <= x <= 14 and no NaN: the kernel checks all
// three per chunk and otherwise takes the ratio path (without round_sf) or float32.
// tests/cpu/test_requant_f16_e2m1.py checks the encoder against the reference's rounding over every e4m3 value
// and factor.
//
// The ratio path (no round_sf, one chunk a block). The block's amax is fl(M s) (M the chunk's largest |q|, s its
// input scale), and the factor F = fl(s fl(6 / fl(M s))) is 6 / M (1 + d), d within 3 * 2^-24 (three roundings
// of normal floats). The reference's product fl(q F) is 6 q / M (1 + d), rounded; over every pair of e4m3
// values q <= M, 6 q / M either lies 1.1% or more from every e2m1 midpoint (0.25, 0.75, ..., 5), where no
// rounding that small changes its code, or exactly on one (a tie). So the codes are those of 6 q / M, and only
// the ties depend on F: a tie goes up when d > 2^-24 / m, m the midpoint's mantissa (1, 1.25, 1.5 or 1.75),
// down when d < -2^-24 / m, and otherwise stays on the midpoint, where e2m1's round to even takes the even code.
// The d that F can have come in steps of M's four significant bits times F's last place, and for no M does one
// fall between the thresholds of two mantissas (u = d 2^24 in (0.8, 1] or [-2/3, -4/7)), so every tie of a chunk
// goes up (u > 1), every one goes down (u < -2/3), or every one stays; r = fma(M, F, -6) = 6 d exactly, against
// TK_RATIO_UP_BITS and TK_RATIO_DOWN_BITS (6 * 2^-24 times u = 0.875 and 0.625), tells which.
// The kernel multiplies the f16 pairs of q by g = RN16(2 F (1 + n)), n = 3 * 2^-11 for all up, -3 * 2^-11 for
// all down, else 0 (TK_RATIO_DOUBLE_UP_BITS, TK_RATIO_DOUBLE_DOWN_BITS: 2 (1 + n) as float32 bits). With n = 0,
// g is 12 / M to within 2^-11 / 2 relative (12 / M times M's mantissa numerator is 96, whose quotients by 8..15
// lie at least 0.04 of an f16 unit from an f16 rounding boundary, so d never moves g), and for every M g's own
// error leaves every tie's f16 product exactly on its midpoint; with n = +-3 * 2^-11 every tie's product lands
// clear above or below. Every other product stays within 0.25% of 12 q / M, far inside the 1.1%. The rounding
// sum of tk_e2m1_word_of_sums then encodes the product, its round to even taking a tie on its midpoint to the
// even code, as the reference does. tests/cpu/test_requant_f16_e2m1.py replays the path over every e4m3 pair
// and every F within 4 * 2^-24 of 6 / M.
//
// The kernel defines TK_RATIO_UP_BITS, TK_RATIO_DOWN_BITS, TK_RATIO_DOUBLE_UP_BITS and TK_RATIO_DOUBLE_DOWN_BITS
// (float32 bits, from RATIO_UP, RATIO_DOWN and RATIO_NUDGE in kernel_src.quant.per_token_requant).
// The f16 pair of e4m3 bytes 0-1 (lo) or 2-3 (hi) of a word: the half taken by mov lets ptxas read it in place (.H1).
__device__ __forceinline__ unsigned tk_e4m3x2_lo_to_f16x2(unsigned word) {
  unsigned r;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(r) : "r"(word));
  return r;
}
__device__ __forceinline__ unsigned tk_e4m3x2_hi_to_f16x2(unsigned word) {
  unsigned r;
  asm("{.reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, hi;}" : "=r"(r) : "r"(word));
  return r;
}
// The largest |h| of n f16 pairs, as float32; NaN when any is NaN (the sign bits of the running maximum are
// meaningless, only its magnitude is kept).
__device__ __forceinline__ float tk_f16x2_absmax_nan(const unsigned* h, int n) {
  unsigned m = h[0];
  #pragma unroll
  for (int i = 1; i < n; ++i) asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(m) : "r"(m), "r"(h[i]));
  asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(m) : "r"(m), "r"(__byte_perm(m, 0, 0x1032)));
  float r;  // (PTX: the prelude precedes cuda_fp16.h)
  asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"((unsigned short)(m & 0x7fffu)));
  return r;
}
// The code word of four f16 pairs of rounding sums s (element 2i in the low lane of s[i]): each sum is 2^e + p * 2^-9 with
// p's sign, p the doubled product and 2^e the binade of max(|p|, 2), rounded once, so that its mantissa counts the e2m1
// steps k (0..4) of p / 2 above the binade's first code. Its exponent's two low bits plus x1_half's (x1_half = ((x + 1) & 3)
// * 0x02020202 where the sums are those of tk_e2m1_word_of_f16x8, whose exponent is x + 1 short; 0 where it is not), twice,
// are the binade's index. step_mask keeps k's three bits of the low byte (see tk_e2m1_word_of_f16x8). Element i in nibble i.
// sixteen is 16 from a register the compiler cannot fold (sixteen_in_a_register in f16_lanes.py).
__device__ __forceinline__ unsigned tk_e2m1_word_of_sums(const unsigned* s, unsigned step_mask, unsigned x1_half, unsigned sixteen) {
  // Element 2i is the low lane of s[i]: bytes of elements 0-3 and 4-7, low (the steps k) and high (sign, exponent).
  const unsigned k[2] = {__byte_perm(s[0], s[1], 0x6420) & step_mask, __byte_perm(s[2], s[3], 0x6420) & step_mask};
  const unsigned e[2] = {__byte_perm(s[0], s[1], 0x7531), __byte_perm(s[2], s[3], 0x7531)};
  unsigned n[2];
  #pragma unroll
  for (int j = 0; j < 2; ++j) {
    // k + 2 ((exponent + x + 1) & 3) ((e >> 1) + x1_half), at most 7, then the sign from bit 7 to bit 3 (e >> 4): the
    // code of element 4 j + b in byte b. x1_half is added by the multiply-high that halves the bytes (no add of its own):
    // a carry out of those bits goes to bits the mask drops, never to the sign, which is read from the bytes as they are.
    unsigned exponent_steps;
    asm("mad.hi.u32 %0, %1, %2, %3;" : "=r"(exponent_steps) : "r"(e[j]), "r"(0x80000000u), "r"(x1_half));
    const unsigned code = k[j] + (exponent_steps & 0x06060606u);
    n[j] = code | (__umulhi(e[j], 0x10000000u) & 0x08080808u);
  }
  // The even elements' codes in one word and the odd ones' in another; odd * 16 + even has element i in nibble i.
  // (A multiply-add by a literal 16 ptxas makes LEA, on the integer pipe.)
  unsigned r;
  asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(__byte_perm(n[0], n[1], 0x7531)), "r"(sixteen), "r"(__byte_perm(n[0], n[1], 0x6420)));
  return r;
}
// Eight e2m1 codes (element i in nibble i) of the f16 pairs h[0..3] (elements 2i, 2i + 1) times 2^x, given
// t = 2^-x in both f16 halves and x1_half = ((x + 1) & 3) * 0x02020202. The doubled products p = h 2^(x+1) are not formed:
// s / 2^(x+1) = h * 2^-9 + 2^e / 2^(x+1), and 2^e / 2^(x+1) is the binade of max(|h|, 2^-x), exactly, in f16's
// normal range (-13 <= x <= 14, the kernel's condition). So s / 2^(x+1) has s's mantissa and sign, and its exponent
// x + 1 less, which x1_half adds back to the two low bits the code reads.
// The FMA adds max(|h|, 2^-x) itself, not its binade: its mantissa (an e4m3 value's three bits, at f16 mantissa bits
// 7-9, an even number of units) shifts the sum by whole units of its last place without changing its binade, the
// rounding or the parity a tie goes by (k + that mantissa < 2^10), so the steps k are the low byte's bits 0-2 (bit 7
// takes the mantissa's lowest bit, masked off) and the high byte's exponent bits are as before (its two low bits take
// the mantissa's top two, which the code never reads). One mask a word of four codes, not one a pair.
__device__ __forceinline__ unsigned tk_e2m1_word_of_f16x8(unsigned h0, unsigned h1, unsigned h2, unsigned h3, unsigned t, unsigned x1_half, unsigned sixteen) {
  const unsigned h[4] = {h0, h1, h2, h3};
  unsigned s[4];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned m;
    asm("max.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(m) : "r"(h[i]), "r"(t));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(s[i]) : "r"(h[i]), "r"(0x18001800u), "r"(m));
  }
  return tk_e2m1_word_of_sums(s, 0x07070707u, x1_half, sixteen);
}
// The ratio path (no round_sf, one chunk a block; see the top of this file): the f16 pair of 2 factor, nudged by 3 * 2^-11 up or
// down where r = amax_q * factor - 6 (exact) puts the reference's ties all above or all below the e2m1 midpoints.
__device__ __forceinline__ unsigned tk_ratio_factor_f16x2(float amax_q, float factor) {
  const float r = __fmaf_rn(amax_q, factor, -6.0f);
  const float doubled = r > __uint_as_float(TK_RATIO_UP_BITS) ? __uint_as_float(TK_RATIO_DOUBLE_UP_BITS)
                      : r < -__uint_as_float(TK_RATIO_DOWN_BITS) ? __uint_as_float(TK_RATIO_DOUBLE_DOWN_BITS) : 2.0f;
  unsigned g;
  asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(g) : "f"(__fmul_rn(factor, doubled)));
  return g;
}
// Eight e2m1 codes of the f16 pairs h[0..3] under the ratio path's factor pair g: p = h g rounded to f16 (which puts every
// product of a reference tie exactly on its midpoint, or clear of it as g was nudged), then the rounding sum on p's binade
// (masked: p's mantissa is not an e4m3 value's), so the low byte is k alone.
__device__ __forceinline__ unsigned tk_e2m1_word_of_f16x8_ratio(unsigned h0, unsigned h1, unsigned h2, unsigned h3, unsigned g, unsigned sixteen) {
  const unsigned h[4] = {h0, h1, h2, h3};
  unsigned s[4];
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned p, m;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(p) : "r"(h[i]), "r"(g));
    asm("max.xorsign.abs.f16x2 %0, %1, %2;" : "=r"(m) : "r"(p), "r"(0x40004000u));
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(s[i]) : "r"(p), "r"(0x18001800u), "r"(m & 0xfc00fc00u));
  }
  return tk_e2m1_word_of_sums(s, 0xffffffffu, 0u, sixteen);
}
