"""Block-scaled FP8 casts, written for clarity rather than speed.

The arithmetic follows the kernels operation for operation so that results compare bit for bit:
amax in float32, clamped = max(amax, 1e-4), sf = clamped / 448, multiplier = 448 / clamped (two
divisions, not one division and a reciprocal), or with round_sf the power of two at or above sf and its
exact inverse; then x * multiplier in float32, saturated to +-448 and rounded to nearest even in e4m3.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E4M3_AMAX_FLOOR = 1e-4


def _blocks(x: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """x as float32 padded to whole blocks, viewed (Mb, bm, Kb, bk), plus the mask of real elements."""
    bm, bk = block
    m, k = x.shape
    pm, pk = -m % bm, -k % bk
    padded = torch.nn.functional.pad(x.float(), (0, pk, 0, pm))
    real = torch.nn.functional.pad(torch.ones_like(x, dtype=torch.bool), (0, pk, 0, pm))
    shape = ((m + pm) // bm, bm, (k + pk) // bk, bk)
    return padded.view(shape), real.view(shape)


def _round_up_pow2(sf: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= sf, for positive normal float32 sf."""
    bits = sf.view(torch.int32)
    return ((bits + 0x7FFFFF) & 0x7F800000).view(torch.float32)


def cast(
    x: torch.Tensor,
    fmt: str,
    block_size: tuple[int, int],
    sf: torch.Tensor | None = None,
    round_sf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Quantise a 2-D bf16/fp32 tensor to e4m3 with one float32 scale factor per `block_size` block.

    Returns (data, sf) with sf row-major of shape (ceil(M / bm), ceil(K / bk)); with a given `sf` (the
    precomputed case) returns only the data, quantised with multiplier 1 / sf.
    """
    if fmt != 'e4m3':
        raise NotImplementedError(f'reference cast: fmt={fmt!r} is not implemented yet, only e4m3')
    if x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f'reference cast: x must be a 2-D bfloat16/float32 tensor, got {x.dim()}-d {x.dtype}')
    m, k = x.shape
    blocks, real = _blocks(x, block_size)
    if sf is None:
        amax = torch.where(real, blocks.abs(), torch.zeros((), device=x.device)).amax(dim=(1, 3))
        clamped = amax.clamp(min=E4M3_AMAX_FLOOR)
        scale = clamped / torch.full_like(clamped, E4M3_MAX)
        if round_sf:
            scale = _round_up_pow2(scale)
            multiplier = 1.0 / scale
        else:
            multiplier = torch.full_like(clamped, E4M3_MAX) / clamped
    else:
        scale = sf
        multiplier = 1.0 / sf
    q = blocks * multiplier[:, None, :, None]
    q = q.clamp(-E4M3_MAX, E4M3_MAX).reshape(blocks.shape[0] * blocks.shape[1], blocks.shape[2] * blocks.shape[3])[:m, :k]
    data = q.to(torch.float8_e4m3fn)
    return data if sf is not None else (data, scale.contiguous())


def cast_back(x: tuple[torch.Tensor, torch.Tensor], fmt: str, block_size: tuple[int, int]) -> torch.Tensor:
    """Dequantise (data, row-major float32 sf) back to 'fp32' or 'bf16': data * sf per block."""
    data, sf = x
    m, k = data.shape
    expanded = sf.repeat_interleave(block_size[0], dim=0).repeat_interleave(block_size[1], dim=1)[:m, :k]
    out = data.float() * expanded
    return out if fmt == 'fp32' else out.to(torch.bfloat16)
