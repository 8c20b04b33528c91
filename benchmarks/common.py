"""What every benchmark module measures with: bytes moved and upstream's measure of agreement. Its own module, since
benchmarks.run imports the family modules (mhc_*, engram) for their cases and they cannot import it back."""

from __future__ import annotations

import torch


def nbytes(*tensors) -> int:
    """Bytes of the tensors (None skipped: an output a variant does not write)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def calc_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Upstream's measure of agreement, 1 - 2 sum(a b) / sum(a^2 + b^2) in float64: near 0 when a and b agree, and
    blind to where values cancel, where an elementwise tolerance is not."""
    a, b = a.double(), b.double()
    denominator = (a * a + b * b).sum()
    return float(1 - 2 * (a * b).sum() / denominator) if denominator != 0 else 0.0
