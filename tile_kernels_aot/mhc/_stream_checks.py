"""Argument checks of the stream ops (expand, pre_apply_mix, post, multilayer_recompute), on top of
tile_kernels_aot._checks: each raises TypeError / ValueError naming the op and the argument.

Every tensor is (..., tail): any number of leading token dims, which the ops flatten, and a fixed tail (the hidden
size, or (mhc, hidden), or a mix's (mhc, 1) / (mhc, mhc)). The tensors of one call must agree on the leading dims.
Pointer alignment is checked against the constants of the binary that will run (`vector_alignment` for bf16 tensors,
`mix_alignment` for float32 mixes), once find_kernel has found it and before anything is allocated.
"""

from __future__ import annotations

import torch

from tile_kernels_aot import _checks

MAX_LEADING_DIMS = 6


def tail_tensor(op: str, name: str, t: object, dtype: torch.dtype, tail: int) -> torch.Tensor:
    """A `dtype` tensor with `tail` trailing dims and up to MAX_LEADING_DIMS leading ones."""
    return _checks.tensor(op, name, t, ndim=range(tail, tail + MAX_LEADING_DIMS + 1), dtypes=(dtype,))


def leading(t: torch.Tensor, tail: int) -> tuple[int, ...]:
    return tuple(t.shape[:t.dim() - tail])


def expect_shape(op: str, name: str, t: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f'{op}: {name} must have shape {tuple(shape)} ({what}), got {tuple(t.shape)}')


def streams(op: str, name: str, t: object) -> tuple[int, int]:
    """A bf16 (..., mhc, hidden) tensor: returns (mhc, hidden)."""
    tail_tensor(op, name, t, torch.bfloat16, 2)
    mhc, hidden = t.shape[-2:]
    if mhc < 1 or hidden < 1:
        raise ValueError(f'{op}: {name} must have shape (..., mhc, hidden) with mhc and hidden >= 1, got {tuple(t.shape)}')
    return mhc, hidden


def num_tokens(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def aligned(op: str, kernel, vectors: dict[str, torch.Tensor], mixes: dict[str, torch.Tensor] | None = None) -> None:
    """Every pointer at the alignment the binary `kernel` reads it with (its manifest constants)."""
    constants = kernel.entry.constants
    for names, alignment in ((vectors, constants['vector_alignment']), (mixes or {}, constants['mix_alignment'])):
        for name, t in names.items():
            if t.numel() and t.data_ptr() % alignment:
                raise ValueError(f'{op}: {name} must be {alignment}-byte aligned, got data_ptr {t.data_ptr():#x}')
