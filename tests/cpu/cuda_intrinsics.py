"""CUDA intrinsics the CPU tests replay on int64 tensors holding uint32 values."""

from __future__ import annotations

import torch


def byte_perm(x: torch.Tensor, y, selector) -> torch.Tensor:
    """CUDA's __byte_perm(x, y, s) on int64 tensors (or ints, broadcast to x) holding uint32s: byte n of the result is
    byte (s >> 4n) & 7 of the eight bytes of x (0..3) and y (4..7); the upper 16 bits of s and each nibble's bit 3 are
    not read."""
    x, y, selector = (torch.as_tensor(v, dtype=torch.int64).expand_as(x) for v in (x, y, selector))
    source = x | (y << 32)
    result = torch.zeros_like(x)
    for n in range(4):
        index = (selector >> (4 * n)) & 7
        result |= ((source >> (8 * index)) & 0xFF) << (8 * n)
    return result
