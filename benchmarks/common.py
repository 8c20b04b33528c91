"""What every benchmark module measures and writes with: bytes moved, upstream's measure of agreement, and rows of
JSON Lines. Its own module, since benchmarks.run imports the family modules (mhc_*, engram) for their cases and they
cannot import it back."""

from __future__ import annotations

import json

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


class RowWriter:
    """Rows written to a JSON Lines file as they come, each flushed, so that a run cut short (a time limit, a hung
    kernel) keeps the rows it finished; with no path, rows go nowhere."""

    def __init__(self, path: str | None) -> None:
        self._file = open(path, 'w') if path else None

    def __call__(self, row: dict) -> None:
        if self._file:
            self._file.write(json.dumps(row) + '\n')
            self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()


def kernel_only(case):
    """Mark a benchmark case that launches a kernel through the loader (tile_kernels_aot._select.find_kernel) rather than
    calling an op: the host-overhead step, which compares ops, leaves it out."""
    case.kernel_only = True
    return case
