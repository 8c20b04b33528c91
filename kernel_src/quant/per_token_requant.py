"""quant.per_token_requant: per_token_cast of an already quantised (data, sf) input, without a bf16 round trip.

The input is e4m3 data, or e2m1 pairs (int8, low nibble = even column), with one scale factor per
(in_block_m, in_block_k) block; the output is e4m3 or e2m1 with one scale factor per (1, num_per_channels)
block, exactly as upstream's per_token_cast computes it for a QuantTensor:
  amax  = max over the block of |q| * s, s the input scale factor of each element (float32; the max of |q|
          within a 32-element chunk times its s is the same number, rounding being monotone),
  sf / multiplier from amax as in per_token_cast (floor, two divisions, or round_sf's powers of two),
  out   = cast(q * (s * multiplier)), the two factors multiplied first, as upstream.

Layout: the chunks of 32 elements form a flat sequence of all rows' chunks, each row padded to whole output
blocks, so the chunks of a block are adjacent lanes and its amax is a butterfly of shuffles over
num_per_channels / 32 lanes. Thread t of CTA b owns chunk b * 128 + t, or chunks (2 b + k) * 128 + t for k < 2
(CHUNKS_PER_THREAD), or, TILED, chunk 16 j + t % 16 of row 8 i + t / 16, tile (i, j) = divmod(b, tiles a row). A chunk lies
inside one input block (the input block width is a power of two of at least 32). Compile time: the two formats,
the two scale-factor storages (float32 in any strides, or packed UE8M0 bytes) and the width of x's loads (VEC_BYTES);
run time: hidden, the block sizes (as shifts), round_sf and the strides. Every access is masked against the buffer
dims.

e2m1 input: a chunk's 32 codes hold at most eight magnitudes, so its amax is the value of the largest one and,
for a finite factor, its output codes come from a table of the eight magnitudes' outputs (see the kernel). To e2m1,
that table needs no products where the factor is known: one formed from the shift for power-of-two factors
(POW2_TABLE_SHIFTS), one from the largest code without round_sf (CANONICAL_WINDOW), and with UE8M0 in and out the scale factor too
comes from the largest code, in integers (EXPONENT_PATH_INPUTS).
e4m3 input to e2m1: two elements an instruction in f16 lanes, without round_sf by the ratio path (RATIO_UP and the
note above it) when every active lane of the warp holds a block of one chunk with a normal, finite amax, else when every
one has a power-of-two factor (E4M3_TO_E2M1_F16_PRELUDE); else element by element in float32, as e4m3 to e4m3 goes.

The chunk's row, chunk of the row and the scale factors' block indices are int32 locals bound once: pasted as
expressions, tilelang widened each use to 64 bits before its shifts, and every address took 64-bit shifts and
multiplies.
"""

import struct
from fractions import Fraction

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import magic_quotient, unsigned_index, unsigned_wide_dot, unsigned_wide_mad
from kernel_src.quant.common import (
    E2M1_SIGNED_PRELUDE, FLOAT32_EXPONENT_MASK, FORMATS, RCP_DIV_PRELUDE, SF_FORMATS, block_scale, e2m1_finite_top_nibble, e2m1_top_nibble, e2m1_word, let,
    pow2_scale_carry, products_bounded,
)
from kernel_src.quant.nibbles import (
    CODE_MAGNITUDES, PRMT_PRELUDE, byte_perm, e2m1_word_through_table, halving_steps_of_largest, largest_magnitude, table_bytes_of_codes, table_word,
)
from kernel_src.quant.token_sf import sf_flat_view, store_block_sf_flat, store_token_sf, token_sf_tensor

NUM_THREADS = 128
# Two layouts of the chunks over the CTAs, chosen per (in_fmt, fmt, in_sf_format) by measurement (GPU runs 1-3 of
# docs/gpu-runs/2026-12-01-h200-g.md):
# - a row's consecutive chunks, CHUNKS_PER_THREAD of them a thread, NUM_THREADS apart (each warp's loads one contiguous
#   run), all loaded before any is encoded. e4m3 -> e2m1 waits on each chunk's load -> amax -> scale -> encode chain
#   (12 CTAs an SM of one chunk a thread, no pipe saturated): two chunks a thread at 10 CTAs measured 1-3% faster;
#   every other spec measured no faster (up to 9% slower), four chunks slower still. A persistent grid of them (as many
#   CTAs as fit, 9 an SM at 56 registers; each thread loading its next chunk into a second register slot while it
#   encoded one) measured 13-16% slower (run 1 of docs/gpu-runs/2026-12-02-h200-h.md).
# - TILED: a CTA takes TILE_ROWS rows of TILE_CHUNKS chunks, so that its packed UE8M0 scale factors fill
#   whole 32-byte sectors (a word of eight rows), which it gathers in shared memory and stores as such. With a row's
#   consecutive chunks each lane's byte store took a sector of its own, and e2m1 -> e2m1 kept the L2 81% busy (run 9
#   of docs/gpu-runs/2026-12-01-h200-f.md); tiled, the two e2m1-input UE8M0 specs measured 8% and 5% faster, with the
#   CTA's barrier before the encoding (after it, 2% less). Tiled, the e4m3-input specs measured no faster (within 1%)
#   or up to 12% slower, and so did float32 scale factors (2-12%, and run 10 of that record), wherever the barrier.
#   e4m3 -> e2m1 packed in warp tiles (8 rows of 4 chunks a warp, a whole sector of scale factors each, no shared memory
#   or barrier) measured 0.8% slower (run 3 of docs/gpu-runs/2026-12-02-h200-h.md).
TILE_ROWS = 8
TILE_CHUNKS = NUM_THREADS // TILE_ROWS
TILED = {('e2m1', 'e2m1', 'ue8m0'), ('e2m1', 'e4m3', 'ue8m0')}
CHUNKS_PER_THREAD = {('e4m3', 'e2m1', sf): 2 for sf in SF_FORMATS}
# The untiled specs store a chunk's scale factor through a flat view by an unsigned 32-bit index (store_block_sf_flat),
# where the strided buffer's 64-bit addressing took about 10 instructions a chunk more: e4m3 -> e2m1 measured 3.7%
# faster with float32 scale factors and 1.2% with packed UE8M0, e2m1 -> e2m1 1.5% (GPU run 8 of
# docs/gpu-runs/2026-12-01-h200-h.md). Every spec loads x and its scale factors through flat views too (load_chunk).
# e4m3 -> e4m3 keeps the strided buffers and masks: the flat store made its float32 variant 10% slower there, which its
# SASS (the same loads and stores, a predicated store for a branch) does not explain; with the unmasked scale factor
# load nvcc kept its 32 bytes as sixteen 16-bit halves (32 permutes more) and it measured 13-15% slower (31.1 ->
# 35.8 us, run 1 of docs/gpu-runs/2026-12-03-h200.md).
STRIDED_BUFFERS = {('e4m3', 'e4m3')}
CHUNK = 32  # logical elements per thread
# Bytes of x a vector load takes (compile time, vec_bytes): 32, a whole chunk of e4m3 input, is one 256-bit load on
# sm_100a, a whole 32-byte sector, for an x whose pointer and row stride are 32-byte aligned; 16 takes any 16-byte
# aligned x (the op's choice: tile_kernels_aot.quant.per_token.per_token_requant_spec). On sm_90a a 32-byte vector is
# two 16-byte loads, and ptxas gives both widths the same SASS. An e2m1 chunk is 16 bytes: 16 only.
VEC_BYTES = (16, 32)
# CTAs per SM the register allocation must allow, where it costs no spills. e4m3 to e4m3 took 53 registers
# unbounded (56 allocated: 9 CTAs, 36 KB of loads in flight per SM, one 32-byte chunk a thread); 48 give 10
# CTAs and 40 KB, as upstream's kernel (48 registers, 10 CTAs of 4 KB), with packed UE8M0 input scale factors;
# with float32 ones 48 spill 8 bytes. e4m3 -> e2m1, both of whose encoders read the f16 pairs the amax widened
# (E4M3_TO_E2M1_F16_PRELUDE), fits 48 registers with two chunks a thread (10 CTAs, 80 KB in flight; its float32 path
# goes eight values at a time) and 40 with one (12 CTAs), which measured 1-2% slower (GPU run 1 of
# docs/gpu-runs/2026-12-02-h200-f.md). An e2m1 chunk is only 16 bytes, and its table path needs few registers: 16 CTAs
# (32 registers, the SM's 2048 threads) keep 32 KB in flight; 12 measured 2% slower (GPU run 2 of
# docs/gpu-runs/2026-12-01-h200-e.md).
MIN_BLOCKS = {
    ('e4m3', 'e4m3', 'ue8m0'): 10,
    **{('e4m3', 'e2m1', sf): 10 for sf in SF_FORMATS},
    **{('e2m1', fmt, sf): 16 for fmt in FORMATS for sf in SF_FORMATS},
}
# sm_100a's ptxas spills e4m3 -> e2m1 at 48 registers (8 bytes a thread) with float32 scale factors (at 40 too with one
# chunk a thread), and with packed UE8M0 ones from 32-byte vectors; with the ratio path, at 56 (9 CTAs) the float32
# 32-byte spec; by (target, in_fmt, fmt, in_sf_format, vec_bytes).
MIN_BLOCKS_BY_TARGET = {
    ('sm_100a', 'e4m3', 'e2m1', 'f32', 16): 9,
    ('sm_100a', 'e4m3', 'e2m1', 'f32', 32): 8,
    ('sm_100a', 'e4m3', 'e2m1', 'ue8m0', 32): 9,
}

# e2m1 input decoded through halves: every e2m1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6) is a half whose low
# byte is zero, so four codes' high bytes come from one byte-table lookup (kernel_src.quant.nibbles), two
# permutes interleave them with zero bytes into half pairs, and one conversion per element gives the exact
# float32. About three instructions an element, where decoding each code's fields into float32 bits took eight.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # by magnitude code
E2M1_HALVES = [struct.pack('<e', v) for v in E2M1_VALUES]
assert all(h[0] == 0 and h[1] < 0x80 for h in E2M1_HALVES)
HALF_TABLE_LOW = table_word(h[1] for h in E2M1_HALVES[:4])
HALF_TABLE_HIGH = table_word(h[1] for h in E2M1_HALVES[4:])


# e2m1 -> e2m1 with power-of-two scale factors in and out (UE8M0, or float32 ones from round_sf casts): the factor is
# 2^shift, shift = -ceil(log2(largest value / 6)) for a chunk whose amax sets its scale: 0..3 for a largest value of 6
# or 4, 3 or 2, 1.5 or 1, 0.5 (other chunks of a wider block, with a smaller amax, take their own table). Its table
# moves each magnitude from two up 2 shift codes (a doubling is two codes up the grid) and magnitude one (0.5) to
# code max(2 shift, 1) (power_of_two_table). It leaves the codes of magnitudes above 6 / 2^shift unsaturated (past 7),
# but a chunk never looks them up: its products are exact, and at most its block's amax times the factor, at most 6.
# tests/cpu/test_nibble_tables.py checks every looked-up entry against the saturating encoding.
POW2_TABLE_SHIFTS = (0, 3)

# e2m1 -> e2m1 with float32 scale factors without round_sf: a chunk whose largest magnitude code is L (value v_L) has
# the factor s * RN(6 / RN(v_L s)), within a few ulps of 6 / v_L, and the codes of the magnitudes m <= L (the only
# ones it looks up) under any factor that close are fixed: a magnitude two or more goes to m + (7 - L) (from 1 up the
# grid steps by 3/2 and 4/3 in turn, and 6 / v_L is the product of the 7 - L steps above L, so v_m 6 / v_L lands on
# the value 7 - L codes above m or within 9/8 of it, far from a rounding boundary), and magnitude one (0.5) to the
# code of 3 / v_L, which for L = 6 is 0.75, the tie between codes 1 and 2, decided by whether the factor reaches 1.5.
# So the table is two multiply-adds of d = 7 - L and that one byte, where encoding it took eight products and
# encodings (encode_table). CANONICAL_WINDOW bounds |factor * v_L - 6|: 1% of 6, where the nearest rounding boundary
# of every other entry is 4% or more away; tests/cpu/test_nibble_tables.py checks every float32 factor in each window
# against the reference's rounding.
CANONICAL_WINDOW = 2.0**-4
CANONICAL_TIE_FACTOR = 1.5  # 0.5 * factor against 0.75; on the tie (exactly 1.5) RTNE takes code 2
# These tables, the power-of-two ones (POW2_TABLE_SHIFTS) and the exponent path's (EXPONENT_PATH_INPUTS) move every
# magnitude from two up by a number of codes, and give magnitude one a code of its own (shifted_code_table): the
# identity but byte 1, and what one code up adds.
SHIFTED_CODE_TABLE = (table_word((0, 0, 2, 3)), table_word((4, 5, 6, 7)))
SHIFTED_CODE_STEP = (table_word((0, 0, 1, 1)), table_word((1, 1, 1, 1)))


def _canonical_first_codes() -> int:
    """Nibble d (= 7 - L) holds byte 1 of the table of largest code L less [factor >= CANONICAL_TIE_FACTOR], which
    the kernel adds: the code of 3 / v_L (0.5 times 6 / v_L; at L = 6 the tie's lower code, the kernel's comparison
    deciding it)."""
    def code(x: Fraction) -> int:  # the nearest grid value, the lower one on a tie
        return min(range(8), key=lambda m: (abs(Fraction(E2M1_VALUES[m]) - x), m))
    nibbles = 0
    for largest in range(1, 8):
        ratio = Fraction(6) / Fraction(E2M1_VALUES[largest])
        first = code(ratio / 2) - (ratio > Fraction(CANONICAL_TIE_FACTOR))
        nibbles |= first << (4 * (7 - largest))
    return nibbles


CANONICAL_FIRST_CODES = _canonical_first_codes()
# e2m1 -> e2m1 with UE8M0 in and out and one chunk a block: amax = v_L 2^(e - 127) (e the input's exponent byte, v_L
# the value of the largest code L) is exact, and its power of two at or above amax / 6 is 2^(e - 127 - (7 - L) / 2)
# (6 / v_L is 1, 1.5, 2, 3, 4, 6 or 12, whose power of two at or below is 2^((7 - L) / 2)), so the scale factor's byte
# is e - (7 - L) / 2 and the factor 2^((7 - L) / 2), whose table (power_of_two_table: v_L 2^shift <= 6, so no code
# it looks up saturates) the kernel forms from the shift: no float amax, no pow2_scale_exponent, no float round trip of the byte,
# no test of the factor, where the ALU pipe is the busiest. It holds for L >= 1 and 4 <= e <= 252: amax finite
# (6 * 2^(e - 127) overflows from e = 253) and at or above e2m1's amax floor 6 * 2^-126 (at e = 4 only for L >= 2, but the
# floor's own byte is then the same); other chunks take block_scale. tests/cpu/test_nibble_tables.py replays
# block_scale over every byte and code, and shows both bounds tight.
EXPONENT_PATH_INPUTS = (4, 252)
# e4m3 -> e2m1 with UE8M0 in and out and a block of one chunk: with the chunk's amax = M 2^a (M in [1, 2), three mantissa
# bits, a in [-9, 8]) and the input's byte b (scale 2^(b - 127)), block_scale's byte is pow2_scale_exponent's
# ((bits(amax 2^(b - 127)) + 2^22 - 1) >> 23) - 2 = b + a - 2 + (M > 1.5), for a product that is normal and at or above
# the floor (no clamp), and whose byte leaves the multiplier 2^(127 - byte) normal; the factor, 2^(b - 127) times that,
# is then 2^-(a - 2 + (M > 1.5)), the amax_shift of the kernel, whatever b. So both come from the bits of the f32 amax,
# added to 2^22 - 1 (F16_EXPONENT_PATH_CARRY, pow2_scale_carry(6)), with no float product, clamp or conversion of the
# byte, and the factor needs no test for the f16 lanes (|amax_shift| <= 11; amax times it is at most 6). It holds for
# every nonzero amax, input byte 1..254 (F16_EXPONENT_PATH_INPUTS: byte 0 reads as a zero scale, 255 as infinity) and
# output byte 2..252 (F16_EXPONENT_PATH_BYTES): 252 keeps the product finite, 2 puts it above the floor 6 * 2^-126
# (1.5 * 2^-124: 2^(a + b - 127) >= 2^-124 for a + b >= 3 + (M <= 1.5)). tests/cpu/test_nibble_tables.py replays
# block_scale over every e4m3 amax and input byte, and shows each bound tight. About 17 instructions a chunk fewer
# (the float scale, its clamp and the byte's float round trip): 29.23 -> 28.93 us (run 2 of
# docs/gpu-runs/2026-12-02-h200-h.md).
F16_EXPONENT_PATH_CARRY, F16_EXPONENT_PATH_F = pow2_scale_carry(FORMATS['e2m1'][0])  # 2^22 - 1, 2
F16_EXPONENT_PATH_INPUTS = (1, 254)
F16_EXPONENT_PATH_BYTES = (2, 252)
# A float32 is a power of two (2^(e - 127), normal, positive) exactly when its sign and mantissa bits are all zero.
FLOAT32_SIGN_AND_MANTISSA = 0x807FFFFF


# e4m3 -> e2m1 under a power-of-two factor 2^x, two elements an instruction: e4m3 pairs widen exactly to f16 pairs,
# q * 2^x is exact in f16 (tiny products round, but stay far below 0.25, the first e2m1 rounding boundary, and keep
# their sign), and the e2m1 encoder of kernel_src.quant.common (a rounding add on the float's bits) works on f16
# lanes. Everything is doubled, p = 2 q 2^x: s = 2^e + p * 2^-9, 2^e the binade of max(|p|, 2) with p's sign
# (max.xorsign.abs), has the e2m1 step of p / 2's binade on its last mantissa bit, so f16's own round-to-nearest-even
# rounds p / 2 onto the grid, and s's bits hold the code: k mantissa steps (0..4, its low byte) plus twice the
# binade's index (exponent 16, 17, 18 for p / 2 below 2, 4, 8: the exponent's two low bits, doubled), which never
# passes 7, and the sign (bit 7 of the high byte). The products are never formed: s / 2^(x+1) = q 2^-9 + (the binade
# of max(|q|, 2^-x)) is one FMA on q, with s's mantissa and sign, and x + 1 is added back to the exponent bytes the
# code reads (tk_e2m1_word_of_f16x8). The bytes of four lanes are gathered by two permutes and the code worked out
# four at a time, with the shifts and adds as multiply(-add)s: on the FMA pipe, which the kernel left mostly idle,
# where the integer pipe (permutes, masks, conversions) bounded it at 80% busy (GPU runs 5 and 6 of
# docs/gpu-runs/2026-12-01-h200-f.md); the even and odd elements' codes are paired by one multiply-add. It needs
# |q 2^x| <= 6 (no clamp), -13 <= x <= 14 and no NaN: the kernel checks all three per chunk and otherwise takes the
# ratio path below (without round_sf) or the float32 path (about seven and a half instructions an element, by
# e2m1_finite_top_nibble). All three take the f16
# pairs the amax widened, where each widened the e4m3 bytes again: 16 conversions a chunk fewer, still 48 registers
# with two chunks a thread. The f16 lanes now take 136 instructions a chunk of 32 (148 before the pairing and the
# unformed products, 163 before the shared pairs): with round_sf 32.2-32.3 -> 29.1-29.2 us, packed UE8M0
# 32.0-32.2 -> 30.6-30.7 (GPU runs 1 and 3 of docs/gpu-runs/2026-12-02-h200-f.md); 8 fewer with one mask a word (see
# tk_e2m1_word_of_f16x8): round_sf 28.83 -> 28.35 us, UE8M0 29.58 -> 28.94 (run 1 of docs/gpu-runs/2026-12-02-h200-h.md);
# 7 fewer with x + 1 added by the exponent's multiply-high (x1_half; ptxas makes the pair one LEA.HI) instead of an add
# of its own: round_sf 28.31 -> 28.10 us, UE8M0 28.87 -> 28.74 (run 4 of docs/gpu-runs/2026-12-02-h200-j.md).
# tests/cpu/test_requant_f16_e2m1.py checks the encoder against the reference's rounding over every e4m3 value and
# factor.
# e4m3 -> e2m1 without round_sf (the ratio path), two elements an instruction too. With one chunk a block, the block's amax is
# fl(M s) (M the chunk's largest |q|, s its input scale), and the factor F = fl(s fl(6 / fl(M s))) is 6 / M (1 + d), d
# within 3 * 2^-24 (three roundings of normal floats). The reference's product fl(q F) is 6 q / M (1 + d), rounded; and
# over every pair of e4m3 values q <= M, 6 q / M either lies 1.1% or more from every e2m1 midpoint (0.25, 0.75, ..., 5),
# where no rounding that small changes its code, or exactly on one (a tie). So the codes are those of 6 q / M, and only
# the ties depend on F: a tie goes up when d > 2^-24 / m, m the midpoint's mantissa (1, 1.25, 1.5 or 1.75), down when d <
# -2^-24 / m, and otherwise stays on the midpoint, where e2m1's round to even takes the even code (up from 0.75, 1.75 and
# 3.5, down from the others). The d that F can have come in steps of M's four significant bits times F's last place, and
# for no M does one fall between the thresholds of two mantissas (u = d 2^24 in (0.8, 1] or [-2/3, -4/7)), so every tie
# of a chunk goes up (u > 1), every one goes down (u < -2/3), or every one stays (the rest); r = fma(M, F, -6) = 6 d
# exactly, against RATIO_UP and RATIO_DOWN (6 * 2^-24 times u = 0.875 and -0.625), tells which.
# The kernel multiplies the f16 pairs of q by g = RN16(2 F (1 + n)), n = 3 * 2^-11 for all up, -3 * 2^-11 for all down,
# else 0, the product rounded to f16. With n = 0, g is 12 / M to within 2^-11 / 2 relative (12 / M times M's mantissa
# numerator is 96, whose quotients by 8..15 lie at least 0.04 of an f16 unit from an f16 rounding boundary, so d
# never moves g), and for every M g's own error leaves every tie's f16 product exactly on its midpoint (a product within
# 2^-11 / m of it rounds onto it); with n = +-3 * 2^-11 every tie's product lands clear above or below. Every other
# product stays within 0.25% of 12 q / M, far inside the 1.1%. The rounding sum of tk_e2m1_word_of_f16x8 then encodes
# the product, its round to even taking a tie on its midpoint to the even code, as the reference does.
# tests/cpu/test_requant_f16_e2m1.py replays the path over every e4m3 pair and every F within 4 * 2^-24 of 6 / M.
# About 200 SASS instructions a chunk where float32 took about 460: 31.3-31.6 -> 29.1-29.3 us, 72.0-72.5% -> 77.5-77.9% of
# copy (run 4 of docs/gpu-runs/2026-12-02-h200-k.md).
RATIO_UP = 6 * 2.0**-24 * 0.875
RATIO_DOWN = 6 * 2.0**-24 * 0.625
RATIO_NUDGE = 3 * 2.0**-11


def _float32_bits(value: float) -> int:
    return struct.unpack('<I', struct.pack('<f', value))[0]


# The amax (float32 bits, unsigned) the path takes: [the e2m1 floor, +infinity), normal and finite.
RATIO_AMAX_BITS = (_float32_bits(FORMATS['e2m1'][1]), 0x7F800000)

E4M3_TO_E2M1_F16_PRELUDE = """
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
// sixteen is 16 from a register the compiler cannot fold (see the kernel).
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
// the mantissa's top two, which the code never reads). One mask a word of four codes, where each pair took one.
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
// The ratio path (no round_sf, one chunk a block; see the note above RATIO_UP): the f16 pair of 2 factor, nudged by 3 * 2^-11 up or
// down where r = amax_q * factor - 6 (exact) puts the reference's ties all above or all below the e2m1 midpoints.
__device__ __forceinline__ unsigned tk_ratio_factor_f16x2(float amax_q, float factor) {
  const float r = __fmaf_rn(amax_q, factor, -6.0f);
  const float doubled = r > __uint_as_float(RATIO_UP_BITS) ? __uint_as_float(RATIO_DOUBLE_UP_BITS)
                      : r < -__uint_as_float(RATIO_DOWN_BITS) ? __uint_as_float(RATIO_DOUBLE_DOWN_BITS) : 2.0f;
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
"""


E4M3_TO_E2M1_F16_PRELUDE = (E4M3_TO_E2M1_F16_PRELUDE.replace('RATIO_UP_BITS', hex(_float32_bits(RATIO_UP)) + 'u')
                            .replace('RATIO_DOWN_BITS', hex(_float32_bits(RATIO_DOWN)) + 'u')
                            .replace('RATIO_DOUBLE_UP_BITS', hex(_float32_bits(2 * (1 + RATIO_NUDGE))) + 'u')
                            .replace('RATIO_DOUBLE_DOWN_BITS', hex(_float32_bits(2 * (1 - RATIO_NUDGE))) + 'u'))


E4M3_PAIR_TO_F16X2 = ('tk_e4m3x2_lo_to_f16x2', 'tk_e4m3x2_hi_to_f16x2')  # of a word's bytes 0-1, 2-3


def sixteen_in_a_register(tid, round_sf):
    """16, in a form no compiler can fold (round_sf >> 31 is 0, but nothing proves it): with a literal 16 ptxas makes the
    pairing multiply-add of tk_e2m1_word_of_sums a LEA, on the integer pipe."""
    return let('sixteen', 'uint32', T.uint32(16) | (T.Cast('uint32', tid) & T.Cast('uint32', round_sf >> 31)), lambda v: v)


def power_of_two_between(factor, low: int, high: int):
    """Whether float32 `factor` is 2^k for an integer k in [low, high] (normal and positive: its sign and mantissa
    bits clear)."""
    # (The exponent's range as one unsigned compare, which wraps below 127 + low.)
    return let('factor_bits', 'uint32', T.reinterpret(factor, T.uint32), lambda bits: T.And(
        (bits & T.uint32(FLOAT32_SIGN_AND_MANTISSA)) == T.uint32(0), (bits >> T.uint32(23)) - T.uint32(127 + low) <= T.uint32(high - low)))


def biased_exponent(value):
    """The exponent field of a non-negative float32 (a power-of-two factor's 127 + x)."""
    return T.Cast('int32', T.reinterpret(value, T.uint32) >> T.uint32(23))


def f16_exact_factor(factor, chunk_amax):
    """Whether e4m3 -> e2m1 may take the f16 lanes under `factor` (E4M3_TO_E2M1_F16_PRELUDE): a power of two whose double
    is in f16's normal range, no NaN in the chunk, and every product within 6."""
    return T.And(power_of_two_between(factor, -13, 14), T.And(chunk_amax * factor <= T.float32(6), T.Not(T.isnan(chunk_amax))))


def f16_lanes_vote(factor, chunk_amax, active):
    """Whether every active lane of the warp may take the f16 lanes (f16_exact_factor), so that a warp takes one path."""
    return T.all_sync(T.Or(T.Not(active), f16_exact_factor(factor, chunk_amax))) != 0


def e2m1_value(magnitude):
    """float32 value of an e2m1 magnitude code 0..7: m / 2 below 2, else 2^(m / 2 - 1) * (1 + (m & 1) / 2),
    whose float32 bits are (m + 252) << 22 (exponent 126 + m / 2, the odd codes' mantissa bit at 22)."""
    return T.Select(magnitude < 2, T.Cast('float32', magnitude) * T.float32(0.5),
                    T.reinterpret(T.Cast('uint32', magnitude + 252) << T.uint32(22), T.float32))


def check(in_fmt: str, fmt: str, in_sf_format: str, sf_format: str, vec_bytes: int) -> None:
    for name, value, allowed in (('in_fmt', in_fmt, FORMATS), ('fmt', fmt, FORMATS),
                                 ('in_sf_format', in_sf_format, SF_FORMATS), ('sf_format', sf_format, SF_FORMATS)):
        if value not in allowed:
            raise ValueError(f'{name} must be one of {sorted(allowed)}, got {value!r}')
    if vec_bytes not in VEC_BYTES:
        raise ValueError(f'vec_bytes must be one of {VEC_BYTES}, got {vec_bytes!r}')
    if vec_bytes != 16 and in_fmt != 'e4m3':
        raise ValueError('vec_bytes=32 is built for e4m3 input only (an e2m1 chunk is 16 bytes)')


def build(arch: Arch, in_fmt: str, fmt: str, in_sf_format: str, sf_format: str, vec_bytes: int) -> KernelProgram:
    in_fp4, out_fp4 = in_fmt == 'e2m1', fmt == 'e2m1'
    in_packed, packed = in_sf_format == 'ue8m0', sf_format == 'ue8m0'
    fmax, floor = FORMATS[fmt]
    in_bytes = CHUNK // 2 if in_fp4 else CHUNK
    f16_path = not in_fp4 and out_fp4  # E4M3_TO_E2M1_F16_PRELUDE
    # Where e2m1_finite_top_nibble encodes (E2M1_SIGNED_PRELUDE): e4m3 -> e2m1's float32 path, and e2m1 -> e2m1's
    # per-chunk tables unless UE8M0 in and out makes every factor a power of two (see encode_table).
    finite_tables = in_fp4 and out_fp4 and not (in_packed and packed)
    finite_encoder = f16_path or finite_tables
    out_bytes = CHUNK // 2 if out_fp4 else CHUNK
    exponent_path = in_fp4 and out_fp4 and in_packed and packed  # (EXPONENT_PATH_INPUTS)
    f16_exponent_path = f16_path and in_packed and packed  # (F16_EXPONENT_PATH)
    integer_sf = exponent_path or f16_exponent_path  # the scale factor's byte in sf_exponent, an int32

    num_tokens = T.dynamic('num_tokens')
    in_width = T.dynamic('in_width')  # bytes per input row: hidden, or hidden / 2 for e2m1
    row_stride = T.dynamic('row_stride')
    hidden = in_width * 2 if in_fp4 else in_width
    num_in_sf_rows, num_in_sf_blocks, num_in_sf_words = T.dynamic('num_in_sf_rows'), T.dynamic('num_in_sf_blocks'), T.dynamic('num_in_sf_words')
    in_sf_row_bytes = T.dynamic('in_sf_row_bytes')
    in_sf_word_stride, in_sf_stride_t, in_sf_stride_k = T.dynamic('in_sf_word_stride'), T.dynamic('in_sf_stride_t'), T.dynamic('in_sf_stride_k')
    in_sf_type = token_sf_tensor(in_packed, num_in_sf_rows, num_in_sf_blocks, num_in_sf_words, in_sf_word_stride, in_sf_stride_t, in_sf_stride_k,
                                 in_sf_row_bytes)
    num_sf_blocks, num_sf_words = T.dynamic('num_sf_blocks'), T.dynamic('num_sf_words')
    sf_word_stride = T.dynamic('sf_word_stride')
    sf_type = token_sf_tensor(packed, num_tokens, num_sf_blocks, num_sf_words, sf_word_stride, T.dynamic('sf_stride_t'), T.dynamic('sf_stride_k'))
    spec = (in_fmt, fmt, in_sf_format)
    tiled = spec in TILED
    strided = (in_fmt, fmt) in STRIDED_BUFFERS
    flat_sf_store = not tiled and not strided
    per_thread = CHUNKS_PER_THREAD.get(spec, 1)
    assert not tiled or (packed and per_thread == 1)
    in_dtype = T.int8 if in_fp4 else T.float8_e4m3fn
    out_dtype = T.int8 if out_fp4 else T.float8_e4m3fn

    @T.macro
    def store_tile_sf(out_sf, staged, exponent, active, tid, tile_row, tile_chunk, npc_log2):
        """The tile's packed UE8M0 scale factors: each block's first lane puts its exponent byte in shared memory (zero
        when inactive: as store_token_sf, a word's bytes past the row's last block are zero), then one lane a word of
        a row stores it, eight lanes a word of eight rows: 32 contiguous bytes, a whole sector."""
        blocks_log2 = npc_log2 - 5  # chunks a block, as a shift
        tile_word = (tile_chunk >> blocks_log2) >> 2  # the tile's first word (a tile spans 1, 2 or 4)
        if ((tid % TILE_CHUNKS) & ((1 << blocks_log2) - 1)) == 0:
            staged[(tid // TILE_CHUNKS) * TILE_CHUNKS + ((tid % TILE_CHUNKS) >> blocks_log2)] = T.if_then_else(active, T.Cast(T.uint8, exponent), T.uint8(0))
        T.sync_threads()
        # The words a tile spans from a local: under `tid // 8 < (4 >> (npc_log2 - 5))` tilelang dropped the whole
        # branch (docs/design.md).
        tile_words = T.alloc_var(T.int32)
        tile_words = (TILE_CHUNKS >> blocks_log2) >> 2
        word_bytes = T.alloc_local((4,), T.uint8)
        if tid // TILE_ROWS < tile_words and tile_row + tid % TILE_ROWS < num_tokens and tile_word + tid // TILE_ROWS < num_sf_words:
            for b in T.vectorized(4):
                word_bytes[b] = staged[(tid % TILE_ROWS) * TILE_CHUNKS + (tid // TILE_ROWS) * 4 + b]
            for b in T.vectorized(4):
                out_sf[tile_word + tid // TILE_ROWS, (tile_row + tid % TILE_ROWS) * 4 + b] = word_bytes[b]

    def input_scale(scale):
        """The float32 input scale factor of a `scales` element (packed: 2^(byte - 127), its byte's float bits)."""
        return T.reinterpret(T.Cast('uint32', scale) << T.uint32(23), T.float32) if in_packed else scale

    @T.macro
    def load_chunk(x, x_sf, all_data, scales, k, row, chunk, active, in_row, in_block):
        """Chunk k of the thread's: its bytes into all_data[k * in_bytes ...], its input scale factor into scales[k]
        (zeros when inactive). x and x_sf are flat views (but STRIDED_BUFFERS), read by unsigned 32 x 32 -> 64-bit
        offsets (addressing), where the strided buffers' signed 64-bit row * stride took about 10 instructions a chunk
        more; the scale factor unmasked: the op checks that x_sf has exactly the blocks of x (check_input_sf), so an
        active chunk's block is always there."""
        scales[k] = T.Cast(scales.dtype, 0)
        if active:
            for e in T.vectorized(in_bytes):
                if strided:
                    all_data[k * in_bytes + e] = x[row, chunk * in_bytes + e]
                else:
                    all_data[k * in_bytes + e] = x[unsigned_wide_mad(row, row_stride // vec_bytes, chunk * (in_bytes // vec_bytes)) * vec_bytes + e]
            if strided:
                if in_packed:
                    if (in_block >> 2) < num_in_sf_words and in_row * 4 < in_sf_row_bytes:
                        scales[k] = T.Cast('int32', x_sf[in_block >> 2, in_row * 4 + (in_block & 3)])
                elif in_row < num_in_sf_rows and in_block < num_in_sf_blocks:
                    scales[k] = x_sf[in_row, in_block]
            elif in_packed:
                scales[k] = T.Cast('int32', x_sf[unsigned_wide_mad(in_block >> 2, in_sf_word_stride, in_row * 4 + (in_block & 3))])
            else:
                scales[k] = x_sf[unsigned_wide_dot(in_row, in_sf_stride_t, in_block, in_sf_stride_k)]
        else:
            # Zero words, not T.cast(0, e4m3) bytes: nvcc does not fold that conversion, and its F2FP, byte merges and
            # copies (8-12 SASS instructions a chunk, predicated off in active threads but issued by all) stayed in
            # every thread's stream.
            zero_words = T.view(all_data, (per_thread * in_bytes // 4,), T.uint32)
            for w in T.unroll(in_bytes // 4):
                zero_words[k * in_bytes // 4 + w] = T.uint32(0)

    @T.macro
    def encode_word(values, w, codes):
        """The codes of values[8 w .. 8 w + 8): one word of e2m1 codes (built whole, see per_token_cast), or two of
        e4m3 bytes (one two-value conversion per pair)."""
        if out_fp4:
            codes[w] = e2m1_word([values[8 * w + e] for e in range(8)])
        else:
            result = T.view(codes, (CHUNK,), T.float8_e4m3fn)
            for e in T.vectorized(8):
                result[8 * w + e] = T.Cast(T.float8_e4m3fn, values[8 * w + e])

    @T.macro
    def encode_table(outputs, table):
        """The e2m1 -> e2m1 table of a chunk: the codes of the eight magnitudes' outputs, four code bytes a word. With
        float32 scale factors by the finite encoder: under a finite factor the outputs of the magnitudes up to the
        chunk's largest are finite and within amax * multiplier, about 6; those above it may not be, and are never
        looked up. Without round_sf 24.9 -> 24.0 us (GPU run 2 of docs/gpu-runs/2026-12-02-h200-f.md). UE8M0 in and
        out keeps the clamped encoder: its factors are powers of two, whose constant tables nearly every chunk takes,
        and with the finite encoder here ptxas scheduled its kernel otherwise and it measured 4% slower (run 2)."""
        for half in T.unroll(2):
            table[half] = T.uint32(0)
            for i in T.unroll(4):
                code = (e2m1_finite_top_nibble if finite_tables else e2m1_top_nibble)(outputs[4 * half + i])
                table[half] = table[half] | ((code >> T.uint32(28)) << T.uint32(8 * i))

    @T.macro
    def chunk_scale(amax, scale, sf, multiplier, factor: T.Ref, npc_log2, round_sf):
        """sf[0] and multiplier[0] of the chunk's block, and the factor scale * multiplier, amax[0] holding the largest
        |q| of the chunk."""
        amax[0] = amax[0] * scale
        for s in T.unroll(2):  # blocks of 64 or 128 elements span 2 or 4 lanes
            if s < npc_log2 - 5:
                amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
        # Without nvcc's FCHK tests and slow-path branches (kernel_src.quant.common, RCP_DIV_PRELUDE): about 12
        # instructions a chunk fewer on the float32 scale factors' path without round_sf, where e2m1 -> e2m1
        # and e4m3 -> e2m1 measured 1-2% faster (run 2 of docs/gpu-runs/2026-12-02-h200-c.md).
        block_scale(amax[0], T.float32(floor), fmax, round_sf, packed, sf, multiplier, 0, fast_division=True)
        factor = scale * multiplier[0]  # noqa: F841  (a store to the caller's variable, through the T.Ref)

    @T.macro
    def shifted_code_table(table, steps, codes_per_step: int, first):
        """table = SHIFTED_CODE_TABLE moved up steps * codes_per_step codes, with `first` (uint32) magnitude one's code:
        two multiply-adds and a shift."""
        table[0] = T.Cast('uint32', steps) * T.uint32(codes_per_step * SHIFTED_CODE_STEP[0]) + T.uint32(SHIFTED_CODE_TABLE[0]) + (first << T.uint32(8))
        table[1] = T.Cast('uint32', steps) * T.uint32(codes_per_step * SHIFTED_CODE_STEP[1]) + T.uint32(SHIFTED_CODE_TABLE[1])

    @T.macro
    def power_of_two_table(table, shift):
        """The table of the factor 2^shift (POW2_TABLE_SHIFTS), for the magnitudes whose products are at most 6."""
        shifted_code_table(table, shift, 2, T.Cast('uint32', T.max(shift * 2, 1)))

    @T.macro
    def pow2_table(factor, outputs, table):
        """A power-of-two factor 2^shift (both scale factors powers of two: UE8M0, or float32 from round_sf casts) with
        shift in POW2_TABLE_SHIFTS, which is every chunk whose own amax sets its scale (its largest code lands on 4
        or 6), forms its table from the shift; any other factor encodes its own."""
        if power_of_two_between(factor, *POW2_TABLE_SHIFTS):
            power_of_two_table(table, biased_exponent(factor) - 127)
        else:
            encode_table(outputs, table)

    @T.macro
    def canonical_table(factor, largest, largest_value, outputs, table):
        """Without round_sf: the table of the chunk's largest code when the factor is within CANONICAL_WINDOW of
        6 / its value (every chunk whose own amax sets its scale), else its own."""
        if T.abs(factor * largest_value - T.float32(6)) < T.float32(CANONICAL_WINDOW):
            steps = 7 - largest
            shifted_code_table(table, steps, 1, (T.Cast('uint32', T.int32(CANONICAL_FIRST_CODES) >> (steps * 4)) & T.uint32(15))
                               + T.Cast('uint32', factor >= T.float32(CANONICAL_TIE_FACTOR)))
        else:
            encode_table(outputs, table)

    @T.macro
    def amax_of_values(data, values, amax):
        """values = the float32 of the e4m3 chunk, amax[0] = their largest magnitude (NaNs skipped)."""
        for e in T.vectorized(CHUNK):
            values[e] = T.Cast('float32', data[e])
        amax[0] = T.float32(0)
        for e in T.unroll(CHUNK):
            amax[0] = T.max(amax[0], T.abs(values[e]))

    @T.macro
    def encode_f32_words(halves, values, factor, codes, finite):
        """e4m3 -> e2m1 codes of the chunk's values (f16, as the amax widened them) times factor, word by word, eight
        values live at a time, so that this path (any factor but a power of two) does not set the register count (and
        so the CTAs per SM) of the f16 one. finite: every product is finite and below E2M1_UNCLAMPED_BOUND
        (e2m1_finite_top_nibble), else any value (the clamped encoder)."""
        for w in T.unroll(CHUNK // 8):
            for e in T.vectorized(8):
                values[8 * w + e] = T.Cast('float32', halves[8 * w + e])
            for e in T.unroll(8):
                values[8 * w + e] = values[8 * w + e] * factor
            codes[w] = e2m1_word([values[8 * w + e] for e in range(8)], finite=finite)

    @T.macro
    def encode_pow2_lanes(halves, factor_exponent, codes, tid, round_sf):
        """The f16 lanes' codes under the factor 2^x, x = factor_exponent - 127: t = 2^-x as an f16 pair (its exponent
        field, at most 28, times 2^10 + 2^26: one multiply-add where shifting and merging took five instructions), and
        (x + 1) & 3 in each byte, doubled (x1_half of tk_e2m1_word_of_f16x8)."""
        threshold_pair = T.Cast('uint32', 127 + 15 - factor_exponent) * T.uint32(0x04000400)
        exponent_bytes = T.Cast('uint32', (factor_exponent - 126) & 3) * T.uint32(0x02020202)
        sixteen = sixteen_in_a_register(tid, round_sf)
        for w in T.unroll(CHUNK // 8):
            codes[w] = T.call_extern('uint32', 'tk_e2m1_word_of_f16x8', *[halves[4 * w + i] for i in range(4)], threshold_pair, exponent_bytes,
                                       sixteen)

    @T.macro
    def encode_ratio_lanes(halves, chunk_amax, factor, codes, tid, round_sf):
        """The ratio path's codes (tk_e2m1_word_of_f16x8_ratio) under the factor pair of chunk_amax and factor."""
        ratio_pair = T.alloc_var(T.uint32)
        ratio_pair = T.call_extern('uint32', 'tk_ratio_factor_f16x2', chunk_amax, factor)
        sixteen = sixteen_in_a_register(tid, round_sf)
        for w in T.unroll(CHUNK // 8):
            codes[w] = T.call_extern('uint32', 'tk_e2m1_word_of_f16x8_ratio', *[halves[4 * w + i] for i in range(4)], ratio_pair, sixteen)

    @T.macro
    def encode_f32_chunk(halves, values, factor, codes, chunk_amax, active):
        """e4m3 -> e2m1 codes in float32 (encode_f32_words): where every product lies within chunk_amax * factor below
        E2M1_UNCLAMPED_BOUND (a NaN fails the test), in every active lane of the warp, the finite encoder (the sign
        through the rounding add); else the clamped one, exact for any value. Voted once a chunk: a test per word cost
        a branch and its reconvergence per word, for a clamp that chunks whose own amax sets their scale never need.
        With the sign's LOP3 gone too, 36.4-36.6 -> 32.8-32.9 us without round_sf (GPU run 1 of
        docs/gpu-runs/2026-12-02-h200-f.md)."""
        half_values = T.view(halves, (CHUNK,), T.float16)
        if T.all_sync(T.Or(T.Not(active), products_bounded([chunk_amax], [factor]))) != 0:
            encode_f32_words(half_values, values, factor, codes, True)
        else:
            encode_f32_words(half_values, values, factor, codes, False)

    @T.macro
    def encode_pow2_or_f32(halves, values, factor, factor_exponent, codes, chunk_amax, active, tid, round_sf):
        """The f16 lanes' codes where every active lane of the warp has a power-of-two factor they take
        (f16_exact_factor), else float32's."""
        if f16_lanes_vote(factor, chunk_amax, active):
            encode_pow2_lanes(halves, factor_exponent, codes, tid, round_sf)
        else:
            encode_f32_chunk(halves, values, factor, codes, chunk_amax, active)

    @T.macro
    def encode_one_by_one(values, factor, codes):
        """codes of values * factor, element by element."""
        for e in T.unroll(CHUNK):
            values[e] = values[e] * factor
        for w in T.unroll(CHUNK // 8):
            encode_word(values, w, codes)

    @T.prim_func
    def per_token_requant(
        x: T.StridedTensor[(num_tokens, in_width), (row_stride, 1), in_dtype],
        x_sf: in_sf_type,
        out: T.Tensor[(num_tokens, hidden // 2 if out_fp4 else hidden), out_dtype],
        out_sf: sf_type,
        chunks_per_row: T.int32,  # ceil(hidden / num_per_channels) * num_per_channels / 32, blocks padded to a multiple of 4 when packed
        row_magic: T.int64,  # with row_shift, the division of a chunk's index by chunks_per_row (unused when tiled)
        row_shift: T.int32,
        tile_magic: T.int64,  # with tile_shift, the division of a CTA's index by the tiles a row (used only when tiled)
        tile_shift: T.int32,
        npc_log2: T.int32,
        in_block_m_log2: T.int32,
        in_block_k_log2: T.int32,
        round_sf: T.int32,
    ):
        # (A 1-d grid when tiled too: a grid's y is limited to 65535, 524280 rows in tiles of eight.)
        num_ctas = (T.ceildiv(num_tokens, TILE_ROWS) * T.ceildiv(chunks_per_row, TILE_CHUNKS) if tiled
                    else T.ceildiv(num_tokens * chunks_per_row, NUM_THREADS * per_thread))
        with T.Kernel(num_ctas, threads=NUM_THREADS,
                      prelude=(E4M3_TO_E2M1_F16_PRELUDE if f16_path else PRMT_PRELUDE if in_fp4 else '')
                      + (E2M1_SIGNED_PRELUDE if finite_encoder else '')
                      + ('' if packed else RCP_DIV_PRELUDE)) as block_index:
            T.assume(in_width % in_bytes == 0)
            T.assume(row_stride % vec_bytes == 0)
            if tiled and packed:
                T.assume(sf_word_stride % 4 == 0)  # bytes of int32 words: a word is one 32-bit store
            if spec in MIN_BLOCKS:
                T.annotate_min_blocks_per_sm(MIN_BLOCKS_BY_TARGET.get((arch.target, *spec, vec_bytes), MIN_BLOCKS[spec]))
            tid = T.get_thread_binding()
            all_data = T.alloc_local((per_thread * in_bytes,), in_dtype)
            # The input scale factor of each chunk; packed, its exponent byte, which the exponent paths take as it is
            # (input_scale gives the float): its float bits and back had taken three instructions a chunk on the chain
            # from the byte's load to the warp's vote, and packed e4m3 -> e2m1 measured 28.5-28.6 -> 27.8 us without
            # them (runs 1 and 2 of docs/gpu-runs/2026-12-03-h200.md).
            scales = T.alloc_local((per_thread,), T.int32 if in_packed else T.float32)
            if tiled:
                tile_row = T.alloc_var(T.int32)
                tile_chunk = T.alloc_var(T.int32)
                # Not `//`: with an integer division ahead of every CTA's loads e2m1 -> e2m1 lost the tiles' 8% (GPU run
                # 4 of docs/gpu-runs/2026-12-01-h200-g.md).
                tile_row = magic_quotient(block_index, tile_magic, tile_shift)
                tile_chunk = (block_index - tile_row * T.ceildiv(chunks_per_row, TILE_CHUNKS)) * TILE_CHUNKS
                tile_row = tile_row * TILE_ROWS
                staged = T.alloc_shared((TILE_ROWS * TILE_CHUNKS,), T.uint8)  # [row][block of the tile]
            elif flat_sf_store:
                out_sf_flat, sf_row_step, sf_block_step = sf_flat_view(out_sf, packed)
            x_in = x if strided else T.Tensor(((num_tokens - 1) * row_stride + in_width,), in_dtype, x.data)
            x_sf_in = x_sf if strided else sf_flat_view(x_sf, in_packed)[0]
            # Per thread, not per chunk: whether its chunks are the first of their blocks (the lane that stores the
            # block's scale factor), and whether a block is one chunk.
            block_writer = T.alloc_var(T.bool)
            block_writer = (tid & ((1 << (npc_log2 - 5)) - 1)) == 0
            one_chunk_blocks = T.alloc_var(T.bool)
            one_chunk_blocks = npc_log2 == 5
            if per_thread == 1:
                # (Not the loop below with one turn: written so, these specs' cubins changed and e2m1 -> e2m1 measured
                # 2% slower, GPU run 3 of docs/gpu-runs/2026-12-01-h200-g.md; this form keeps them as measured.)
                # Bound once (locals, not expressions pasted at each use): every address below derives from them.
                row = T.alloc_var(T.int32)
                chunk = T.alloc_var(T.int32)  # of the row; in chunks, not elements, so that the vectoriser still sees
                # every column a multiple of CHUNK
                active = T.alloc_var(T.bool)
                if tiled:
                    row = tile_row + tid // TILE_CHUNKS
                    chunk = tile_chunk + tid % TILE_CHUNKS
                else:
                    c = T.alloc_var(T.int32)
                    c = block_index * NUM_THREADS + tid
                    row = magic_quotient(c, row_magic, row_shift)
                    chunk = c - row * chunks_per_row
                col = chunk * CHUNK
                active = T.And(row < num_tokens, col < hidden)
                # int32 variables too, so that the scale factors' addresses widen to 64 bits only at the end.
                in_row = T.alloc_var(T.int32)
                in_block = T.alloc_var(T.int32)
                in_row = row >> in_block_m_log2
                in_block = col >> in_block_k_log2
                if not flat_sf_store:  # (the strided store's block; the flat one takes the column)
                    block = T.alloc_var(T.int32)
                    block = col >> npc_log2
                load_chunk(x_in, x_sf_in, all_data, scales, 0, row, chunk, active, in_row, in_block)
            else:
                # Every chunk's loads are issued before any is encoded; a thread's chunks are NUM_THREADS apart, so
                # each warp's loads stay one contiguous run.
                rows = T.alloc_local((per_thread,), T.int32)
                chunks = T.alloc_local((per_thread,), T.int32)
                actives = T.alloc_local((per_thread,), T.bool)
                for k in T.unroll(per_thread):
                    c = T.alloc_var(T.int32)
                    c = (block_index * per_thread + k) * NUM_THREADS + tid
                    rows[k] = magic_quotient(c, row_magic, row_shift)
                    chunks[k] = c - rows[k] * chunks_per_row
                    actives[k] = T.And(rows[k] < num_tokens, chunks[k] * CHUNK < hidden)
                    load_chunk(x_in, x_sf_in, all_data, scales, k, rows[k], chunks[k], actives[k], rows[k] >> in_block_m_log2, (chunks[k] * CHUNK) >> in_block_k_log2)
            for k in T.unroll(per_thread):
                data = T.alloc_local((in_bytes,), in_dtype)
                for e in T.vectorized(in_bytes):
                    data[e] = all_data[k * in_bytes + e]
                if per_thread > 1:
                    row = rows[k]
                    chunk = chunks[k]
                    active = actives[k]
                    if not flat_sf_store:
                        block = (chunk * CHUNK) >> npc_log2
                values = T.alloc_local((CHUNK,), T.float32)
                amax = T.alloc_local((1,), T.float32)
                sf = T.alloc_local((1,), T.float32)
                multiplier = T.alloc_local((1,), T.float32)
                if in_fp4:
                    words = T.view(data, (in_bytes // 4,), T.uint32)
                    magnitudes = T.alloc_local((in_bytes // 4,), T.uint32)
                    for w in T.unroll(in_bytes // 4):
                        magnitudes[w] = words[w] & T.uint32(CODE_MAGNITUDES)
                    # The largest |q| of the chunk is the value of its largest magnitude code (the exponent path's
                    # chunks need less, and find it only where they leave that path).
                    largest = T.alloc_var(T.int32)
                    if not exponent_path:
                        largest_value = T.alloc_var(T.float32)
                        largest = largest_magnitude([magnitudes[w] for w in range(in_bytes // 4)])
                        largest_value = e2m1_value(largest)
                        amax[0] = largest_value
                    table = T.alloc_local((2,), T.uint32)  # the chunk's table of eight codes or bytes, see below
                elif f16_path:
                    words = T.view(data, (CHUNK // 4,), T.uint32)
                    halves = T.alloc_local((CHUNK // 2,), T.uint32)  # f16 pairs, which both encoders below read
                    for i, widen in enumerate(E4M3_PAIR_TO_F16X2 * (CHUNK // 4)):  # (a Python loop: a function by index)
                        halves[i] = T.call_extern('uint32', widen, words[i // 2])
                    chunk_amax = T.alloc_var(T.float32)
                    chunk_amax = T.call_extern('float32', 'tk_f16x2_absmax_nan', T.address_of(halves[0]), CHUNK // 2)
                    amax[0] = chunk_amax
                    if T.isnan(chunk_amax):  # the reference's maximum skips NaNs (no values array: see the float32 path below)
                        amax[0] = T.float32(0)
                        for e in T.unroll(CHUNK):
                            amax[0] = T.max(amax[0], T.abs(T.Cast('float32', data[e])))
                else:
                    amax_of_values(data, values, amax)
                factor = T.alloc_var(T.float32)
                if exponent_path:
                    # UE8M0 in and out, a block of one chunk: the scale factor's exponent is the input's less
                    # (7 - largest) / 2, and the table that of the factor 2 to that, in integers (EXPONENT_PATH_INPUTS);
                    # the chunks off that path find their largest code and factor as the others do.
                    in_exponent = T.alloc_var(T.int32)
                    in_exponent = scales[k]
                    halving_steps, nonzero = halving_steps_of_largest([magnitudes[w] for w in range(in_bytes // 4)])
                    exact_exponents = T.alloc_var(T.bool)
                    exact_exponents = T.And(T.And(one_chunk_blocks, nonzero),
                                            T.And(in_exponent >= EXPONENT_PATH_INPUTS[0], in_exponent <= EXPONENT_PATH_INPUTS[1]))
                    sf_exponent = T.alloc_var(T.int32)
                    if exact_exponents:
                        steps = T.alloc_var(T.int32)
                        steps = halving_steps
                        sf_exponent = in_exponent - steps
                        power_of_two_table(table, steps)
                    else:
                        largest = largest_magnitude([magnitudes[w] for w in range(in_bytes // 4)])
                        amax[0] = e2m1_value(largest)
                        chunk_scale(amax, input_scale(scales[k]), sf, multiplier, factor, npc_log2, round_sf)
                        sf_exponent = T.Cast('int32', sf[0])
                elif f16_exponent_path:
                    # UE8M0 in and out, a block of one chunk: the scale factor's byte is the input's plus
                    # amax_shift, and the factor 2^-amax_shift, in integers (F16_EXPONENT_PATH); other chunks take
                    # block_scale.
                    in_exponent = T.alloc_var(T.int32)
                    in_exponent = scales[k]
                    amax_shift = T.alloc_var(T.int32)
                    amax_shift = T.Cast('int32', (T.reinterpret(chunk_amax, T.uint32) + T.uint32(F16_EXPONENT_PATH_CARRY)) >> T.uint32(23)) - (127 + F16_EXPONENT_PATH_F)
                    sf_exponent = T.alloc_var(T.int32)
                    sf_exponent = in_exponent + amax_shift
                    exact_exponents = T.alloc_var(T.bool)
                    exact_exponents = T.And(T.And(one_chunk_blocks, chunk_amax > T.float32(0)),
                                            T.And(T.And(in_exponent >= F16_EXPONENT_PATH_INPUTS[0], in_exponent <= F16_EXPONENT_PATH_INPUTS[1]),
                                                  T.And(sf_exponent >= F16_EXPONENT_PATH_BYTES[0], sf_exponent <= F16_EXPONENT_PATH_BYTES[1])))
                    # Voted, so that a warp whose every active chunk is on the path skips the factor's test for the f16
                    # lanes as well, and the shuffles of block_scale's branch stay outside any divergent one.
                    warp_exponents = T.alloc_var(T.bool)
                    warp_exponents = T.all_sync(T.Or(T.Not(active), exact_exponents)) != 0
                    if warp_exponents:
                        factor = T.reinterpret(T.Cast('uint32', 127 - amax_shift) << T.uint32(23), T.float32)
                    else:
                        chunk_scale(amax, input_scale(scales[k]), sf, multiplier, factor, npc_log2, round_sf)
                        sf_exponent = T.Cast('int32', sf[0])
                else:
                    chunk_scale(amax, input_scale(scales[k]), sf, multiplier, factor, npc_log2, round_sf)

                if tiled:
                    store_tile_sf(out_sf, staged, sf_exponent if integer_sf else sf[0], active, tid, tile_row, tile_chunk, npc_log2)
                elif flat_sf_store and packed:
                    # The op pads a row's chunks to whole words of packed scale factors (4 blocks), so the bytes past a
                    # row's last block are those of inactive chunks, which store zero (deterministic output) where the
                    # last block's lane took a test and three stores a chunk. Unmasked: the op allocated the buffer
                    # (alloc_sf).
                    if block_writer and row < num_tokens:
                        store_block_sf_flat(out_sf_flat, packed, row, chunk >> (npc_log2 - 5), T.if_then_else(active, sf_exponent if integer_sf else sf[0], 0),
                                            False, sf_row_step, sf_block_step)
                elif flat_sf_store:
                    if active and block_writer:
                        store_block_sf_flat(out_sf_flat, packed, row, chunk >> (npc_log2 - 5), sf[0], False, sf_row_step, sf_block_step)
                elif active and (tid & ((1 << (npc_log2 - 5)) - 1)) == 0:  # (STRIDED_BUFFERS: not block_writer, which moved its SASS)
                    store_token_sf(out_sf, packed, row, block, sf[0], (block + 1) << npc_log2 >= hidden, num_sf_blocks, num_sf_words)
                codes = T.alloc_local((out_bytes // 4,), T.uint32)
                if in_fp4:
                    if exponent_path and exact_exponents:
                        for w in T.unroll(in_bytes // 4):
                            codes[w] = e2m1_word_through_table(words[w], magnitudes[w], table[0], table[1])
                    elif (T.reinterpret(factor, T.uint32) & T.uint32(FLOAT32_EXPONENT_MASK)) != T.uint32(FLOAT32_EXPONENT_MASK):
                        # A finite factor: q * factor takes eight values (and their negations) in the chunk, so
                        # its codes come from a table of the eight magnitudes' outputs, looked up four codes at a
                        # time (kernel_src.quant.nibbles). A negative q flips the output's sign bit, as it flips
                        # the sign of the product: exact for any finite factor, negative or zero too. A
                        # non-finite one (an all-zero chunk with a large input scale, see
                        # tile_kernels_aot.reference) makes 0 * factor a NaN, whose code has no sign: that chunk
                        # takes the per-element path.
                        outputs = T.alloc_local((8,), T.float32)
                        for m, value in enumerate(E2M1_VALUES):
                            outputs[m] = T.float32(value) * factor
                        if out_fp4:
                            if packed or round_sf != 0:  # (round_sf: uniform, a warp takes one of the two)
                                pow2_table(factor, outputs, table)
                            else:
                                canonical_table(factor, largest, largest_value, outputs, table)
                            for w in T.unroll(in_bytes // 4):
                                codes[w] = e2m1_word_through_table(words[w], magnitudes[w], table[0], table[1])
                        else:
                            table_bytes = T.view(table, (8,), T.float8_e4m3fn)
                            for m in T.vectorized(8):  # one two-value conversion per pair
                                table_bytes[m] = T.Cast(T.float8_e4m3fn, outputs[m])
                            for w in T.unroll(in_bytes // 4):
                                for half in T.unroll(2):
                                    codes[2 * w + half] = table_bytes_of_codes(words[w], magnitudes[w], table[0], table[1], half)
                    else:
                        # Word by word: the float32 of eight codes through halves (see HALF_TABLE_LOW), times the
                        # factor, encoded. Eight values live at a time, not the chunk's 32, so that this rare path
                        # does not set the register count (and so the CTAs per SM) of the table path.
                        for w in T.unroll(in_bytes // 4):
                            half_pairs = T.alloc_local((4,), T.uint32)
                            for half in T.unroll(2):
                                high_bytes = table_bytes_of_codes(words[w], magnitudes[w], T.uint32(HALF_TABLE_LOW), T.uint32(HALF_TABLE_HIGH), half)
                                # [0, b0, 0, b1] and [0, b2, 0, b3]: byte 4 of a permute is the zero operand's.
                                half_pairs[2 * half] = byte_perm(high_bytes, T.uint32(0), T.uint32(0x1404))
                                half_pairs[2 * half + 1] = byte_perm(high_bytes, T.uint32(0), T.uint32(0x3424))
                            decoded = T.view(half_pairs, (8,), T.float16)
                            for e in T.vectorized(8):
                                values[8 * w + e] = T.Cast('float32', decoded[e]) * factor
                            encode_word(values, w, codes)
                elif f16_path:
                    factor_exponent = biased_exponent(factor)
                    # A power of two whose double is in f16's normal range, no NaN in the chunk, and every product within 6,
                    # in every active lane of the warp, so that a warp takes one path. Without round_sf some chunks still have a
                    # power-of-two factor (7.5% of the benchmark's), and a warp holding one ran both paths (91% of warps):
                    # Nsight counted 23.7 active threads a warp instruction; voted, 32, and 24% fewer warp instructions
                    # (49.0-49.2 -> 36.4-36.8 us, run 1 of docs/gpu-runs/2026-12-02-h200-b.md). The float32 path is exact for any
                    # factor.
                    if packed:  # (packed UE8M0 requires round_sf: its factors are powers of two)
                        f16_lanes = T.alloc_var(T.bool)
                        if f16_exponent_path:  # (a warp on the exponent path has such factors: no test)
                            f16_lanes = warp_exponents
                            if T.Not(warp_exponents):
                                f16_lanes = f16_lanes_vote(factor, chunk_amax, active)
                        else:
                            f16_lanes = f16_lanes_vote(factor, chunk_amax, active)
                        if f16_lanes:
                            encode_pow2_lanes(halves, factor_exponent, codes, tid, round_sf)
                        else:
                            encode_f32_chunk(halves, values, factor, codes, chunk_amax, active)
                    else:
                        # Without round_sf (whose factors, s times a power of two, are not 6 / M), a block of one chunk
                        # with no NaN, whose amax is normal (at or above the floor) and finite, in every active lane of
                        # the warp: the ratio path, for any factor (a power of two too), before the f16 lanes' test.
                        # (amax[0] skips a NaN, chunk_amax does not.) With round_sf the warp neither forms nor votes on
                        # that test: in one branch with it, round_sf's chunks measured 2.5% slower (GPU run 3 of
                        # docs/gpu-runs/2026-12-02-h200-k.md).
                        if round_sf == 0:
                            amax_bits = T.reinterpret(amax[0], T.uint32)
                            ratio_chunk = T.And(T.And(one_chunk_blocks, T.Not(T.isnan(chunk_amax))),
                                                amax_bits - T.uint32(RATIO_AMAX_BITS[0]) < T.uint32(RATIO_AMAX_BITS[1] - RATIO_AMAX_BITS[0]))
                            if T.all_sync(T.Or(T.Not(active), ratio_chunk)) != 0:
                                encode_ratio_lanes(halves, chunk_amax, factor, codes, tid, round_sf)
                            else:
                                encode_pow2_or_f32(halves, values, factor, factor_exponent, codes, chunk_amax, active, tid, round_sf)
                        else:
                            encode_pow2_or_f32(halves, values, factor, factor_exponent, codes, chunk_amax, active, tid, round_sf)
                else:
                    encode_one_by_one(values, factor, codes)
                code_bytes = T.view(codes, (out_bytes,), out_dtype)
                if active:
                    if out_fp4:
                        # Through a flat view by an unsigned 32-bit offset (the op keeps the output below 2^31
                        # elements): e4m3 -> e2m1 1.7-3.4% faster (e2m1 -> e2m1 UE8M0 2.5%, with a shorter table form
                        # in the same build); e4m3 -> e4m3 the same way measured 10-18% slower, as its scale factors
                        # did (STRIDED_BUFFERS), and e2m1 -> e4m3 under 1% slower (GPU run 4 of
                        # docs/gpu-runs/2026-12-02-h200-g.md).
                        out_flat = T.Tensor((out.shape[0] * out.shape[1],), out_dtype, out.data)
                        for e in T.vectorized(out_bytes):
                            out_flat[unsigned_index(row * out.shape[1] + chunk * out_bytes) + e] = code_bytes[e]
                    else:
                        for e in T.vectorized(out_bytes):
                            out[row, chunk * out_bytes + e] = code_bytes[e]

    return KernelProgram(per_token_requant, alignment={'x': vec_bytes, 'x_sf': 1 if in_packed else 4, 'out': 16, 'out_sf': 4 if tiled or not packed else 1})


def prebuilt():
    for in_fmt in FORMATS:
        for fmt in FORMATS:
            for sf_format in SF_FORMATS:
                for vec_bytes in VEC_BYTES if in_fmt == 'e4m3' else (16,):
                    yield dict(in_fmt=in_fmt, fmt=fmt, in_sf_format=sf_format, sf_format=sf_format, vec_bytes=vec_bytes)


DECL = KernelDecl(
    name='quant.per_token_requant',
    params=(param('in_fmt', 'str', 'in'), param('fmt', 'str', ''), param('in_sf_format', 'str', 'insf'), param('sf_format', 'str', 'sf'),
            param('vec_bytes', 'int', 'vb')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
)
