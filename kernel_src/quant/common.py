"""What the quantisation kernels share: formats, scale-factor layouts, and the bit-level helpers.

The helpers build plain TIR expressions (not macros), so a kernel calls them anywhere, with its own
values, and the lowered code is what it would be had the kernel written them inline.
"""

import math

from tilelang import language as T
from tvm import tirx  # after tilelang, which puts its bundled tvm on the path

from kernel_src.cuda import prelude

IN_DTYPES = {'bfloat16': 2, 'float32': 4}  # input dtypes of the casts: bytes per element
FORMATS = {'e4m3': (448.0, 1e-4), 'e2m1': (6.0, 6.0 * 2.0**-126)}  # (max, amax floor)
SF_FORMATS = ('f32', 'ue8m0')  # float32 scale factors (row- or column-major), or packed UE8M0 bytes
MODE_CAST, MODE_SF_ONLY, MODE_PRECOMPUTED = 0, 1, 2  # the run-time `mode` of the casts: data and sf, sf only, given sf

# e2m1 by one rounding add instead of seven compares: a = |v| clamped at 6 (a NaN stays NaN), m = 2^e the
# power of two at or below max(a, 1) (e = 0, 1, 2), and s = a * 2^-22 + m. One unit in the last place of s,
# 2^(e-23), is a * 2^-22 moving by 2^(e-1): the e2m1 step of a's binade (0.5 below 2, then 1, then 2). So the
# float add itself rounds a to nearest even onto the e2m1 grid (m's mantissa is zero, so ties go to an even
# k) and s's mantissa is k = round(a / 2^(e-1)), 0..4; the magnitude code is k + 2e (codes 0..7 are 0, 0.5,
# 1, 1.5, 2, 3, 4, 6). s's exponent holds e, so both come out of s's bits by one multiply-add (see
# e2m1_top_nibble). A NaN a makes s NaN, and the GPU's float32 arithmetic returns every NaN as the canonical
# 0x7FFFFFFF, whose bits the same multiply-add turns into magnitude code 0: the code the reference's compares
# give a NaN (tests/gpu feed NaNs of both signs and several payloads through the casts). a * 2^-22 is exact
# (but far below any tie), so an FFMA and a separate multiply and add round alike; with flush-to-zero a
# subnormal a becomes 0, code 0 as well.
E2M1_CLAMP = 6.0  # the largest e2m1 magnitude; every |v| above 5 has code 7
# The clamp matters only from 7 up: below it the rounding add gives k <= 3 in the binade of 4 (code 7, 6.0) by
# itself, and a NaN still gives code 0. A cast's products q * m, |q| <= amax, lie within RN(amax * m) (rounding is
# monotone), so a kernel that finds |amax * m| below this bound for all of its values may encode them unclamped.
# In a plain cast it holds for every finite amax (amax * RN(6 / amax) <= 6 (1 + 2^-23)); a NaN or infinite amax or
# factor fails the test and keeps the clamp, as may a given scale factor (mode 2).
E2M1_UNCLAMPED_BOUND = 7.0
E2M1_ROUNDING_SCALE = 2.0**-22  # a * this, added to 2^e, lands a's e2m1 step on the last mantissa bit
FLOAT32_EXPONENT_MASK = 0x7F800000
FLOAT32_SIGN_BIT = 0x80000000
# bits(s) * (2^28 + 2^6): the 2^28 term moves k (s's low mantissa bits) to bits 28..31, the 2^6 term moves
# s's biased exponent 127 + e to bit 29 up, i.e. adds 2 * (127 + e) = 14 + 2e (mod 16) to the top nibble;
# the offset's 2 in the top nibble cancels the 14 (mod 16), leaving the magnitude code 0..7, and the sign
# bit of v goes in at bit 31.
# Bits below 28 hold at most k * 2^6, so nothing carries into the top nibble.
E2M1_TOP_NIBBLE_MULTIPLIER = (1 << 28) + (1 << 6)
E2M1_TOP_NIBBLE_OFFSET = 0x20000000


def let(name, dtype, value, body):
    """body(x) with x bound once to value (a TIR Let: one local in the lowered code, not value pasted at
    each use of x, which nvcc then fails to fold back into one instruction)."""
    var = tirx.Var(name, dtype)
    return tirx.Let(var, value, body(var))


def e2m1_top_nibble(v, clamp=True):
    """uint32 whose top 4 bits are the e2m1 code of float32 v (RTNE, saturated at 6, sign of v in bit 31;
    NaN gives the code of a signed zero), bit-exact with the reference's compares; the 28 bits below are
    not zero. Six instructions: FMNMX.NAN, FMNMX, LOP3, FFMA, IMAD, LOP3.

    clamp=False, for a caller that has shown |v| < 7 or NaN (see E2M1_UNCLAMPED_BOUND), leaves out the
    FMNMX.NAN: an integer-pipe instruction an element, where that pipe bounds the e2m1 casts."""
    # `a > 6 ? 6 : a` keeps a NaN (nvcc emits FMNMX.NAN), where min(a, 6) would give 6 and the code 7.
    clamped = lambda a: T.if_then_else(a > T.float32(E2M1_CLAMP), T.float32(E2M1_CLAMP), a)

    def magnitude_top_nibble(a):
        binade = T.reinterpret(T.max(a, T.float32(1)), T.uint32) & T.uint32(FLOAT32_EXPONENT_MASK)
        rounded = a * T.float32(E2M1_ROUNDING_SCALE) + T.reinterpret(binade, T.float32)
        return T.reinterpret(rounded, T.uint32) * T.uint32(E2M1_TOP_NIBBLE_MULTIPLIER) + T.uint32(E2M1_TOP_NIBBLE_OFFSET)

    magnitude = let('e2m1_abs', 'float32', clamped(T.abs(v)) if clamp else T.abs(v), magnitude_top_nibble)
    # Bit 31 of `magnitude` is 0 (codes 0..7), so v's sign bit is selected in (one LOP3), not added.
    return magnitude | (T.reinterpret(v, T.uint32) & T.uint32(FLOAT32_SIGN_BIT))


# e2m1_top_nibble with the sign carried through the rounding add instead of selected in after it, for values a caller
# has shown finite and below E2M1_UNCLAMPED_BOUND: m = max(|v|, 1) with v's sign (PTX max.xorsign.abs, one FMNMX.XORSIGN),
# of which the sign and exponent are kept; s = v * 2^-22 + m rounds |v| as the unsigned add does (round-to-nearest-even is
# symmetric) and has v's sign; and an odd multiplier takes that sign bit to bit 31 of the product. bits(s) * (2^28 + 2^6 + 1)
# adds to the top nibble k + 2 E (E = 127, 128, 129, s's biased exponent) as E2M1_TOP_NIBBLE_MULTIPLIER does, plus bits(s)
# itself: the sign at bit 31, and E at bit 23, i.e. E >> 5 (3, 4, 4) into the top nibble and (E & 31) << 23 (31, 0, 1) below
# it, which the offset's 2^23 carries into the top nibble for E = 127 alone; the offset's top nibble, 14, then leaves
# k + 2 (E - 127) and 8 for the sign. One integer-pipe instruction an element fewer than clamp=False (the sign's LOP3). A NaN
# would give code 5, and |v| >= 7 a wrong code, hence the caller's test. tests/cpu/test_e2m1_code.py replays it.
E2M1_SIGNED_MULTIPLIER = (1 << 28) + (1 << 6) + 1
E2M1_SIGNED_OFFSET = 0xE0800000
FLOAT32_SIGN_AND_EXPONENT = FLOAT32_SIGN_BIT | FLOAT32_EXPONENT_MASK
E2M1_SIGNED_PRELUDE = prelude('e2m1_signed.cuh')  # tk_max_xorsign_abs


def e2m1_finite_top_nibble(v):
    """uint32 whose top 4 bits are the e2m1 code of float32 v, sign included, for a v the caller has shown finite with
    |v| < E2M1_UNCLAMPED_BOUND (see E2M1_SIGNED_MULTIPLIER; needs E2M1_SIGNED_PRELUDE). Five instructions with the
    packing shift: FMNMX.XORSIGN, LOP3, FFMA, IMAD."""
    def signed_top_nibble(x):
        binade = T.reinterpret(T.call_extern('float32', 'tk_max_xorsign_abs', x, T.float32(1)), T.uint32) & T.uint32(FLOAT32_SIGN_AND_EXPONENT)
        rounded = x * T.float32(E2M1_ROUNDING_SCALE) + T.reinterpret(binade, T.float32)
        return T.reinterpret(rounded, T.uint32) * T.uint32(E2M1_SIGNED_MULTIPLIER) + T.uint32(E2M1_SIGNED_OFFSET)

    return let('e2m1_value', 'float32', v, signed_top_nibble)


def e2m1_saturated(v):
    """float32 v clamped to [-6, 6], a NaN kept: what e2m1_top_nibble's clamp does to |v|, sign kept, so that
    e2m1_top_nibble(e2m1_saturated(v), clamp=False) is e2m1_top_nibble(v). For the rare values past
    E2M1_UNCLAMPED_BOUND, clamped once where a kernel's common path encodes unclamped."""
    return let('e2m1_product', 'float32', v, lambda p: T.if_then_else(
        p > T.float32(E2M1_CLAMP), T.float32(E2M1_CLAMP), T.if_then_else(p < T.float32(-E2M1_CLAMP), T.float32(-E2M1_CLAMP), p)))


def products_bounded(amaxes, multipliers):
    """Whether every |amaxes[j] * multipliers[j]| is below E2M1_UNCLAMPED_BOUND (false for a NaN): the test under
    which a cast may encode its products with e2m1_top_nibble(clamp=False)."""
    tests = [T.abs(a * m) < T.float32(E2M1_UNCLAMPED_BOUND) for a, m in zip(amaxes, multipliers)]
    bounded = tests[0]
    for test in tests[1:]:
        bounded = T.And(bounded, test)
    return bounded


def e2m1_code(v):
    """The 4-bit e2m1 code of float32 v as an int32 (sign in bit 3), bit-exact with the reference's RTNE."""
    return T.Cast('int32', e2m1_top_nibble(v) >> T.uint32(28))


def e2m1_word(values, clamp=True, finite=False):
    """uint32 of the e2m1 codes of up to eight float32 values, values[i] in nibble i (so, as bytes, two codes
    per byte with the even one in the low nibble): one funnel shift (SHF.L.U32.HI) per code on top of
    e2m1_top_nibble, pushing the last value first. clamp: as e2m1_top_nibble's; finite=True, for values shown
    finite and below E2M1_UNCLAMPED_BOUND, takes e2m1_finite_top_nibble instead."""
    top_nibble = e2m1_finite_top_nibble if finite else lambda v: e2m1_top_nibble(v, clamp)
    word = top_nibble(values[-1]) >> T.uint32(28)
    for v in reversed(values[:-1]):
        word = (word << T.uint32(4)) | (top_nibble(v) >> T.uint32(28))
    return word


def e2m1_vector_codes(values, clamp=True):
    """The e2m1 codes of a vector's float32 values (up to 16; as e2m1_word, value i in nibble i) as one unsigned word of
    4 bits a value (uint16, uint32 or uint64), which a cast stores as bytes: a vector of 16 takes two words of eight."""
    code_word = f'uint{4 * len(values)}'
    if len(values) <= 8:
        return T.Cast(code_word, e2m1_word(values, clamp))
    return T.Cast(code_word, e2m1_word(values[:8], clamp)) | (T.Cast(code_word, e2m1_word(values[8:], clamp)) << T.Cast(code_word, 32))


def pow2_scale_carry(fmax: float) -> tuple[int, int]:
    """(carry, f) of pow2_scale_exponent for fmax = F * 2^f, F in (1, 2): carry = 2^23 - 1 - F's mantissa bits."""
    fraction, exponent = math.frexp(fmax)  # fmax = fraction * 2^exponent, fraction in [1/2, 1)
    significand, f = 2 * fraction, exponent - 1
    mantissa = (significand - 1) * 2**23
    assert 1 < significand < 2 and mantissa == int(mantissa), f'{fmax}: needs a significand in (1, 2) of 23 bits'
    return (1 << 23) - 1 - int(mantissa), f


def pow2_scale_exponent(clamped, fmax: float):
    """The biased exponent (uint32) of the power of two at or above the float32 quotient clamped / fmax, for a
    positive clamped, without the division (round_sf's scale factor, and the UE8M0 byte). With fmax = F * 2^f (F in (1, 2)) and clamped = M * 2^E (M in [1, 2)), the quotient is
    (M / F) * 2^(E - f) with M / F in (1/2, 2): the power of two at or above it is 2^(E - f) where M <= F, else
    2^(E - f + 1). The float32 quotient gives the same: rounding keeps a quotient at or below 2^(E - f) there
    (a power of two is representable), and the smallest M above F, F + 2^-23, puts it 2^-23 / F above, more
    than half an ulp. M > F is one add: clamped's bits plus 2^23 - 1 - (F's mantissa bits) carry into the
    exponent field exactly then. A quotient below the normal range (clamped < fmax * 2^-126) has exponent 1,
    as rounding the subnormal quotient up gives (the casts' floors keep the quotient normal; a
    quotient that underflowed to zero would give no power of two at all); an infinite clamped keeps 255, as inf / fmax.
    tests/cpu/test_pow2_scale.py checks it against the division over every mantissa."""
    carry, f = pow2_scale_carry(fmax)
    bits = T.reinterpret(clamped, T.int32)
    exponent = T.max(((bits + carry) >> 23) - f, 1)
    return T.Cast(T.uint32, T.if_then_else(bits >= FLOAT32_EXPONENT_MASK, 255, exponent))


def pow2(exponent):
    """2^(exponent - 127) as float32, for a biased exponent in 1..254."""
    return T.reinterpret(exponent << T.uint32(23), T.float32)


def inverse_pow2(exponent):
    """2^(127 - exponent) as float32, exactly 1 / pow2(exponent), for a biased exponent in 1..253."""
    return T.reinterpret((T.uint32(254) - exponent) << T.uint32(23), T.float32)


# block_scale's two divisions without nvcc's FCHK operand test and the branch to its slow path (fast_division=True):
# clamped / fmax and fmax / clamped each as q0 = RN(a y), q = RN(q0 - y RN(b q0 - a)) (Markstein's correction) from
# y = RN(1 / b): for b = fmax the float32 nearest 1 / fmax (SCALE_RECIPROCALS), for b = clamped tk_rcp_rn_fast, which
# is nvcc's own fast path of rcp.rn.f32 and so RN(1 / b) for every exponent field in [1, 252] (see
# kernel_src.quant.swiglu, whose backward uses the same two functions). With y exact, q is RN(a / b):
# tests/cpu/test_scale_division.py replays both divisions, each step rounded once, over every float32 significand of
# the variable operand, for fmax 6 and 448. The sequence is used for clamped in [floor, SCALE_DIVISION_MAX], where
# reciprocal, quotients and residuals stay far from overflow and both results are normal floats (near e2m1's floor
# 6 * 2^-126 the residual of clamped / 6 is subnormal, but a multiple of 2^-148, so still exact); a larger or
# infinite clamped takes IEEE `/`.
RCP_DIV_PRELUDE = prelude('rcp_div.cuh')  # tk_rcp_rn_fast, tk_div_rn_fast_by
SCALE_DIVISION_MAX = 2.0**100
# The float32 nearest 1 / fmax, as its bits (a literal in the CUDA source could be printed short).
SCALE_RECIPROCALS = {448.0: 0x3B124925, 6.0: 0x3E2AAAAB}


@T.macro
def block_scale(amax, sf_floor, fmax, round_sf, packed, sf, multiplier, j, fast_division=False):
    """sf[j] and multiplier[j] of a block of that amax: clamped = max(amax, sf_floor), sf = clamped / fmax and
    multiplier = fmax / clamped (two divisions, as upstream); with round_sf, or packed (UE8M0 holds powers
    of two only, so the ops require round_sf), the power of two at or above sf and its exact inverse, and
    packed sf[j] is that power's exponent byte as a float. fast_division: the divisions by RCP_DIV_PRELUDE's
    sequence, which the kernel's prelude must then hold.

    A kernel scalar passed to a macro takes the name of the macro's parameter in the lowered kernel: pass
    the floor scalar as `sf_floor` and round_sf as `round_sf`, the names the ops bind."""
    clamped = T.max(amax, sf_floor)
    if packed or round_sf != 0:
        # The power of two from clamped's bits (pow2_scale_exponent): the same exponent as rounding up
        # clamped / fmax, without the division's ~10 instructions and slow-path branch.
        exponent = pow2_scale_exponent(clamped, fmax)
        multiplier[j] = inverse_pow2(exponent)
        if packed:
            sf[j] = T.Cast(T.float32, exponent)
        else:
            sf[j] = pow2(exponent)
    elif fast_division and clamped <= T.float32(SCALE_DIVISION_MAX):
        multiplier[j] = T.call_extern('float32', 'tk_div_rn_fast_by', T.float32(fmax), clamped,
                                      T.call_extern('float32', 'tk_rcp_rn_fast', clamped))
        sf[j] = T.call_extern('float32', 'tk_div_rn_fast_by', clamped, T.float32(fmax),
                              T.reinterpret(T.uint32(SCALE_RECIPROCALS[fmax]), T.float32))
    else:
        multiplier[j] = T.float32(fmax) / clamped
        sf[j] = clamped / T.float32(fmax)
