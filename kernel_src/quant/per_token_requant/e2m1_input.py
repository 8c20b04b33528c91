"""per_token_requant with e2m1 input: a chunk's 32 codes hold at most eight magnitudes, so its amax is the value of the
largest one and, for a finite factor, its output codes come from a table of the eight magnitudes' outputs, looked up
four codes at a time (kernel_src.quant.nibbles). To e2m1 that table needs no products where the factor is known: one
formed from the shift for power-of-two factors (POW2_TABLE_SHIFTS), one from the largest code without round_sf
(CANONICAL_WINDOW), and with UE8M0 in and out the scale factor too comes from the largest code, in integers
(EXPONENT_PATH_INPUTS). tests/cpu/test_nibble_tables.py checks these tables and bounds."""

import struct
from fractions import Fraction

from tilelang import language as T

from kernel_src.quant.common import FLOAT32_EXPONENT_MASK, e2m1_finite_top_nibble, e2m1_top_nibble
from kernel_src.quant.nibbles import (
    CODE_MAGNITUDES, byte_perm, e2m1_word_through_table, halving_steps_of_largest, largest_magnitude, table_bytes_of_codes, table_word,
)
from kernel_src.quant.per_token_requant.layout import ChunkSite, Dims, Paths, store_chunk_sf, store_codes
from kernel_src.quant.per_token_requant.scale import biased_exponent, encode_word, power_of_two_between, site_chunk_scale, site_chunk_scale_byte

# e2m1 input decoded through halves: every e2m1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6) is a half whose low byte is
# zero, so four codes' high bytes come from one byte-table lookup (kernel_src.quant.nibbles), two permutes interleave
# them with zero bytes into half pairs, and one conversion per element gives the exact float32: about three
# instructions an element, where decoding each code's fields into float32 bits takes eight.
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
POW2_TABLE_SHIFTS = (0, 3)

# e2m1 -> e2m1 with float32 scale factors without round_sf: a chunk whose largest magnitude code is L (value v_L) has
# the factor s * RN(6 / RN(v_L s)), within a few ulps of 6 / v_L, and the codes of the magnitudes m <= L (the only
# ones it looks up) under any factor that close are fixed: a magnitude two or more goes to m + (7 - L) (from 1 up the
# grid steps by 3/2 and 4/3 in turn, and 6 / v_L is the product of the 7 - L steps above L, so v_m 6 / v_L lands on
# the value 7 - L codes above m or within 9/8 of it, far from a rounding boundary), and magnitude one (0.5) to the
# code of 3 / v_L, which for L = 6 is 0.75, the tie between codes 1 and 2, decided by whether the factor reaches 1.5.
# So the table is two multiply-adds of d = 7 - L and that one byte, where encoding it takes eight products and
# encodings (encode_table). CANONICAL_WINDOW bounds |factor * v_L - 6|: 1% of 6, where the nearest rounding boundary
# of every other entry is 4% or more away; the test checks every float32 factor in each window.
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
# is e - (7 - L) / 2 and the factor 2^((7 - L) / 2), whose table (power_of_two_table: v_L 2^shift <= 6, so no code it
# looks up saturates) the kernel forms from the shift: no float amax, no pow2_scale_exponent, no float round trip of
# the byte, no test of the factor, where the ALU pipe is the busiest. It holds for L >= 1 and 4 <= e <= 252: amax
# finite (6 * 2^(e - 127) overflows from e = 253) and at or above e2m1's amax floor 6 * 2^-126 (at e = 4 only for
# L >= 2, but the floor's own byte is then the same); other chunks take block_scale. The test replays block_scale over
# every byte and code, and shows both bounds tight.
EXPONENT_PATH_INPUTS = (4, 252)


def e2m1_value(magnitude):
    """float32 value of an e2m1 magnitude code 0..7: m / 2 below 2, else 2^(m / 2 - 1) * (1 + (m & 1) / 2),
    whose float32 bits are (m + 252) << 22 (exponent 126 + m / 2, the odd codes' mantissa bit at 22)."""
    return T.Select(magnitude < 2, T.Cast('float32', magnitude) * T.float32(0.5),
                    T.reinterpret(T.Cast('uint32', magnitude + 252) << T.uint32(22), T.float32))


@T.macro
def encode_table(p: Paths, outputs, table):
    """The e2m1 -> e2m1 table of a chunk: the codes of the eight magnitudes' outputs, four code bytes a word. With
    float32 scale factors by the finite encoder: under a finite factor the outputs of the magnitudes up to the
    chunk's largest are finite and within amax * multiplier, about 6; those above it may not be, and are never
    looked up. UE8M0 in and out keeps the clamped encoder: its factors are powers of two, whose constant tables
    nearly every chunk takes, and with the finite encoder here ptxas schedules its kernel less well."""
    for half in T.unroll(2):
        table[half] = T.uint32(0)
        for i in T.unroll(4):
            code = (e2m1_finite_top_nibble if p.finite_tables else e2m1_top_nibble)(outputs[4 * half + i])
            table[half] = table[half] | ((code >> T.uint32(28)) << T.uint32(8 * i))


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
def pow2_table(p: Paths, factor, outputs, table):
    """A power-of-two factor 2^shift (both scale factors powers of two: UE8M0, or float32 from round_sf casts) with
    shift in POW2_TABLE_SHIFTS, which is every chunk whose own amax sets its scale (its largest code lands on 4
    or 6), forms its table from the shift; any other factor encodes its own."""
    if power_of_two_between(factor, *POW2_TABLE_SHIFTS):
        power_of_two_table(table, biased_exponent(factor) - 127)
    else:
        encode_table(p, outputs, table)


@T.macro
def canonical_table(p: Paths, factor, largest, largest_value, outputs, table):
    """Without round_sf: the table of the chunk's largest code when the factor is within CANONICAL_WINDOW of
    6 / its value (every chunk whose own amax sets its scale), else its own."""
    if T.abs(factor * largest_value - T.float32(6)) < T.float32(CANONICAL_WINDOW):
        steps = 7 - largest
        shifted_code_table(table, steps, 1, (T.Cast('uint32', T.int32(CANONICAL_FIRST_CODES) >> (steps * 4)) & T.uint32(15))
                           + T.Cast('uint32', factor >= T.float32(CANONICAL_TIE_FACTOR)))
    else:
        encode_table(p, outputs, table)


@T.macro
def requant_e2m1_chunk(p: Paths, d: Dims, site: ChunkSite, data, values, amax, sf, multiplier):
    """One chunk of e2m1 input: its amax from its largest magnitude code, its scale factor (from the codes and the
    input's exponent byte on the exponent path), then its codes through the chunk's table, and the stores."""
    words = T.view(data, (p.in_bytes // 4,), T.uint32)
    magnitudes = T.alloc_local((p.in_bytes // 4,), T.uint32)
    for w in T.unroll(p.in_bytes // 4):
        magnitudes[w] = words[w] & T.uint32(CODE_MAGNITUDES)
    # The largest |q| of the chunk is the value of its largest magnitude code (the exponent path's chunks need less,
    # and find it only where they leave that path).
    largest = T.alloc_var(T.int32)
    if not p.exponent_path:
        largest_value = T.alloc_var(T.float32)
        largest = largest_magnitude([magnitudes[w] for w in range(p.in_bytes // 4)])
        largest_value = e2m1_value(largest)
        amax[0] = largest_value
    table = T.alloc_local((2,), T.uint32)  # the chunk's table of eight codes or bytes, see below
    factor = T.alloc_var(T.float32)
    if p.exponent_path:
        # UE8M0 in and out, a block of one chunk: the scale factor's exponent is the input's less (7 - largest) / 2,
        # and the table that of the factor 2 to that, in integers (EXPONENT_PATH_INPUTS); the chunks off that path
        # find their largest code and factor as the others do.
        in_exponent = T.alloc_var(T.int32)
        in_exponent = site.scales[site.k]
        halving_steps, nonzero = halving_steps_of_largest([magnitudes[w] for w in range(p.in_bytes // 4)])
        exact_exponents = T.alloc_var(T.bool)
        exact_exponents = T.And(T.And(site.one_chunk_blocks, nonzero),
                                T.And(in_exponent >= EXPONENT_PATH_INPUTS[0], in_exponent <= EXPONENT_PATH_INPUTS[1]))
        sf_exponent = T.alloc_var(T.int32)
        if exact_exponents:
            steps = T.alloc_var(T.int32)
            steps = halving_steps
            sf_exponent = in_exponent - steps
            power_of_two_table(table, steps)
        else:
            largest = largest_magnitude([magnitudes[w] for w in range(p.in_bytes // 4)])
            amax[0] = e2m1_value(largest)
            site_chunk_scale_byte(p, site, amax, sf, multiplier, factor, sf_exponent)
    else:
        site_chunk_scale(p, site, amax, sf, multiplier, factor)
    store_chunk_sf(p, d, site, sf_exponent if p.integer_sf else sf[0])

    codes = T.alloc_local((p.out_bytes // 4,), T.uint32)
    if p.exponent_path and exact_exponents:
        for w in T.unroll(p.in_bytes // 4):
            codes[w] = e2m1_word_through_table(words[w], magnitudes[w], table[0], table[1])
    elif (T.reinterpret(factor, T.uint32) & T.uint32(FLOAT32_EXPONENT_MASK)) != T.uint32(FLOAT32_EXPONENT_MASK):
        # A finite factor: q * factor takes eight values (and their negations) in the chunk, so its codes come from a
        # table of the eight magnitudes' outputs, looked up four codes at a time (kernel_src.quant.nibbles). A negative
        # q flips the output's sign bit, as it flips the sign of the product: exact for any finite factor, negative or
        # zero too. A non-finite one (an all-zero chunk with a large input scale, see tile_kernels_aot.reference) makes
        # 0 * factor a NaN, whose code has no sign: that chunk takes the per-element path.
        outputs = T.alloc_local((8,), T.float32)
        for m, value in enumerate(E2M1_VALUES):
            outputs[m] = T.float32(value) * factor
        if p.out_fp4:
            if p.packed or site.round_sf != 0:  # (round_sf: uniform, a warp takes one of the two)
                pow2_table(p, factor, outputs, table)
            else:
                canonical_table(p, factor, largest, largest_value, outputs, table)
            for w in T.unroll(p.in_bytes // 4):
                codes[w] = e2m1_word_through_table(words[w], magnitudes[w], table[0], table[1])
        else:
            table_bytes = T.view(table, (8,), T.float8_e4m3fn)
            for m in T.vectorized(8):  # one two-value conversion per pair
                table_bytes[m] = T.Cast(T.float8_e4m3fn, outputs[m])
            for w in T.unroll(p.in_bytes // 4):
                for half in T.unroll(2):
                    codes[2 * w + half] = table_bytes_of_codes(words[w], magnitudes[w], table[0], table[1], half)
    else:
        # Word by word: the float32 of eight codes through halves (see HALF_TABLE_LOW), times the factor, encoded.
        # Eight values live at a time, not the chunk's 32, so that this rare path does not set the register count
        # (and so the CTAs per SM) of the table path.
        for w in T.unroll(p.in_bytes // 4):
            half_pairs = T.alloc_local((4,), T.uint32)
            for half in T.unroll(2):
                high_bytes = table_bytes_of_codes(words[w], magnitudes[w], T.uint32(HALF_TABLE_LOW), T.uint32(HALF_TABLE_HIGH), half)
                # [0, b0, 0, b1] and [0, b2, 0, b3]: byte 4 of a permute is the zero operand's.
                half_pairs[2 * half] = byte_perm(high_bytes, T.uint32(0), T.uint32(0x1404))
                half_pairs[2 * half + 1] = byte_perm(high_bytes, T.uint32(0), T.uint32(0x3424))
            decoded = T.view(half_pairs, (8,), T.float16)
            for e in T.vectorized(8):
                values[8 * w + e] = T.Cast('float32', decoded[e]) * factor
            encode_word(p, values, w, codes)
    store_codes(p, site, codes)
