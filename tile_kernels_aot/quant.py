"""quant ops (upstream TileKernels v1 names and signatures).

This release builds per_token_cast to e4m3 with row-major fp32 scale factors, with and without
round_sf, from bf16 or fp32 input. The other formats and layouts of the upstream signature raise
NotImplementedError naming what is missing; nothing falls back to a slower path silently.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from tile_kernels_aot import _checks
from tile_kernels_aot._select import find_kernel

QuantTensor = tuple[torch.Tensor, torch.Tensor]
_IN_DTYPES = {torch.bfloat16: 'bfloat16', torch.float32: 'float32'}
_VECTOR_BYTES = 16


def _not_built(op: str, what: str) -> NotImplementedError:
    return NotImplementedError(f'{op}: {what} is not built in this release of tile-kernels-aot, which ships e4m3 '
                               'with row-major float32 scale factors from bfloat16/float32 input')


def per_token_cast(
    x: Union[torch.Tensor, QuantTensor],
    fmt: str,
    num_per_channels: int,
    x_block_size: Optional[tuple[int, int]] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
) -> QuantTensor:
    """Cast to FP8 with one scale factor per token and block of ``num_per_channels`` channels.

    Per block: ``sf = max(amax, 1e-4) / 448`` and ``out = e4m3(x * (448 / max(amax, 1e-4)))``,
    saturating; with ``round_sf`` the scale factor is rounded up to a power of two and the multiplier
    is its exact inverse. ``x ~= out * sf`` block by block.

    Args:
        x: ``[num_tokens, hidden]`` bfloat16 or float32 CUDA tensor, contiguous in ``hidden``; the row
            stride is free.
        fmt: ``'e4m3'``.
        num_per_channels: channels per scale factor: 32 or 128 are prebuilt (16 and 64 can be built).
        x_block_size: only for re-quantising an FP8/FP4 ``(data, sf)`` input (not built yet).
        use_tma_aligned_col_major_sf, use_packed_ue8m0: scale-factor layouts (not built yet).
        round_sf: round scale factors up to powers of two.

    Returns:
        ``(out, sf)``: ``out`` float8_e4m3fn ``[num_tokens, hidden]`` contiguous, ``sf`` float32
        ``[num_tokens, ceil(hidden / num_per_channels)]`` row-major.
    """
    op = 'per_token_cast'
    if fmt != 'e4m3':
        if fmt in ('e2m1', 'e5m6'):
            raise _not_built(op, f'fmt={fmt!r}')
        raise ValueError(f"{op}: fmt must be 'e4m3', 'e2m1' or 'e5m6', got {fmt!r}")
    if isinstance(x, tuple) or x_block_size is not None:
        raise _not_built(op, 're-quantising an FP8/FP4 (data, sf) input')
    if use_tma_aligned_col_major_sf or use_packed_ue8m0:
        raise _not_built(op, 'the TMA-aligned column-major and packed UE8M0 scale-factor layouts')
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(_IN_DTYPES))
    _checks.integer(op, 'num_per_channels', num_per_channels, low=1)
    if num_per_channels not in (16, 32, 64, 128):
        raise ValueError(f'{op}: num_per_channels must be 16, 32, 64 or 128, got {num_per_channels}')
    if not isinstance(round_sf, bool):
        raise TypeError(f'{op}: round_sf must be a bool, got {type(round_sf).__name__}')
    num_tokens, hidden = x.shape
    if hidden % 16:
        raise ValueError(f'{op}: x must have hidden divisible by 16, got {hidden}')
    _checks.inner_contiguous(op, 'x', x)
    device = _checks.on_one_cuda_device(op, x=x)
    out = x.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    sf = x.new_empty((num_tokens, -(-hidden // num_per_channels)), dtype=torch.float32)
    if num_tokens == 0:
        return out, sf
    find_kernel('quant.per_token_cast', per_token_cast_spec(x, num_per_channels, round_sf), device)(device, {'x': x, 'out': out, 'out_sf': sf})
    return out, sf


def per_token_cast_spec(x: torch.Tensor, num_per_channels: int, round_sf: bool) -> dict:
    """The spec that serves `x`: the 16-byte vector variant when its pointer and row stride allow it."""
    row_bytes = x.stride(0) * x.element_size() if x.shape[0] > 1 else 0  # one row: the stride is unused
    aligned = (x.data_ptr() | row_bytes) % _VECTOR_BYTES == 0
    return dict(in_dtype=_IN_DTYPES[x.dtype], hidden=x.shape[1], num_per_channels=num_per_channels, round_sf=round_sf, aligned=aligned)
