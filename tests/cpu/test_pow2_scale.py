"""round_sf's power of two from clamped's bits (kernel_src.quant.common.pow2_scale_exponent, used by every cast with
round_sf or UE8M0 scale factors: e2m1 6, e4m3 448, E5M6 65024) against the division it replaces: the exponent of
the power of two at or above the float32 quotient clamped / fmax, for every mantissa in the binades where the
comparison against F's mantissa flips, at the ends of the float32 range and below the quotient's normal range."""

import numpy as np
import pytest

from kernel_src.quant.common import FORMATS, pow2_scale_carry
from kernel_src.quant.e5m6 import AMAX_FLOOR as E5M6_FLOOR
from kernel_src.quant.e5m6 import E5M6_MAX

# (max, amax floor) of every format whose scale factors round up to powers of two
SCALED_FORMATS = {**FORMATS, 'e5m6': (E5M6_MAX, E5M6_FLOOR)}


def exponent_by_division(clamped: np.ndarray, fmax: float) -> np.ndarray:
    """The power of two at or above clamped / fmax by division, which the bit expression replaces: the quotient rounded
    by IEEE float32 division (numpy's, as div.rn.f32), then the exponent of its bits less one, plus one."""
    with np.errstate(over='ignore', under='ignore'):
        quotient = clamped / np.float32(fmax)
    return ((quotient.view(np.uint32).astype(np.int64) - 1) >> 23) + 1


def exponent_by_bits(clamped: np.ndarray, fmax: float) -> np.ndarray:
    """The kernels' expression, in integers: max(((bits + carry) >> 23) - f, 1), 255 for inf."""
    carry, f = pow2_scale_carry(fmax)
    bits = clamped.view(np.int32).astype(np.int64)
    return np.where(bits >= 0x7F800000, 255, np.maximum(((bits + carry) >> 23) - f, 1))


def every_mantissa(biased_exponent: int) -> np.ndarray:
    return ((np.uint32(biased_exponent) << np.uint32(23)) | np.arange(1 << 23, dtype=np.uint32)).view(np.float32)


@pytest.mark.parametrize('fmt', sorted(SCALED_FORMATS))
def test_bits_give_the_exponent_of_the_division(fmt):
    fmax, floor = SCALED_FORMATS[fmt]
    floor_exponent = int(np.float32(floor).view(np.uint32)) >> 23
    fmax_exponent = int(np.float32(fmax).view(np.uint32)) >> 23
    # Every mantissa of the floor's binade, of binades around fmax's and 2^0, and of the largest one: the
    # expression depends on the exponent only through a shift, so these cover every carry case.
    binades = {floor_exponent, floor_exponent + 1, fmax_exponent - 1, fmax_exponent, fmax_exponent + 1, 126, 127, 254}
    clamped = np.concatenate([every_mantissa(e) for e in sorted(binades)] + [np.array([np.inf, floor], np.float32)])
    assert np.array_equal(exponent_by_bits(clamped, fmax), exponent_by_division(clamped, fmax))


@pytest.mark.parametrize('fmt', sorted(SCALED_FORMATS))
def test_quotients_below_the_normal_range_take_exponent_one(fmt):
    """Only the SwiGLU forward takes a caller's floor, which may be tiny: a subnormal quotient rounds up to
    2^-126 both ways; a quotient that underflows to zero is excluded (the division gave no power of two)."""
    fmax = SCALED_FORMATS[fmt][0]
    clamped = np.concatenate([every_mantissa(e) for e in range(1, 8)] +
                             [np.arange(1, 1 << 16, dtype=np.uint32).view(np.float32)])  # normals and subnormals
    with np.errstate(under='ignore'):
        nonzero = (clamped / np.float32(fmax)) > 0
    assert nonzero.sum() > 1 << 20
    assert np.array_equal(exponent_by_bits(clamped, fmax)[nonzero], exponent_by_division(clamped, fmax)[nonzero])
