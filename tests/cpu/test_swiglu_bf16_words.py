"""The SwiGLU forwards' bf16 word tests (kernel_src/cuda/swiglu_words.cuh, swiglu_silu_table.cuh), over every bf16
value.

* The step's window test of the silu table on the loaded gate's magnitude bits passes exactly for the gates with
  2^TABLE_LOW_EXP <= |g| < 2^TABLE_HIGH_EXP (no zero, subnormal, inf or NaN), and for those the lookup's byte
  offsets (one multiply-add and one LOP3 a word of two gates) are the slots the table build writes for the same
  gate, in both halves of a word whatever the other half holds, inside the table; the build writes each window
  gate's slot exactly once.
* The clamp-count reach (signed 16-bit max over gate words and |up| words, then !(half <= c)) fires whenever some
  gate l > c or some |up| > c: a missed step would lose clamp counts.
* The per-channel forward's tests on bf16 bits: the fast division's range test on the raw gates' magnitudes implies
  the float test on the clamped gates, and the clamp skip only passes where both clamps return every value unchanged.
"""

import numpy as np
import pytest

from kernel_src.quant.swiglu import common, silu_table
from kernel_src.quant.swiglu.channel import CHANNEL_PRELUDE
from kernel_src.quant.swiglu.forward import forward_prelude
from kernel_src.quant.swiglu.layout import ForwardLayout
from tests.cpu.cuda_prelude import expand_defines

# The flat bf16 forward's and the per-channel forward's preludes, as nvcc reads them.
FLAT_BF16_PRELUDE = expand_defines(forward_prelude(ForwardLayout('bfloat16', False, silu_table.TABLE_THREADS, None)))
WORDS_PRELUDE = expand_defines(CHANNEL_PRELUDE)

ALL_BITS = np.arange(1 << 16, dtype=np.uint32)
VALUES = (ALL_BITS << 16).view(np.float32)  # every bf16, widened exactly
CLAMPS = [np.float32(v) for v in (10.0, 7.0, 7.3, 80.0, 100.0, 1e-3, 2.0**-64, 2.0**-70, 0.0, -1.0, float('inf'))]
LOW, HIGH = silu_table.TABLE_LOW_BITS, silu_table.TABLE_HIGH_BITS


def _lookup_offsets(words):
    """tk_silu_lookup_bf16x8's byte offsets of the two gates of each 32-bit word (low half, high half)."""
    import re
    constant = int(re.search(r'"r"\((0x[0-9a-f]+)u\)', FLAT_BF16_PRELUDE).group(1), 16)
    scaled = ((words & 0x7FFF7FFF) * 4 + constant) & 0xFFFFFFFF  # mad.lo.u32
    offsets = scaled | (words & 0x80008000)
    return offsets & 0xFFFF, offsets >> 16


def _slot(bits):
    """The float index the table build writes the silu of gate `bits` to."""
    negative = bits >> 15
    return negative * silu_table.TABLE_SIGN_WORDS + (bits & 0x7FFF) - LOW


def test_window_test_is_the_value_window():
    magnitude = ALL_BITS & 0x7FFF
    passes = (magnitude < HIGH) & (magnitude >= LOW)  # tk_gate_bits_in_table on a step holding this gate
    with np.errstate(invalid='ignore'):
        window = (np.abs(VALUES) >= np.float32(2.0**silu_table.TABLE_LOW_EXP)) & (np.abs(VALUES) < np.float32(2.0**silu_table.TABLE_HIGH_EXP))
    assert np.array_equal(passes, window)
    assert passes.sum() == 2 * silu_table.TABLE_PER_SIGN


def test_build_writes_each_window_gate_once():
    entry = np.arange(2 * silu_table.TABLE_PER_SIGN)  # build_silu_table: entry k * threads + tid
    negative = (entry >= silu_table.TABLE_PER_SIGN).astype(np.int64)
    bits = negative * 0x8000 + LOW + entry - negative * silu_table.TABLE_PER_SIGN
    slot = negative * silu_table.TABLE_SIGN_WORDS + entry - negative * silu_table.TABLE_PER_SIGN
    magnitude = ALL_BITS & 0x7FFF
    assert np.array_equal(np.sort(bits), ALL_BITS[(magnitude >= LOW) & (magnitude < HIGH)])
    assert np.array_equal(slot, _slot(bits))
    assert len(set(slot.tolist())) == len(slot) and slot.min() >= 0 and slot.max() < silu_table.TABLE_WORDS


def test_lookup_offsets_are_the_build_slots():
    magnitude = ALL_BITS & 0x7FFF
    window = ALL_BITS[(magnitude >= LOW) & (magnitude < HIGH)].astype(np.uint64)
    # every pair of window gates in one word (26 million words), both orders
    words = (window[:, None] << 16 | window[None, :]).ravel()
    low, high = _lookup_offsets(words)
    assert np.array_equal(low, 4 * _slot(words & 0xFFFF))
    assert np.array_equal(high, 4 * _slot(words >> 16))
    assert high.max() < 4 * silu_table.TABLE_WORDS and low.max() < 4 * silu_table.TABLE_WORDS


@pytest.mark.parametrize('c', CLAMPS, ids=str)
def test_reach_fires_for_every_clamped_element(c):
    signed = ALL_BITS.astype(np.uint16).view(np.int16).astype(np.int32)
    with np.errstate(invalid='ignore'):
        fires = ~(VALUES <= c)  # tk_reach_exceeds on one half holding these bits
        exceeds = VALUES > c
    # The max M of a step's halves is >= (signed 16-bit) every gate word half and every |up| half; so it suffices
    # that every M at or above an exceeding value fires, and (c < 0) that every M >= +0 fires (|up| halves are >= +0).
    order = np.argsort(signed, kind='stable')
    fires_sorted, exceeds_sorted = fires[order], exceeds[order]
    first_exceeding = np.argmax(exceeds_sorted) if exceeds_sorted.any() else len(order)
    if c >= 0:
        assert fires_sorted[first_exceeding:].all()
    else:  # negative values are not ordered by their signed bits, but the |up| halves put M at +0 or above
        assert fires[signed >= 0].all()
    # |up| as magnitude bits: r > c or r < -c is |r| > c, for every up value
    up_magnitude = (ALL_BITS & 0x7FFF) << 16
    with np.errstate(invalid='ignore'):
        clamped_up = (VALUES > c) | (VALUES < -c)
        assert np.array_equal(clamped_up, up_magnitude.view(np.float32) > c)


def _min_nan(a, b):
    """PTX min.NaN.f32 (NaN if either is NaN), elementwise."""
    return np.where(np.isnan(a) | np.isnan(b), np.float32('nan'), np.minimum(a, b)).astype(np.float32)


def _max_nan(a, b):
    return np.where(np.isnan(a) | np.isnan(b), np.float32('nan'), np.maximum(a, b)).astype(np.float32)


def _passing_magnitudes_form_a_prefix(passes):
    """A per-magnitude test over the 0x8000 magnitude bit patterns that holds for a prefix of them: then the test of a
    thread's largest magnitude (an unsigned max over its halves) holds exactly when it holds for every half."""
    return not passes[np.argmin(passes):].any() if not passes.all() else True


@pytest.mark.parametrize('c', CLAMPS + [np.float32(-0.0), np.float32('nan')], ids=str)
def test_division_range_on_gate_bits(c):
    """tk_gate_bits_in_div_range (the per-channel forward's one test a thread): when it passes on a gate's magnitude bits,
    the clamped gate min.NaN(g, c) lies where tk_div_rn_fast is correctly rounded (tk_div_fast_in_range's float test)."""
    body = WORDS_PRELUDE[WORDS_PRELUDE.index('int tk_gate_bits_in_div_range'):]
    body = body[:body.index('}')]
    import re
    high_bits = int(re.search(r'<= (0x[0-9a-f]+)u', body).group(1), 16)
    low_bits = int(re.search(r'>= (0x[0-9a-f]+)u', body).group(1), 16)
    assert high_bits == common.bf16_bits(common.FAST_DIV_MAX) and low_bits == common.bf16_bits(common.FAST_DIV_MIN)
    assert common.FAST_DIV_MIN.hex() + 'f' in body
    magnitude = ALL_BITS & 0x7FFF
    passes = (magnitude <= high_bits) & (magnitude >= low_bits) & bool(c >= np.float32(common.FAST_DIV_MIN))
    clamped = _min_nan(VALUES, np.full_like(VALUES, c))
    with np.errstate(invalid='ignore'):
        in_range = (np.abs(clamped) <= np.float32(common.FAST_DIV_MAX)) & (np.abs(clamped) >= np.float32(common.FAST_DIV_MIN))
    assert in_range[passes].all()
    # and the same gates as the float test on raw gates (nothing in range lost without a clamp)
    if c == np.inf:
        assert np.array_equal(passes, in_range)


@pytest.mark.parametrize('c', CLAMPS + [np.float32(-0.0), np.float32('nan')], ids=str)
def test_clamps_are_identity_when_no_magnitude_exceeds_c(c):
    """tk_clamps_are_identity: with every gate and up magnitude (bits read as a float) <= c and c > 0, the clamps
    min.NaN(g, c) and min.NaN(max.NaN(r, -c), c) return every such value bit for bit (signed zeros, no NaN)."""
    magnitude_values = ((ALL_BITS & 0x7FFF) << 16).view(np.float32)
    with np.errstate(invalid='ignore'):
        passes = (magnitude_values <= c) & bool(c > 0)
    assert _passing_magnitudes_form_a_prefix(passes[:0x8000])
    v = VALUES[passes]
    cc = np.full_like(v, c)
    gate = _min_nan(v, cc)
    up = _min_nan(_max_nan(v, -cc), cc)
    assert np.array_equal(gate.view(np.uint32), v.view(np.uint32))
    assert np.array_equal(up.view(np.uint32), v.view(np.uint32))
    if c > 0:  # every value within c passes (the skip is not lost on ordinary data)
        with np.errstate(invalid='ignore'):
            assert passes.sum() == (np.abs(VALUES) <= c).sum()


def _clamp_pair_half(c):
    """tk_bf16x2_clamp_pair's half: c rounded down to bf16 (toward zero for c >= 0, away from it below; NaN kept)."""
    bits = int(np.float32(c).view(np.uint32))
    half = bits >> 16
    if bits >> 31 and bits & 0xFFFF:
        half += 1
    if bits & 0x7FFFFFFF > 0x7F800000:
        half = 0x7FC0
    return np.uint32(half << 16).view(np.float32)


@pytest.mark.parametrize('c', CLAMPS + [np.float32(v) for v in (7.01, -0.3, -7.01, 3e-39, -3e-39, -0.0, 3.4e38, -3.4e38,
                                                                   float('-inf'), float('nan'))], ids=str)
def test_bf16_clamp_counts_against_the_rounded_clamp(c):
    """tk_count_clamped_bf16x8 compares each bf16 half with the clamp rounded down to bf16 (g > p, u > p, u < -p), where
    the float compares use c itself: the same answers for every bf16 value."""
    p = _clamp_pair_half(c)
    with np.errstate(invalid='ignore'):
        assert np.array_equal(VALUES > p, VALUES > c)
        assert np.array_equal(VALUES < -p, VALUES < -c)
