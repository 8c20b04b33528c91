"""Argument checks shared by the ops. Each raises TypeError / ValueError naming the op and the argument,
before anything is allocated or launched."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

FLOAT32_MAX = torch.finfo(torch.float32).max


def tensor(op: str, name: str, t: object, *, ndim: int | Iterable[int], dtypes: Iterable[torch.dtype]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f'{op}: {name} must be a torch.Tensor, got {type(t).__name__}')
    dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if t.dim() not in dims:
        raise ValueError(f'{op}: {name} must have {" or ".join(map(str, dims))} dimensions, got shape {tuple(t.shape)}')
    allowed = tuple(dtypes)
    if t.dtype not in allowed:
        raise TypeError(f'{op}: {name} must be {" or ".join(str(d).removeprefix("torch.") for d in allowed)}, got {str(t.dtype).removeprefix("torch.")}')
    return t


def integer(op: str, name: str, value: object, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f'{op}: {name} must be an int, got {type(value).__name__}')
    if value < low or (high is not None and value > high):
        bound = f'>= {low}' if high is None else f'in [{low}, {high}]'
        raise ValueError(f'{op}: {name} must be {bound}, got {value}')
    return value


def real(op: str, name: str, value: object, *, low: float = -math.inf) -> float:
    """A Python number that reaches a kernel as a float32 argument: finite, in float32's range, and >= low."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f'{op}: {name} must be a float, got {type(value).__name__}')
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX or value < low:
        bound = f' >= {low}' if low > -math.inf else ''
        raise ValueError(f'{op}: {name} must be a finite float32 value{bound}, got {value}')
    return float(value)


def shape(op: str, name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f'{op}: {name} must have shape {tuple(expected)}, got {tuple(t.shape)}')


def contiguous(op: str, name: str, t: torch.Tensor, alignment: int = 1) -> None:
    """Contiguous, with its data pointer `alignment`-byte aligned (when it has elements)."""
    if not t.is_contiguous():
        raise ValueError(f'{op}: {name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}')
    if t.numel() and t.data_ptr() % alignment:
        raise ValueError(f'{op}: {name} must be {alignment}-byte aligned, got data pointer {t.data_ptr():#x}')


def inner_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f'{op}: {name} must be contiguous in its last dimension, got strides {t.stride()}')


def on_one_cuda_device(op: str, **tensors: torch.Tensor) -> int:
    """The common CUDA device index of the tensors. Checked last, so shape errors show on CPU too.
    (is_cuda and get_device() avoid building torch.device objects on this per-call path.)"""
    index = None
    for name, t in tensors.items():
        if not t.is_cuda:
            raise ValueError(f'{op}: {name} must be on a CUDA device, got {t.device}')
        if index is None:
            index = t.get_device()
        elif t.get_device() != index:
            raise ValueError(f'{op}: tensors must be on one device, got {", ".join(f"{k} on {v.device}" for k, v in tensors.items())}')
    return index
