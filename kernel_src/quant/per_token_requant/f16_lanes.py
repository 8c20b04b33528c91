"""per_token_requant from e4m3 to e2m1: two elements an instruction in f16 lanes (kernel_src/cuda/e4m3_to_e2m1_f16.cuh),
under a power-of-two factor, or without round_sf by the ratio path when every active lane of the warp holds a block
of one chunk with a normal, finite amax; else element by element in float32, as e4m3 to e4m3 goes. All three read
the f16 pairs the amax widened (one widening of the e4m3 bytes a chunk)."""

import struct

from tilelang import language as T

from kernel_src.cuda import prelude
from kernel_src.quant.common import FORMATS, e2m1_word, let, pow2_scale_carry, products_bounded
from kernel_src.quant.per_token_requant.layout import CHUNK, ChunkSite, Dims, Paths, store_chunk_sf, store_codes
from kernel_src.quant.per_token_requant.scale import biased_exponent, power_of_two_between, site_chunk_scale, site_chunk_scale_byte

# UE8M0 in and out and a block of one chunk: with the chunk's amax = M 2^a (M in [1, 2), three mantissa bits, a in
# [-9, 8]) and the input's byte b (scale 2^(b - 127)), block_scale's byte is pow2_scale_exponent's
# ((bits(amax 2^(b - 127)) + 2^22 - 1) >> 23) - 2 = b + a - 2 + (M > 1.5), for a product that is normal and at or above
# the floor (no clamp), and whose byte leaves the multiplier 2^(127 - byte) normal; the factor, 2^(b - 127) times that,
# is then 2^-(a - 2 + (M > 1.5)), the amax_shift of the kernel, whatever b. So both come from the bits of the f32 amax,
# added to 2^22 - 1 (F16_EXPONENT_PATH_CARRY, pow2_scale_carry(6)), with no float product, clamp or conversion of the
# byte (about 17 instructions a chunk fewer), and the factor needs no test for the f16 lanes (|amax_shift| <= 11; amax
# times it is at most 6). It holds for every nonzero amax, input byte 1..254 (F16_EXPONENT_PATH_INPUTS: byte 0 reads as
# a zero scale, 255 as infinity) and output byte 2..252 (F16_EXPONENT_PATH_BYTES): 252 keeps the product finite, 2 puts
# it above the floor 6 * 2^-126 (1.5 * 2^-124: 2^(a + b - 127) >= 2^-124 for a + b >= 3 + (M <= 1.5)).
# tests/cpu/test_nibble_tables.py replays block_scale over every e4m3 amax and input byte, and shows each bound tight.
F16_EXPONENT_PATH_CARRY, F16_EXPONENT_PATH_F = pow2_scale_carry(FORMATS['e2m1'][0])  # 2^22 - 1, 2
F16_EXPONENT_PATH_INPUTS = (1, 254)
F16_EXPONENT_PATH_BYTES = (2, 252)

# The ratio path's thresholds on r = amax_q * factor - 6 and its nudge of the factor pair (derived in
# e4m3_to_e2m1_f16.cuh; tests/cpu/test_requant_f16_e2m1.py replays the path with them).
RATIO_UP = 6 * 2.0**-24 * 0.875
RATIO_DOWN = 6 * 2.0**-24 * 0.625
RATIO_NUDGE = 3 * 2.0**-11


def _float32_bits(value: float) -> int:
    return struct.unpack('<I', struct.pack('<f', value))[0]


# The amax (float32 bits, unsigned) the ratio path takes: [the e2m1 floor, +infinity), normal and finite.
RATIO_AMAX_BITS = (_float32_bits(FORMATS['e2m1'][1]), 0x7F800000)

E4M3_TO_E2M1_F16_PRELUDE = prelude(
    'e4m3_to_e2m1_f16.cuh',
    TK_RATIO_UP_BITS=hex(_float32_bits(RATIO_UP)) + 'u',
    TK_RATIO_DOWN_BITS=hex(_float32_bits(RATIO_DOWN)) + 'u',
    TK_RATIO_DOUBLE_UP_BITS=hex(_float32_bits(2 * (1 + RATIO_NUDGE))) + 'u',
    TK_RATIO_DOUBLE_DOWN_BITS=hex(_float32_bits(2 * (1 - RATIO_NUDGE))) + 'u',
)
E4M3_PAIR_TO_F16X2 = ('tk_e4m3x2_lo_to_f16x2', 'tk_e4m3x2_hi_to_f16x2')  # of a word's bytes 0-1, 2-3


def sixteen_in_a_register(tid, round_sf):
    """16, in a form no compiler can fold (round_sf >> 31 is 0, but nothing proves it): with a literal 16 ptxas makes the
    pairing multiply-add of tk_e2m1_word_of_sums a LEA, on the integer pipe."""
    return let('sixteen', 'uint32', T.uint32(16) | (T.Cast('uint32', tid) & T.Cast('uint32', round_sf >> 31)), lambda v: v)


def f16_exact_factor(factor, chunk_amax):
    """Whether e4m3 -> e2m1 may take the f16 lanes under `factor` (e4m3_to_e2m1_f16.cuh): a power of two whose double
    is in f16's normal range, no NaN in the chunk, and every product within 6."""
    return T.And(power_of_two_between(factor, -13, 14), T.And(chunk_amax * factor <= T.float32(6), T.Not(T.isnan(chunk_amax))))


def f16_lanes_vote(factor, chunk_amax, active):
    """Whether every active lane of the warp may take the f16 lanes (f16_exact_factor), so that a warp takes one path."""
    return T.all_sync(T.Or(T.Not(active), f16_exact_factor(factor, chunk_amax))) != 0


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
    field, at most 28, times 2^10 + 2^26: one multiply-add where shifting and merging take five instructions), and
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
    through the rounding add); else the clamped one, exact for any value. Voted once a chunk: a test per word costs
    a branch and its reconvergence per word, for a clamp that chunks whose own amax sets their scale never need."""
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
def requant_f16_chunk(p: Paths, d: Dims, site: ChunkSite, data, values, amax, sf, multiplier):
    """One chunk of e4m3 input to e2m1: its f16 pairs and amax, its scale factor (from the amax's bits on the exponent
    path), then its codes by the path every active lane of the warp can take, and the stores."""
    words = T.view(data, (CHUNK // 4,), T.uint32)
    halves = T.alloc_local((CHUNK // 2,), T.uint32)  # f16 pairs, which every encoder below reads
    for i, widen in enumerate(E4M3_PAIR_TO_F16X2 * (CHUNK // 4)):  # (a Python loop: a function by index)
        halves[i] = T.call_extern('uint32', widen, words[i // 2])
    chunk_amax = T.alloc_var(T.float32)
    chunk_amax = T.call_extern('float32', 'tk_f16x2_absmax_nan', T.address_of(halves[0]), CHUNK // 2)
    amax[0] = chunk_amax
    if T.isnan(chunk_amax):  # the reference's maximum skips NaNs (no values array: see the float32 path below)
        amax[0] = T.float32(0)
        for e in T.unroll(CHUNK):
            amax[0] = T.max(amax[0], T.abs(T.Cast('float32', data[e])))
    factor = T.alloc_var(T.float32)
    if p.f16_exponent_path:
        # UE8M0 in and out, a block of one chunk: the scale factor's byte is the input's plus amax_shift, and the
        # factor 2^-amax_shift, in integers (F16_EXPONENT_PATH_CARRY); other chunks take block_scale.
        in_exponent = T.alloc_var(T.int32)
        in_exponent = site.scales[site.k]
        amax_shift = T.alloc_var(T.int32)
        amax_shift = (T.Cast('int32', (T.reinterpret(chunk_amax, T.uint32) + T.uint32(F16_EXPONENT_PATH_CARRY)) >> T.uint32(23))
                      - (127 + F16_EXPONENT_PATH_F))
        sf_exponent = T.alloc_var(T.int32)
        sf_exponent = in_exponent + amax_shift
        exact_exponents = T.alloc_var(T.bool)
        exact_exponents = T.And(T.And(site.one_chunk_blocks, chunk_amax > T.float32(0)),
                                T.And(T.And(in_exponent >= F16_EXPONENT_PATH_INPUTS[0], in_exponent <= F16_EXPONENT_PATH_INPUTS[1]),
                                      T.And(sf_exponent >= F16_EXPONENT_PATH_BYTES[0], sf_exponent <= F16_EXPONENT_PATH_BYTES[1])))
        # Voted, so that a warp whose every active chunk is on the path skips the factor's test for the f16 lanes as
        # well, and the shuffles of block_scale's branch stay outside any divergent one.
        warp_exponents = T.alloc_var(T.bool)
        warp_exponents = T.all_sync(T.Or(T.Not(site.active), exact_exponents)) != 0
        if warp_exponents:
            factor = T.reinterpret(T.Cast('uint32', 127 - amax_shift) << T.uint32(23), T.float32)
        else:
            site_chunk_scale_byte(p, site, amax, sf, multiplier, factor, sf_exponent)
    else:
        site_chunk_scale(p, site, amax, sf, multiplier, factor)
    store_chunk_sf(p, d, site, sf_exponent if p.integer_sf else sf[0])

    codes = T.alloc_local((p.out_bytes // 4,), T.uint32)
    factor_exponent = biased_exponent(factor)
    # The f16 lanes take a power of two whose double is in f16's normal range, no NaN in the chunk, and every product
    # within 6, in every active lane of the warp, so that a warp takes one path: without round_sf some chunks still
    # have a power-of-two factor, and a warp holding one would run both paths. The float32 path is exact for any
    # factor.
    if p.packed:  # (packed UE8M0 requires round_sf: its factors are powers of two)
        f16_lanes = T.alloc_var(T.bool)
        if p.f16_exponent_path:  # (a warp on the exponent path has such factors: no test)
            f16_lanes = warp_exponents
            if T.Not(warp_exponents):
                f16_lanes = f16_lanes_vote(factor, chunk_amax, site.active)
        else:
            f16_lanes = f16_lanes_vote(factor, chunk_amax, site.active)
        if f16_lanes:
            encode_pow2_lanes(halves, factor_exponent, codes, site.tid, site.round_sf)
        else:
            encode_f32_chunk(halves, values, factor, codes, chunk_amax, site.active)
    else:
        # Without round_sf (whose factors, s times a power of two, are not 6 / M), a block of one chunk with no NaN,
        # whose amax is normal (at or above the floor) and finite, in every active lane of the warp: the ratio path,
        # for any factor (a power of two too), before the f16 lanes' test. (amax[0] skips a NaN, chunk_amax does not.)
        # With round_sf the warp neither forms nor votes on that test, which in one branch with it slows round_sf's
        # chunks.
        if site.round_sf == 0:
            amax_bits = T.reinterpret(amax[0], T.uint32)
            ratio_chunk = T.And(T.And(site.one_chunk_blocks, T.Not(T.isnan(chunk_amax))),
                                amax_bits - T.uint32(RATIO_AMAX_BITS[0]) < T.uint32(RATIO_AMAX_BITS[1] - RATIO_AMAX_BITS[0]))
            if T.all_sync(T.Or(T.Not(site.active), ratio_chunk)) != 0:
                encode_ratio_lanes(halves, chunk_amax, factor, codes, site.tid, site.round_sf)
            else:
                encode_pow2_or_f32(halves, values, factor, factor_exponent, codes, chunk_amax, site.active, site.tid, site.round_sf)
        else:
            encode_pow2_or_f32(halves, values, factor, factor_exponent, codes, chunk_amax, site.active, site.tid, site.round_sf)
    store_codes(p, site, codes)
