"""per_token_requant's e4m3 -> e2m1 path in f16 lanes (E4M3_TO_E2M1_F16_PRELUDE) against the reference's
e2m1 rounding, bit for bit.

`e2m1_word_of_f16x2` replays tk_e2m1_word_of_f16x8 one instruction at a time on 32-bit words: f16 lanes
rounded to nearest even (struct's half packing rounds so, subnormals included), the byte permutes, and the
32-bit adds, masks and multiply-highs whose carries must stay inside their bytes. The test feeds it every e4m3
value (NaNs aside: the kernel sends a chunk with a NaN down the float32 path) under every power-of-two factor 2^x,
-13 <= x <= 14, whose products stay within 6: the kernel's condition for this path.
GPU tests compare the kernel itself with the reference.
"""

from __future__ import annotations

import random
import struct
from fractions import Fraction

import pytest
import torch

from tile_kernels_aot.reference.cast import e2m1_codes

MASK32 = 0xFFFFFFFF


def half_value(bits: int) -> float:
    return struct.unpack('<e', struct.pack('<H', bits))[0]


def half_bits(value: float) -> int:
    """The f16 nearest to the exact double `value` (ties to even), as the GPU's .rn f16 arithmetic rounds."""
    return struct.unpack('<H', struct.pack('<e', value))[0]


def lanes(word: int) -> tuple[int, int]:
    return word & 0xFFFF, word >> 16


def pair(low: int, high: int) -> int:
    return low | (high << 16)


def max_xorsign_abs(a: int, b: int) -> int:  # max.xorsign.abs.f16x2 (no NaNs here)
    def lane(x, y):
        magnitude = half_bits(max(abs(half_value(x)), abs(half_value(y))))
        return magnitude | ((x ^ y) & 0x8000)
    return pair(*(lane(x, y) for x, y in zip(lanes(a), lanes(b))))


def fma(a: int, b: int, c: int) -> int:  # fma.rn.f16x2: a * b + c is exact in a double here, then rounded once
    return pair(*(half_bits(half_value(x) * half_value(y) + half_value(z)) for x, y, z in zip(lanes(a), lanes(b), lanes(c))))


def byte_perm(x: int, y: int, selector: int) -> int:
    """PTX prmt.b32: byte i of the result is byte (s & 7) of [x, y] for s = selector nibble i, or (s & 8) that
    byte's sign bit replicated over all eight bits (__byte_perm has only the first form, all the helper uses)."""
    source = (x | (y << 32)).to_bytes(8, 'little')
    out = 0
    for i in range(4):
        s = (selector >> (4 * i)) & 0xF
        byte = source[s & 7]
        if s & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * i)
    return out


def umulhi(a: int, b: int) -> int:
    return (a * b) >> 32


def mul(a: int, b: int) -> int:  # mul.rn.f16x2
    return pair(*(half_bits(half_value(x) * half_value(y)) for x, y in zip(lanes(a), lanes(b))))


def e2m1_word_of_sums(s: list[int], step_mask: int, x1_half: int) -> int:  # tk_e2m1_word_of_sums
    n = []
    for k, high in ((byte_perm(s[0], s[1], 0x6420) & step_mask, byte_perm(s[0], s[1], 0x7531)),
                    (byte_perm(s[2], s[3], 0x6420) & step_mask, byte_perm(s[2], s[3], 0x7531))):
        code = (k + ((umulhi(high, 0x80000000) + x1_half) & 0x06060606)) & MASK32  # mad.hi.u32
        assert all((code >> (8 * b)) & 0xFF <= 7 for b in range(4)), hex(code)
        n.append(code | (umulhi(high, 0x10000000) & 0x08080808))
    return (byte_perm(n[0], n[1], 0x7531) * 16 + byte_perm(n[0], n[1], 0x6420)) & MASK32


def e2m1_word_of_f16x2(h: list[int], t: int, x1_half: int, step_mask: int = 0x07070707) -> int:
    return e2m1_word_of_sums([fma(h[i], 0x18001800, max_xorsign_abs(h[i], t)) for i in range(4)], step_mask, x1_half)


E4M3_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float().tolist()


def kernel_word(codes: list[int], k: int, step_mask: int = 0x07070707) -> int:
    """The word the kernel's helper gives for eight e4m3 bytes under the factor 2^k (f16 pairs as
    tk_e4m3x2_lo_to_f16x2 and tk_e4m3x2_hi_to_f16x2 widen them: element 2i in the low lane of h[i])."""
    h = [pair(half_bits(E4M3_VALUES[codes[2 * i]]), half_bits(E4M3_VALUES[codes[2 * i + 1]])) for i in range(4)]
    threshold = (15 - k) << 10  # 2^-k
    return e2m1_word_of_f16x2(h, pair(threshold, threshold), ((k + 1) & 3) * 0x02020202, step_mask)


def reference_word(codes: list[int], k: int) -> int:
    products = torch.tensor([E4M3_VALUES[c] for c in codes], dtype=torch.float32) * torch.tensor(2.0**k)
    nibbles = e2m1_codes(products).tolist()
    return sum(int(n) << (4 * i) for i, n in enumerate(nibbles))


@pytest.mark.parametrize('k', range(-13, 15))
def test_every_e4m3_value_under_every_power_of_two(k):
    usable = [c for c in range(256) if c & 0x7F != 0x7F and abs(E4M3_VALUES[c]) * 2.0**k <= 6]
    assert usable, 'every factor leaves at least the zeros'
    rng = random.Random(k)
    words = [usable[i:i + 8] for i in range(0, len(usable), 8)]  # each value once, in order
    words += [rng.sample(usable, 8) if len(usable) >= 8 else rng.choices(usable, k=8) for _ in range(64)]
    for codes in words:
        codes = (codes + usable[:8 - len(codes)] * 8)[:8]
        assert kernel_word(codes, k) == reference_word(codes, k), (k, [hex(c) for c in codes])


def test_ties_and_boundaries():
    """Products exactly on the e2m1 values and on each midpoint (0.25, 0.75, ..., 5), both signs, and the
    products of e4m3's smallest values (subnormal in f16 under the smallest factors, where they must round
    to a signed zero)."""
    for k in range(-13, 15):
        exact = [c for c in range(256) if c & 0x7F != 0x7F and abs(E4M3_VALUES[c]) * 2.0**k in
                 (0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6)]
        smallest = [c for c in (0x01, 0x81, 0x02, 0x82, 0x08, 0x88) if abs(E4M3_VALUES[c]) * 2.0**k <= 6]
        pool = exact + smallest + [0x00, 0x80]
        for i in range(0, len(pool), 8):
            codes = (pool[i:i + 8] + [0x00, 0x80] * 4)[:8]
            assert kernel_word(codes, k) == reference_word(codes, k), (k, [hex(c) for c in codes])


def test_needs_the_mask_of_the_steps():
    """The sum carries the lowest mantissa bit of max(|h|, 2^-x) into bit 7 of its low byte: unmasked, a code byte
    passes 7 (the replay's check), and the pairing would spill it into the neighbouring code's sign."""
    codes = [0x39, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00]  # 1.125 (mantissa bit 0 set) under 2^0
    assert kernel_word(codes, 0) == reference_word(codes, 0)
    with pytest.raises(AssertionError, match='0x'):
        kernel_word(codes, 0, step_mask=MASK32)


def test_exponent_offset_never_reaches_the_sign():
    """Under 2^-14 the unscaled sum s / 2^(x+1) sits in f16's binade of 2^14, whose exponent field (29) plus (x + 1) & 3
    (3) passes 31. Added to the high bytes as they are, that carry would reach the sign bit, which is why the kernel keeps
    such factors off this path (power_of_two_between(factor, -13, 14)). The multiply-high-add adds it to the bytes shifted
    down one, so the carry lands in a bit the mask drops and the sign is read from the bytes as they are: the replay
    holds there too, and the kernel's bound is a margin."""
    codes = [0x38, 0x40, 0x48, 0x50, 0x00, 0x30, 0x7E, 0x01]  # positive values, all below 2^-5 once scaled
    assert kernel_word(codes, -14) == reference_word(codes, -14) == 0
    negated = [c | 0x80 for c in codes]
    assert kernel_word(negated, -14) == reference_word(negated, -14) == 0x88888888


def float32(value: float) -> float:
    """The float32 nearest the exact double `value` (ties to even), as one rounded float32 operation gives."""
    return struct.unpack('<f', struct.pack('<f', value))[0]


def ratio_factor_pair(amax_q: float, factor: float, nudge: float | None = None) -> int:
    """tk_ratio_factor_f16x2: r = fma(amax_q, factor, -6) (the product of a 4- and a 24-bit significand is exact in a
    double), the doubled factor nudged as r falls, rounded to f16 in both lanes."""
    from kernel_src.quant.per_token_requant import RATIO_DOWN, RATIO_NUDGE, RATIO_UP
    nudge = RATIO_NUDGE if nudge is None else nudge
    r = float32(amax_q * factor - 6)
    doubled = 2 * (1 + nudge) if r > RATIO_UP else 2 * (1 - nudge) if r < -RATIO_DOWN else 2.0
    g = half_bits(float32(factor * float32(doubled)))
    return pair(g, g)


def ratio_word(codes: list[int], g: int, binade_mask: int = 0xFC00FC00) -> int:
    """tk_e2m1_word_of_f16x8_ratio on eight e4m3 bytes (f16 pairs as the kernel widens them)."""
    h = [pair(half_bits(E4M3_VALUES[codes[2 * i]]), half_bits(E4M3_VALUES[codes[2 * i + 1]])) for i in range(4)]
    sums = []
    for i in range(4):
        p = mul(h[i], g)
        sums.append(fma(p, 0x18001800, max_xorsign_abs(p, 0x40004000) & binade_mask))
    return e2m1_word_of_sums(sums, MASK32, 0)


def factors_near(amax_q: float, reach: int):
    """Every float32 F within reach * 2^-24 (relative) of 6 / amax_q: the kernel's factor s * RN(6 / RN(amax_q s)) is
    within 3 * 2^-24 of it for every input scale s that keeps the block's amax normal and finite."""
    centre = struct.unpack('<I', struct.pack('<f', 6 / amax_q))[0]
    for bits in range(centre - 4 * reach, centre + 4 * reach + 1):
        factor = struct.unpack('<f', struct.pack('<I', bits))[0]
        if abs(Fraction(amax_q) * Fraction(factor) / 6 - 1) <= Fraction(reach, 2**24):
            yield factor


def ratio_mismatches(reach: int, **replay) -> list:
    """The (largest value, F, bytes) whose ratio-path words differ from the reference's codes of RN32(q F), over every
    positive e4m3 largest value M, every F near 6 / M and every e4m3 byte of magnitude up to M (both signs, eight a word)."""
    nudge = replay.pop('nudge', None)
    found = []
    for largest in range(1, 0x7F):
        amax_q = E4M3_VALUES[largest]
        usable = [c for c in range(256) if (c & 0x7F) <= largest]
        words = [(usable[i:i + 8] + usable[:8])[:8] for i in range(0, len(usable), 8)]
        for factor in factors_near(amax_q, reach):
            g = ratio_factor_pair(amax_q, factor, nudge)
            for codes in words:
                products = torch.tensor([E4M3_VALUES[c] for c in codes], dtype=torch.float32) * torch.tensor(factor, dtype=torch.float32)
                expected = sum(int(n) << (4 * i) for i, n in enumerate(e2m1_codes(products).tolist()))
                try:
                    word = ratio_word(codes, g, **replay)
                except AssertionError:  # a code byte past 7 (e2m1_word_of_sums)
                    word = None
                if word != expected:
                    found.append((amax_q, factor, codes))
    return found


def test_ratio_path_over_every_e4m3_pair():
    """Without round_sf (the ratio path of kernel_src.quant.per_token_requant): every e4m3 byte under every largest value
    of its chunk and every factor the kernel can form from them, bit for bit against the reference's rounding of the
    float32 product, ties included (three or more a largest value, which the factor decides)."""
    assert ratio_mismatches(4) == []


def test_ratio_path_needs_its_nudges_and_its_mask():
    """The replay can fail: without the nudges (the doubled factor always 2), ties that the reference's factor sends
    up or down land on their midpoint and go to the even code; without the binade mask the product's own mantissa moves
    the rounding sum's last bit, and with it which way a tie goes."""
    assert ratio_mismatches(1, nudge=0.0)
    assert ratio_mismatches(1, binade_mask=MASK32)
