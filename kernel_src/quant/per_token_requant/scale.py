"""per_token_requant: what every path does with a chunk's amax (its block's scale factor and the factor its elements
are multiplied by), and the float32 encoding any path can fall back to."""

from tilelang import language as T

from kernel_src.quant.common import block_scale, e2m1_word, let
from kernel_src.quant.per_token_requant.layout import CHUNK, ChunkSite, Dims, Paths, store_chunk_sf, store_codes

# A float32 is a power of two (2^(e - 127), normal, positive) exactly when its sign and mantissa bits are all zero.
FLOAT32_SIGN_AND_MANTISSA = 0x807FFFFF


def input_scale(p: Paths, scale):
    """The float32 input scale factor of a `scales` element (packed: 2^(byte - 127), its byte's float bits)."""
    return T.reinterpret(T.Cast('uint32', scale) << T.uint32(23), T.float32) if p.in_packed else scale


def power_of_two_between(factor, low: int, high: int):
    """Whether float32 `factor` is 2^k for an integer k in [low, high] (normal and positive: its sign and mantissa
    bits clear)."""
    # (The exponent's range as one unsigned compare, which wraps below 127 + low.)
    return let('factor_bits', 'uint32', T.reinterpret(factor, T.uint32), lambda bits: T.And(
        (bits & T.uint32(FLOAT32_SIGN_AND_MANTISSA)) == T.uint32(0), (bits >> T.uint32(23)) - T.uint32(127 + low) <= T.uint32(high - low)))


def biased_exponent(value):
    """The exponent field of a non-negative float32 (a power-of-two factor's 127 + x)."""
    return T.Cast('int32', T.reinterpret(value, T.uint32) >> T.uint32(23))


@T.macro
def chunk_scale(p: Paths, amax, scale, sf, multiplier, factor: T.Ref, npc_log2, round_sf):
    """sf[0] and multiplier[0] of the chunk's block, and the factor scale * multiplier, amax[0] holding the largest
    |q| of the chunk."""
    amax[0] = amax[0] * scale
    for s in T.unroll(2):  # blocks of 64 or 128 elements span 2 or 4 lanes
        if s < npc_log2 - 5:
            amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
    # The divisions without nvcc's FCHK tests and slow-path branches (kernel_src.quant.common, RCP_DIV_PRELUDE): about
    # 12 instructions a chunk fewer on the float32 scale factors' path without round_sf.
    block_scale(amax[0], T.float32(p.floor), p.fmax, round_sf, p.packed, sf, multiplier, 0, fast_division=True)
    factor = scale * multiplier[0]  # noqa: F841  (a store to the caller's variable, through the T.Ref)


@T.macro
def site_chunk_scale(p: Paths, site: ChunkSite, amax, sf, multiplier, factor: T.Ref):
    """chunk_scale with the input scale, block width and round_sf of the chunk at `site`."""
    chunk_scale(p, amax, input_scale(p, site.scales[site.k]), sf, multiplier, factor, site.npc_log2, site.round_sf)


@T.macro
def site_chunk_scale_byte(p: Paths, site: ChunkSite, amax, sf, multiplier, factor: T.Ref, sf_exponent: T.Ref):
    """site_chunk_scale, and the scale factor's byte in sf_exponent: an integer_sf chunk off its exponent path."""
    site_chunk_scale(p, site, amax, sf, multiplier, factor)
    sf_exponent = T.Cast('int32', sf[0])  # noqa: F841  (a store to the caller's variable, through the T.Ref)


@T.macro
def amax_of_values(data, values, amax):
    """values = the float32 of the e4m3 chunk, amax[0] = their largest magnitude (NaNs skipped)."""
    for e in T.vectorized(CHUNK):
        values[e] = T.Cast('float32', data[e])
    amax[0] = T.float32(0)
    for e in T.unroll(CHUNK):
        amax[0] = T.max(amax[0], T.abs(values[e]))


@T.macro
def encode_word(p: Paths, values, w, codes):
    """The codes of values[8 w .. 8 w + 8): one word of e2m1 codes (built whole, see per_token_cast), or two of
    e4m3 bytes (one two-value conversion per pair)."""
    if p.out_fp4:
        codes[w] = e2m1_word([values[8 * w + e] for e in range(8)])
    else:
        result = T.view(codes, (CHUNK,), T.float8_e4m3fn)
        for e in T.vectorized(8):
            result[8 * w + e] = T.Cast(T.float8_e4m3fn, values[8 * w + e])


@T.macro
def encode_one_by_one(p: Paths, values, factor, codes):
    """codes of values * factor, element by element."""
    for e in T.unroll(CHUNK):
        values[e] = values[e] * factor
    for w in T.unroll(CHUNK // 8):
        encode_word(p, values, w, codes)


@T.macro
def requant_f32_chunk(p: Paths, d: Dims, site: ChunkSite, data, values, amax, sf, multiplier):
    """One chunk of e4m3 input to e4m3, in float32: its values and amax, its scale factor, its codes element by
    element, and the stores."""
    amax_of_values(data, values, amax)
    factor = T.alloc_var(T.float32)
    site_chunk_scale(p, site, amax, sf, multiplier, factor)
    store_chunk_sf(p, d, site, sf[0])

    codes = T.alloc_local((p.out_bytes // 4,), T.uint32)
    encode_one_by_one(p, values, factor, codes)
    store_codes(p, site, codes)
