"""The SwiGLU kernels' branch-free division (tk_div_rn_fast, kernel_src/cuda/swiglu_div.cuh) is IEEE a / b, bit for bit,
wherever the step's range test lets it be used (2^-64 <= |a| <= 80, b = 1 + exp(-a)).

The sequence: y0 = MUFU.RCP(b) (rcp.approx), e = RN(1 - b y0), y = RN(y0 + y0 e), q0 = RN(a y),
s = RN(b q0 - a), q = RN(q0 - y s), each step one rounding (FFMA / FMUL). It is instruction for instruction
the fast path nvcc emits for div.rn.f32 (the residual negated, which changes no value but keeps the sign
of a zero), whose results NVIDIA guarantees to be IEEE wherever its FCHK lets it run; FCHK is a range check
on the exponents, and every step scales exactly by powers of two while the values stay normal (MUFU.RCP
included), so what holds for a, b in [1, 2) holds in the whole range where nothing leaves the normal floats.
In range: a / b >= 2^-66 for |a| <= 1 (b < 4) and > 1 / (1 + e^80) > 2^-116 above, b < 2^116, so y, q0
and the residual's bits (down to 2^-64 * 2^-48) are representable.

Checked here, without a GPU:
1. With y0 = RN(1 / b), the Newton step gives y = RN(1 / b) for all 2^23 significands of b; then
   Markstein's theorem (P. Markstein, IBM J. Res. Dev. 34(1), 1990; M. Cornea-Hasegan, R. Golliver,
   P. Markstein, "Correctness proofs outline for Newton-Raphson based floating-point divide and square
   root algorithms", ARITH 14, 1999): with y = RN(1 / b) and q0 = RN(a y) within an ulp of a / b, the
   residual a - b q0 is exact and RN(q0 + (a - b q0) y) = RN(a / b).
   MUFU.RCP is documented to 1 ulp only: with y0 one ulp off, y misses RN(1 / b) for 32 significands, and
   replaying the quotient for all 2^23 significands of a against those gives 2 wrong (b, a) pairs:
   (0xfffffd, 0xd55553) and (0xffffff, 0x800000) (significands as 24-bit integers). nvcc's own division
   has the same dependence on MUFU.RCP's actual bits there; of the two, only a = 2^-23 (b = 2 - 2^-23) is a
   SwiGLU operand pair, a bf16 gate that tests/gpu/test_swiglu.py feeds through the kernel.
2. The whole sequence in exact integer arithmetic, for every bf16 gate value in range (the forward's whole
   bf16 domain) and a log-uniform sweep of float32 values, with b a few ulps around 1 + exp(-a) (the
   exponential is an approximation), against a / b correctly rounded.
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from kernel_src.quant.swiglu import common
from kernel_src.quant.swiglu.backward import BACKWARD_PRELUDE
from tests.cpu.cuda_prelude import expand_defines
from tests.cpu.exact_float32 import divide, fma

SIGNIFICAND_BITS = 24


def test_newton_step_gives_the_correctly_rounded_reciprocal():
    """Part 1: for b = B 2^-23 (B in (2^23, 2^24)) and y0 = RN(1/b), y = RN(1/b). Values in units: y0 and y
    of 2^-24 (1/b is in (1/2, 1)), e of 2^-47 (an exact integer there)."""
    for start in range((1 << 23) + 1, 1 << 24, 1 << 21):
        b = np.arange(start, min(start + (1 << 21), 1 << 24), dtype=np.int64)
        exact = (np.int64(1) << 47) // b
        remainder = (np.int64(1) << 47) - exact * b
        correctly_rounded = exact + ((2 * remainder > b) | ((2 * remainder == b) & ((exact & 1) == 1)))
        y0 = correctly_rounded
        residual = (np.int64(1) << 47) - b * y0  # 1 - b y0 exactly, in units of 2^-47: |.| <= 2^23, so e is exact
        assert np.abs(residual).max() < (1 << SIGNIFICAND_BITS)
        e = residual
        # y = RN(y0 + y0 e): y0 is an integer in units of 2^-24, so only y0 e (units 2^-71) is rounded, ties
        # to even on the sum.
        product = y0 * e
        floor = product >> 47
        rest = product - (floor << 47)
        half = np.int64(1) << 46
        y = y0 + floor + ((rest > half) | ((rest == half) & (((y0 + floor) & 1) == 1)))
        assert (y == correctly_rounded).all(), f'first failing significand {b[y != correctly_rounded][0]:#x}'
    # b = 1 (B = 2^23): 1/b = 1 exactly, and within an ulp of it the step still gives 1.
    for y0 in [1 - 2**-24, 1.0, 1 + 2**-23]:
        assert fma(y0, fma(-1.0, y0, 1.0), y0) == 1.0


def _float32_neighbours(v: float, ulps: int) -> list[float]:
    centre = np.float32(v)
    out = [centre]
    up = down = centre
    for _ in range(ulps):
        up = np.nextafter(up, np.float32(np.inf))
        down = np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    return [float(x) for x in out]


def _fast_division(a: float, b: float, y0: float) -> float:
    y = fma(y0, fma(-b, y0, 1.0), y0)
    q0 = fma(a, y, 0.0) if a != 0 else a
    return fma(-y, fma(b, q0, -a), q0)


def _check_gate(a: float, b_ulps: int) -> None:
    assert common.FAST_DIV_MIN <= abs(a) <= common.FAST_DIV_MAX
    for b in _float32_neighbours(1 + math.exp(-a), b_ulps):
        y0 = float(np.float32(1 / b))  # RN(1 / b): 1 / b in float64 is within 2^-53, never a float32 tie
        assert _fast_division(a, b, y0) == divide(a, b), (a, b)


def test_every_bfloat16_gate_in_range():
    bits = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gates = bits.float()
    gates = gates[(gates.abs() >= common.FAST_DIV_MIN) & (gates.abs() <= common.FAST_DIV_MAX)]
    assert gates.numel() > 17900  # 70 binades of 128 values, both signs
    for a in gates.tolist():
        _check_gate(a, 2)


def test_float32_gates_in_range():
    rng = random.Random(20261130)
    lo, hi = math.log2(common.FAST_DIV_MIN), math.log2(common.FAST_DIV_MAX)
    gates = [float(np.float32(rng.choice((-1, 1)) * 2.0 ** rng.uniform(lo, hi))) for _ in range(4000)]
    gates += [common.FAST_DIV_MIN, common.FAST_DIV_MAX, -common.FAST_DIV_MAX, float(np.float32(10.0)), float(np.float32(7.0))]
    for a in gates:
        _check_gate(a, 2)


def test_signed_zero():
    """a = +-0 fails the range test, but the sequence still keeps the sign of a, as IEEE division does (float32
    numpy arithmetic is exact here, every product being zero)."""
    for a in (np.float32(0.0), np.float32(-0.0)):
        for b in (np.float32(1.0), np.float32(1.5), np.float32(2.0), np.float32(2.0**100)):
            y = np.float32(1) / b
            q0 = a * y
            s = b * q0 + (-a)
            q = (-y) * s + q0
            assert q == 0 and np.signbit(q) == np.signbit(a)


# The backward (kernel_src.quant.swiglu.backward) shares one reciprocal between the sigmoid 1 / b and the quotient a / b
# (tk_rcp_rn_fast, tk_div_rn_fast_by: together the sequence above) and its range test also lets a = +-0 through:
# the smallest |a| is taken over tk_abs_below_or_nan_at_zero(a) (|a| one ulp toward zero; NaN for +-0, which
# fminf skips) against FAST_DIV_MIN_BELOW.
def _abs_below_or_nan_at_zero(a: np.ndarray) -> np.ndarray:
    bits = a.astype(np.float32).view(np.uint32)
    return np.abs((bits - np.uint32(1)).view(np.float32))  # uint32 arithmetic wraps, as the kernel's int


def _backward_range_test(gates: np.ndarray) -> bool:
    """tk_div_fast_in_range_or_zero over one step's clamped gates, as the kernel reduces them."""
    magnitudes = np.abs(gates.astype(np.float32))
    largest = np.float32(np.nan) if np.isnan(magnitudes).any() else magnitudes.max(initial=np.float32(0))  # max.NaN
    smallest = np.fmin.reduce(_abs_below_or_nan_at_zero(gates), initial=np.float32(np.inf))  # fminf skips NaN
    return bool(largest <= np.float32(common.FAST_DIV_MAX)) and bool(smallest >= np.float32(common.FAST_DIV_MIN_BELOW))


def _in_backward_range(a: np.ndarray) -> np.ndarray:
    m = np.abs(a.astype(np.float32))
    return (m == 0) | ((m >= np.float32(common.FAST_DIV_MIN)) & (m <= np.float32(common.FAST_DIV_MAX)))


def test_backward_range_constants():
    below = np.array([common.FAST_DIV_MIN], dtype=np.float32).view(np.uint32) - np.uint32(1)
    assert float(below.view(np.float32)[0]) == common.FAST_DIV_MIN_BELOW
    assert common.FAST_DIV_MIN_BELOW.hex() + 'f' in expand_defines(BACKWARD_PRELUDE)
    assert common.FAST_DIV_MAX.hex() + 'f' in expand_defines(BACKWARD_PRELUDE)


def test_backward_range_test_takes_zeros_and_the_range_only():
    """Single gates: every 65537th float32 bit pattern (all signs and exponents) and the edges with their
    neighbours; then steps of 16 mixing zeros, in-range, tiny, huge, subnormal, inf and NaN gates."""
    bits = np.arange(0, 1 << 32, 65537, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, common.FAST_DIV_MIN, common.FAST_DIV_MAX, 1e-45, 2.0**-126, 1.0, 88.0, 3e38, np.inf], dtype=np.float32)
    edges = np.concatenate([edges, np.nextafter(edges, np.float32(0)), np.nextafter(edges, np.float32(np.inf))])
    singles = np.concatenate([bits.view(np.float32), edges, -edges, np.array([np.nan], dtype=np.float32)])
    expected = _in_backward_range(singles)
    assert expected.sum() > 10000 and (~expected).sum() > 10000
    for a, ok in zip(singles, expected):
        assert _backward_range_test(np.array([a])) == ok, a
    rng = np.random.default_rng(20261130)
    pool = np.concatenate([singles, np.zeros(5000, dtype=np.float32), -np.zeros(5000, dtype=np.float32),
                           rng.standard_normal(20000).astype(np.float32)])
    for _ in range(20000):
        step = rng.choice(pool, 16)
        assert _backward_range_test(step) == bool(_in_backward_range(step).all()), step
    assert _backward_range_test(np.zeros(16, dtype=np.float32))  # an all-zero step


def test_zero_gate_on_the_backward_fast_path():
    """a = +-0: b = 1 + exp(0) = 2, and from MUFU.RCP's result or either neighbour the Newton step gives 1/2
    (the sigmoid), and the quotient is a zero of a's sign (IEEE +-0 / 2)."""
    for y0 in _float32_neighbours(0.5, 1):
        y = fma(y0, fma(-2.0, y0, 1.0), y0)
        assert y == 0.5
    b, y = np.float32(2.0), np.float32(0.5)
    for a in (np.float32(0.0), np.float32(-0.0)):
        q0 = a * y
        q = (-y) * (b * q0 + (-a)) + q0
        assert q == 0 and np.signbit(q) == np.signbit(a)
