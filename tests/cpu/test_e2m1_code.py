"""kernel_src.quant.common.e2m1_code against the reference's e2m1 encoding, bit for bit.

The kernels' e2m1 rounding is a float add whose round-to-nearest-even lands on the e2m1 grid (see the
comment above E2M1_CLAMP in kernel_src/quant/common.py). `emulated_e2m1_codes` replays that exact
instruction sequence on the CPU; this test runs it over the inputs where a slip would show (every bit
pattern near each threshold, each tie, each e2m1 value, every exponent, subnormals, +-0, +-inf, NaNs) and
benchmarks/e2m1_exhaustive.py over all 2^32 float32 bit patterns.
"""

from __future__ import annotations

import pytest
import torch

from kernel_src.quant import common
from tile_kernels_aot.reference.cast import E2M1_THRESHOLDS, E2M1_VALUES, e2m1_codes


def emulated_e2m1_codes(bits: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """The codes (int64, sign in bit 3) that e2m1_top_nibble's instructions give for the float32 bit patterns
    `bits` (int32), one step per instruction, in IEEE float32 arithmetic: `a > clamp ? clamp : a` keeps a
    NaN (FMNMX.NAN; left out with clamp=False), fmax drops one (FMNMX). The FFMA is a multiply and an add
    here: a * 2^-22 is exact for a >= 2^-104, and below that both give m, so the one rounding is the FFMA's.
    A NaN result is the GPU's canonical NaN, 0x7FFFFFFF, whatever the payload of a (the CPU keeps payloads,
    so it is set here)."""
    v = bits.view(torch.float32)
    a = v.abs()
    one = torch.ones((), dtype=torch.float32)
    if clamp:
        limit = torch.tensor(common.E2M1_CLAMP, dtype=torch.float32)
        a = torch.where(a > limit, limit, a)
    binade = torch.fmax(a, one).view(torch.int32) & common.FLOAT32_EXPONENT_MASK
    rounded = a * common.E2M1_ROUNDING_SCALE + binade.view(torch.float32)
    rounded_bits = torch.where(rounded.isnan(), torch.tensor(0x7FFFFFFF, dtype=torch.int32), rounded.view(torch.int32))
    magnitude = (rounded_bits.long() * common.E2M1_TOP_NIBBLE_MULTIPLIER + common.E2M1_TOP_NIBBLE_OFFSET) & 0xFFFFFFFF
    if clamp:  # (unclamped, a magnitude from 7 up runs into it; the tests below compare the codes)
        assert not (magnitude & common.FLOAT32_SIGN_BIT).any()  # the sign bit is free for v's
    return (magnitude | (bits.long() & common.FLOAT32_SIGN_BIT)) >> 28


def emulated_finite_e2m1_codes(bits: torch.Tensor) -> torch.Tensor:
    """The codes (int64, sign in bit 3) that e2m1_finite_top_nibble's instructions give for the float32 bit patterns
    `bits` (int32), for finite values below E2M1_UNCLAMPED_BOUND: max.xorsign.abs(v, 1) is max(|v|, 1) with v's sign;
    the FFMA as a multiply and an add, as in emulated_e2m1_codes."""
    v = bits.view(torch.float32)
    assert v.isfinite().all()
    signed_binade = torch.copysign(torch.fmax(v.abs(), torch.ones((), dtype=torch.float32)), v)
    binade = signed_binade.view(torch.int32) & torch.tensor(common.FLOAT32_SIGN_AND_EXPONENT).to(torch.int32)
    rounded = v * common.E2M1_ROUNDING_SCALE + binade.view(torch.float32)
    return ((rounded.view(torch.int32).long() * common.E2M1_SIGNED_MULTIPLIER + common.E2M1_SIGNED_OFFSET) & 0xFFFFFFFF) >> 28


def reference_e2m1_codes(bits: torch.Tensor) -> torch.Tensor:
    return e2m1_codes(bits.view(torch.float32)).long()


def _bits(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).view(torch.int32)


def representative_bits() -> torch.Tensor:
    """Bit patterns (int32) of both signs: every pattern within 2^12 units in the last place of each
    threshold, each e2m1 value and each power of two from 2^-8 to 2^4 (ties and the binade edges); 64
    mantissas of every exponent; subnormals; +-0, +-inf and NaNs; 2^20 random patterns."""
    centres = [t for t, _ in E2M1_THRESHOLDS] + list(E2M1_VALUES[1:]) + [2.0**e for e in range(-8, 5)] + [7.0, 8.0]
    near = (_bits(centres).long()[:, None] + torch.arange(-(2**12), 2**12 + 1)[None, :]).flatten()
    mantissas = torch.cat([torch.arange(8), (1 << 22) + torch.arange(-4, 4), (1 << 23) - 1 - torch.arange(8),
                           torch.randint(0, 1 << 23, (40,), generator=torch.Generator().manual_seed(1))])
    every_exponent = ((torch.arange(256)[:, None] << 23) | mantissas[None, :]).flatten()
    specials = torch.tensor([0, 1, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF, 0x7FA00000])
    positive = torch.cat([near, every_exponent, specials]).to(torch.int32)
    randoms = torch.randint(-(2**31), 2**31, (2**20,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    return torch.cat([positive, positive | torch.iinfo(torch.int32).min, randoms]).unique()


def test_thresholds_are_where_the_reference_puts_them():
    """The representative set really straddles each threshold: its codes take all 16 values."""
    codes = reference_e2m1_codes(representative_bits())
    assert sorted(codes.unique().tolist()) == list(range(16))


def test_emulated_codes_match_the_reference():
    bits = representative_bits()
    got, want = emulated_e2m1_codes(bits), reference_e2m1_codes(bits)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(hex(int(bits[i]) & 0xFFFFFFFF), float(bits[i:i + 1].view(torch.float32)), int(got[i]), int(want[i])) for i in bad[:10]]


def test_ties_round_to_even():
    """The RTNE cases spelled out: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
    5 -> 4, above 5 -> 6, NaN -> 0 with its sign, -0 -> the negative zero code."""
    values = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.0001, 1e30, float('inf'), -0.0, -0.25, -6.0])
    codes = emulated_e2m1_codes(values.view(torch.int32)).tolist()
    assert codes == [0, 2, 2, 4, 4, 6, 6, 7, 7, 7, 8, 8, 15]
    nans = torch.tensor([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF]).to(torch.int32)
    assert emulated_e2m1_codes(nans).tolist() == [0, 8, 0, 8]


def test_unclamped_codes_match_the_reference_below_the_bound():
    """e2m1_top_nibble(clamp=False), which the casts use where every |product| is below E2M1_UNCLAMPED_BOUND:
    the same codes as the reference for every representative pattern below the bound and every NaN."""
    bits = representative_bits()
    v = bits.view(torch.float32)
    bits = bits[(v.abs() < common.E2M1_UNCLAMPED_BOUND) | v.isnan()]
    got, want = emulated_e2m1_codes(bits, clamp=False), reference_e2m1_codes(bits)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(hex(int(bits[i]) & 0xFFFFFFFF), int(got[i]), int(want[i])) for i in bad[:10]]
    assert (bits.view(torch.float32).abs() > 6.99).any()  # the set reaches the bound


def test_unclamped_codes_need_the_bound():
    """At the bound the unclamped add rounds 7 up to the next binade (code 8: the sign nibble), so the bound is
    where the clamp starts to matter, not a loose guess."""
    seven = torch.tensor([common.E2M1_UNCLAMPED_BOUND], dtype=torch.float32).view(torch.int32)
    assert emulated_e2m1_codes(seven, clamp=False).item() != reference_e2m1_codes(seven).item() == 7


def test_saturated_then_unclamped_is_the_clamped_code():
    """The casts' rare path: products clamped to [-6, 6] beforehand (e2m1_saturated, NaN kept), then encoded
    unclamped, give the reference's codes for every representative pattern, infinities and huge values too."""
    bits = representative_bits()
    v = bits.view(torch.float32)
    six = torch.tensor(common.E2M1_CLAMP, dtype=torch.float32)
    saturated = torch.where(v > six, six, torch.where(v < -six, -six, v))
    got, want = emulated_e2m1_codes(saturated.view(torch.int32), clamp=False), reference_e2m1_codes(bits)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(hex(int(bits[i]) & 0xFFFFFFFF), int(got[i]), int(want[i])) for i in bad[:10]]


def test_finite_codes_match_the_reference_below_the_bound():
    """e2m1_finite_top_nibble, the sign carried through the rounding add: the reference's codes for every finite
    representative pattern below E2M1_UNCLAMPED_BOUND, both signs, subnormals and -0 included."""
    bits = representative_bits()
    v = bits.view(torch.float32)
    bits = bits[v.isfinite() & (v.abs() < common.E2M1_UNCLAMPED_BOUND)]
    got, want = emulated_finite_e2m1_codes(bits), reference_e2m1_codes(bits)
    bad = (got != want).nonzero().flatten()
    assert bad.numel() == 0, [(hex(int(bits[i]) & 0xFFFFFFFF), int(got[i]), int(want[i])) for i in bad[:10]]
    assert sorted(got.unique().tolist()) == list(range(16))


def test_finite_codes_need_the_bound_and_no_nan():
    """What the caller's test excludes is really wrong here: 7 and above, and a NaN (the GPU's canonical one)."""
    seven = torch.tensor([common.E2M1_UNCLAMPED_BOUND, -common.E2M1_UNCLAMPED_BOUND], dtype=torch.float32).view(torch.int32)
    assert emulated_finite_e2m1_codes(seven).tolist() != reference_e2m1_codes(seven).tolist()
    nan_bits = 0x7FFFFFFF  # the FFMA's result for a NaN operand
    assert ((nan_bits * common.E2M1_SIGNED_MULTIPLIER + common.E2M1_SIGNED_OFFSET) & 0xFFFFFFFF) >> 28 != 0
