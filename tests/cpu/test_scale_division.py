"""per_token_requant's scale factors by block_scale(fast_division=True) are IEEE clamped / fmax and fmax / clamped,
bit for bit, for every clamped in [floor, SCALE_DIVISION_MAX] (kernel_src.quant.common, RCP_DIV_PRELUDE).

Both are q0 = RN(a y), s = RN(b q0 - a), q = RN(q0 - y s) with y = RN(1 / b): a constant for b = fmax
(SCALE_RECIPROCALS), and tk_rcp_rn_fast(clamped) for b = clamped, which is nvcc's own rcp.rn.f32 fast path and so
exactly RN(1 / b) (test_swiglu_division.py checks its Newton step for every significand). Each operation scales
exactly by powers of two while the values stay normal, so a significand replay in [1, 2) covers every binade of the
range; the edges where they do not (the residual of clamped / 6 turns subnormal near e2m1's floor) are replayed at
their own exponents.

Replayed here, in exact integer arithmetic: a sample of 20000 significands a run (seeded) and the structured ones,
for both operands and both maxima; TK_FULL_REPLAY=1 replays all 2^23 significands (minutes on one core).
"""

from __future__ import annotations

import math
import os
import random
import struct

import pytest

from kernel_src.quant import common
from tests.cpu.exact_float32 import divide, fma

FMAXES = sorted({fmax for fmax, _ in common.FORMATS.values()})


def bits_to_float(bits: int) -> float:
    return struct.unpack('<f', struct.pack('<I', bits))[0]


def fast_division(a: float, b: float, y: float) -> float:
    """tk_div_rn_fast_by(a, b, y), each step rounded once (the residual may be subnormal, as FFMA keeps it)."""
    q0 = fma(a, y, 0.0)
    residual = fma(b, q0, -a, subnormal=True)
    return fma(-y, residual, q0)


def check(clamped: float, fmax: float, constant_reciprocal: float) -> None:
    assert fast_division(clamped, fmax, constant_reciprocal) == divide(clamped, fmax), ('sf', clamped, fmax)
    assert fast_division(fmax, clamped, divide(1.0, clamped)) == divide(fmax, clamped), ('multiplier', clamped, fmax)


def significands() -> list[int]:
    if os.environ.get('TK_FULL_REPLAY') == '1':
        return list(range(1 << 23, 1 << 24))
    rng = random.Random(20261202)
    structured = [(1 << 23) + k for k in range(64)] + [(1 << 24) - 1 - k for k in range(64)]
    for fmax in FMAXES:  # around the maxima's own significands, where quotients are near powers of two
        m = int(math.frexp(fmax)[0] * (1 << 24))
        structured += list(range(m - 64, m + 64))
    return structured + [rng.randrange(1 << 23, 1 << 24) for _ in range(20000)]


def test_reciprocal_constants_are_the_nearest_floats():
    for fmax in FMAXES:
        assert bits_to_float(common.SCALE_RECIPROCALS[fmax]) == divide(1.0, fmax)


@pytest.mark.parametrize('fmax', FMAXES)
def test_significands(fmax):
    y = bits_to_float(common.SCALE_RECIPROCALS[fmax])
    for m in significands():
        check(math.ldexp(m, -23), fmax, y)


@pytest.mark.parametrize('fmt', sorted(common.FORMATS))
def test_edges_of_the_range(fmt):
    """The floor's binade and the next (e2m1: 6 * 2^-126, where the residual of clamped / 6 is subnormal), and the
    top of the fast range, 2^100 and the floats below it."""
    fmax, floor = common.FORMATS[fmt]
    y = bits_to_float(common.SCALE_RECIPROCALS[fmax])
    floor_bits = struct.unpack('<I', struct.pack('<f', floor))[0]
    top_bits = struct.unpack('<I', struct.pack('<f', common.SCALE_DIVISION_MAX))[0]
    rng = random.Random(fmt)
    for bits in (list(range(floor_bits, floor_bits + 2000)) + [rng.randrange(floor_bits, floor_bits + (2 << 23)) for _ in range(2000)]
                 + list(range(top_bits - 2000, top_bits + 1))):
        check(bits_to_float(bits), fmax, y)


def test_the_replay_can_fail():
    """Without the correction step, q0 = RN(clamped RN(1 / 6)) alone, the replay finds wrong quotients (about a third
    of the sample). The correction itself is robust: y up to 64 ulps off RN(1 / 6) still gave none wrong."""
    y = bits_to_float(common.SCALE_RECIPROCALS[6.0])
    sample = [math.ldexp(m, -23) for m in significands()[:5000]]
    assert sum(fma(a, y, 0.0) != divide(a, 6.0) for a in sample) > 1000
