"""The flat SwiGLU forward's bf16 word tests (kernel_src.quant.swiglu _BF16_WORDS_PRELUDE), over every bf16 value.

* The step's division range test on the loaded gate's magnitude bits, with the launch's test of the clamp, passes only
  where the old test on the clamped gate a = min.NaN(l, c) passed (FAST_DIV_MIN <= |a| <= FAST_DIV_MAX), so the
  branch-free division is used only where it is exact.
* The clamp-count reach (signed 16-bit max over gate words and |up| words, then !(half <= c)) fires whenever some
  gate l > c or some |up| > c: a missed step would lose clamp counts.
"""

import numpy as np
import pytest

swiglu = pytest.importorskip('kernel_src.quant.swiglu')

ALL_BITS = np.arange(1 << 16, dtype=np.uint32)
VALUES = (ALL_BITS << 16).view(np.float32)  # every bf16, widened exactly
CLAMPS = [np.float32(v) for v in (10.0, 7.0, 7.3, 80.0, 100.0, 1e-3, 2.0**-64, 2.0**-70, 0.0, -1.0, float('inf'))]
MAX_BITS = swiglu._bf16_bits(swiglu.FAST_DIV_MAX)
MIN_BITS = swiglu._bf16_bits(swiglu.FAST_DIV_MIN)


@pytest.mark.parametrize('c', CLAMPS, ids=str)
def test_gate_bits_range_implies_clamped_gate_range(c):
    magnitude = ALL_BITS & 0x7FFF
    new_pass = (magnitude <= MAX_BITS) & (magnitude >= MIN_BITS) & bool(c >= np.float32(swiglu.FAST_DIV_MIN))
    a = np.where(np.isnan(VALUES), VALUES, np.minimum(VALUES, c))  # min.NaN(l, c)
    with np.errstate(invalid='ignore'):
        old_pass = (np.abs(a) <= np.float32(swiglu.FAST_DIV_MAX)) & (np.abs(a) >= np.float32(swiglu.FAST_DIV_MIN))
    assert not np.any(new_pass & ~old_pass)
    if c == np.float32(10.0):  # the benchmarks' clamp: every gate the old test took, but those above 80, still passes
        assert np.array_equal(new_pass, old_pass & ~(VALUES > 80))


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
