"""Argument checks of the mixing ops (split_mixes, sinkhorn, head_compute_mix, pre_big_fuse), on top of
tile_kernels_aot._checks: each raises TypeError / ValueError naming the op and the argument."""

from __future__ import annotations


import torch

from tile_kernels_aot import _checks

VECTOR_BYTES = 16  # the kernels move each token's row in 16-byte vectors


def float32_rows(op: str, name: str, t: object, tail: tuple[int, ...], *, min_ndim: int | None = None) -> torch.Tensor:
    """A contiguous, 16-byte aligned float32 tensor of shape (..., *tail) (leading dims: any number, at least
    min_ndim dims in all)."""
    low = len(tail) if min_ndim is None else min_ndim
    _checks.tensor(op, name, t, ndim=range(low, low + 8), dtypes=(torch.float32,))
    if tuple(t.shape[t.dim() - len(tail):]) != tail:
        want = ', '.join(['...', *map(str, tail)])
        raise ValueError(f'{op}: {name} must have shape ({want}), got {tuple(t.shape)}')
    contiguous_aligned(op, name, t)
    return t


def contiguous_aligned(op: str, name: str, t: torch.Tensor) -> None:
    _checks.contiguous(op, name, t, VECTOR_BYTES)


def vector(op: str, name: str, t: object, length: int) -> torch.Tensor:
    """A contiguous float32 tensor of `length` elements (a 1-D vector; scale may also come as any shape of that
    many elements, as upstream's modules keep it)."""
    _checks.tensor(op, name, t, ndim=range(0, 3), dtypes=(torch.float32,))
    if t.numel() != length or (t.dim() == 1 and t.shape[0] != length):
        raise ValueError(f'{op}: {name} must have {length} elements, got shape {tuple(t.shape)}')
    if not t.is_contiguous():
        raise ValueError(f'{op}: {name} must be contiguous, got strides {t.stride()}')
    return t


def same_leading(op: str, names: tuple[str, str], a: torch.Tensor, b: torch.Tensor, a_tail: int, b_tail: int) -> None:
    """a and b agree on their token dims: a.shape[:-a_tail] == b.shape[:-b_tail]."""
    lead_a, lead_b = tuple(a.shape[:a.dim() - a_tail]), tuple(b.shape[:b.dim() - b_tail])
    if lead_a != lead_b:
        raise ValueError(f'{op}: {names[0]} {tuple(a.shape)} and {names[1]} {tuple(b.shape)} disagree on the token dims '
                         f'({lead_a} vs {lead_b})')
