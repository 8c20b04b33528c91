"""Per-channel e4m3 casts (blocks of (num_per_tokens, 1)), written for clarity rather than speed.

Per channel and block of tokens: amax in float32 (rows past the end do not count), clamped =
max(amax, 1e-4), sf = clamped / 448 and multiplier 448 / clamped (two divisions), or with round_sf the
power of two at or above sf and its exact inverse; q = e4m3(clamp(x * multiplier, -448, 448)), rounded to
nearest even. An e4m3 input (data, sf) is first dequantised to float32, data * sf per (1, 128) block.
Scale factors are float32 [ceil(M / num_per_tokens), K], row-major.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from tile_kernels_aot.reference.cast import cast, cast_back


def _quantize(values: torch.Tensor, num_per_tokens: int, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 data, float32 sf) of float32 values [M, K] with blocks of (num_per_tokens, 1): reference.cast's
    arithmetic, whose padding rows do not count in the amax."""
    return cast(values, 'e4m3', (num_per_tokens, 1), round_sf=round_sf)


def _values(x: Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]], num_per_channels: Optional[int]) -> torch.Tensor:
    if isinstance(x, tuple):
        return cast_back(x, 'fp32', (1, num_per_channels))
    return x.float()


def per_channel_cast_fused(
    x: Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]],
    num_per_tokens: int,
    num_per_channels: Optional[int],
    round_sf: bool,
    pos_to_token: Optional[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's torch reference signature: optional gather (row r = x[pos_to_token[r]], zeros where
    negative), optional dequantisation of an e4m3 (data, sf) input with (1, num_per_channels) blocks,
    then the per-channel cast."""
    values = _values(x, num_per_channels)
    if pos_to_token is not None:
        pos = pos_to_token.long()
        values = torch.where((pos >= 0)[:, None], values[pos.clamp(min=0)], torch.zeros((), device=values.device))
    return _quantize(values, num_per_tokens, round_sf)


def per_channel_cast(x: torch.Tensor, num_per_tokens: int, round_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(data [M, K], sf [ceil(M / num_per_tokens), K]) of a bf16/fp32 x."""
    return _quantize(x.float(), num_per_tokens, round_sf)


def per_channel_cast_and_transpose(x: torch.Tensor, num_per_tokens: int, round_sf: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(data transposed [K, M] contiguous, sf [ceil(M / num_per_tokens), K])."""
    data, sf = _quantize(x.float(), num_per_tokens, round_sf)
    return data.T.contiguous(), sf
