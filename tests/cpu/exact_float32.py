"""Exact float32 arithmetic on Python integers, for the CPU tests that replay a kernel's float sequence: a value
is n * 2^x, and each operation rounds once, to nearest, ties to even, as the GPU's FFMA / FMUL do (no flush to
zero)."""

from __future__ import annotations

import math

SIGNIFICAND_BITS = 24
SUBNORMAL_EXPONENT = -149  # the unit of float32's subnormals, 2^-149


def split(v: float) -> tuple[int, int]:
    """(n, x) with v = n * 2^x exactly."""
    m, x = math.frexp(v)
    return int(m * (1 << 53)), x - 53


def round_float32(n: int, x: int, sticky: bool = False, subnormal: bool = False) -> float:
    """n * 2^x (plus a sticky bit below it) rounded to the nearest float32, ties to even. Normal results only,
    unless subnormal=True, which rounds at 2^-149 below the normal range."""
    if n == 0:
        assert not sticky
        return 0.0
    sign = -1 if n < 0 else 1
    n = abs(n)
    shift = n.bit_length() - SIGNIFICAND_BITS
    if subnormal:
        shift = max(shift, SUBNORMAL_EXPONENT - x)
    if shift > 0:
        floor, rest, half = n >> shift, n & ((1 << shift) - 1), 1 << (shift - 1)
        n = floor + (rest > half or (rest == half and (sticky or floor & 1)))
        x += shift
    else:
        assert not sticky
    value = sign * math.ldexp(n, x)
    assert (subnormal or abs(value) >= 2.0**-126) and abs(value) < 2.0**128, 'left the normal range'
    return value


def fma(a: float, b: float, c: float, subnormal: bool = False) -> float:
    """RN(a * b + c), one rounding."""
    (na, xa), (nb, xb), (nc, xc) = split(a), split(b), split(c)
    x = min(xa + xb, xc)
    return round_float32((na * nb << (xa + xb - x)) + (nc << (xc - x)), x, subnormal=subnormal)


def divide(a: float, b: float) -> float:
    """a / b correctly rounded to float32."""
    (na, xa), (nb, xb) = split(a), split(b)
    quotient, rest = divmod(abs(na) << 64, abs(nb))
    return math.copysign(round_float32(quotient, xa - xb - 64, rest != 0), a)
