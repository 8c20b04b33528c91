"""What the quantisation kernels share: formats, scale-factor layouts, and the bit-level helpers.

The helpers build plain TIR expressions (not macros), so a kernel calls them anywhere, with its own
values, and the lowered code is what it would be had the kernel written them inline.
"""

from tilelang import language as T

IN_DTYPES = {'bfloat16': 2, 'float32': 4}  # input dtypes of the casts: bytes per element
FORMATS = {'e4m3': (448.0, 1e-4), 'e2m1': (6.0, 6.0 * 2.0**-126)}  # (max, amax floor)
SF_FORMATS = ('f32', 'ue8m0')  # float32 scale factors (row- or column-major), or packed UE8M0 bytes
MODE_CAST, MODE_SF_ONLY, MODE_PRECOMPUTED = 0, 1, 2  # the run-time `mode` of the casts: data and sf, sf only, given sf

# e2m1 round-to-nearest-even with saturation, as thresholds on |v|: code = number of thresholds passed,
# with `>` where the tie goes down to the even code and `>=` where it goes up to it
# (codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6).
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_code(v):
    """The 4-bit e2m1 code of float32 v as an int32 (sign in bit 3), bit-exact with the reference's RTNE."""
    a = T.abs(v)
    code = T.Cast('int32', T.reinterpret(v, T.uint32) >> T.uint32(31)) * 8
    for threshold, inclusive in E2M1_THRESHOLDS:
        code = code + T.Cast('int32', (a >= T.float32(threshold)) if inclusive else (a > T.float32(threshold)))
    return code


def e2m1_value(code):
    """float32 of a 4-bit e2m1 code (an int32 in 0..15), exactly: magnitude codes 2..7 are the float32 with
    exponent 126 + code // 2 and top mantissa bit code % 2, code 1 is 0.5, bit 3 is the sign (-0.0 kept)."""
    magnitude = code & 7
    bits = T.if_then_else(
        magnitude >= 2,
        T.Cast('uint32', ((magnitude >> 1) + 126) << 23 | (magnitude & 1) << 22),
        T.Cast('uint32', T.if_then_else(magnitude == 1, 0x3F000000, 0)),
    )
    return T.reinterpret(bits | (T.Cast('uint32', code & 8) << T.uint32(28)), T.float32)


def ceil_pow2_exponent(sf):
    """The biased exponent (uint32) of the power of two at or above a positive normal float32 sf:
    (bits - 1) >> 23, plus one. It is round_sf's scale factor and, as a byte, its UE8M0 code."""
    return ((T.reinterpret(sf, T.uint32) - T.uint32(1)) >> T.uint32(23)) + T.uint32(1)


def pow2(exponent):
    """2^(exponent - 127) as float32, for a biased exponent in 1..254."""
    return T.reinterpret(exponent << T.uint32(23), T.float32)


def inverse_pow2(exponent):
    """2^(127 - exponent) as float32, exactly 1 / pow2(exponent), for a biased exponent in 1..253."""
    return T.reinterpret((T.uint32(254) - exponent) << T.uint32(23), T.float32)


@T.macro
def block_scale(amax, sf_floor, fmax, round_sf, packed, sf, multiplier, j):
    """sf[j] and multiplier[j] of a block of that amax: clamped = max(amax, sf_floor), sf = clamped / fmax and
    multiplier = fmax / clamped (two divisions, as upstream); with round_sf, or packed (UE8M0 holds powers
    of two only, so the ops require round_sf), the power of two at or above sf and its exact inverse, and
    packed sf[j] is that power's exponent byte as a float.

    A kernel scalar passed to a macro takes the name of the macro's parameter in the lowered kernel: pass
    the floor scalar as `sf_floor` and round_sf as `round_sf`, the names the ops bind."""
    clamped = T.max(amax, sf_floor)
    sf_f = T.alloc_var(T.float32)
    sf_f = clamped / T.float32(fmax)
    if packed or round_sf != 0:
        exponent = ceil_pow2_exponent(sf_f)
        multiplier[j] = inverse_pow2(exponent)
        if packed:
            sf[j] = T.Cast(T.float32, exponent)
        else:
            sf[j] = pow2(exponent)
    else:
        multiplier[j] = T.float32(fmax) / clamped
        sf[j] = sf_f
