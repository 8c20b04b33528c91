"""SwiGLU references, written for clarity: upstream TileKernels v1's torch/swiglu.py functions, plus the
three fused ops composed from them and the block casts, operation for operation as the kernels, so that
results compare bit for bit on the same device (torch's CUDA exp and division are the kernels' expf and
IEEE division; on CPU torch's exp may differ in the last bit).

    act = l / (1 + exp(-l)) * r     with l = min(l, c), r = clamp(r, -c, c) when a clamp value c is given.
"""

from __future__ import annotations

from typing import Optional

import torch

from tile_kernels_aot.reference.cast import E4M3_AMAX_FLOOR, E4M3_MAX, _empty_sf, _format_sf, cast, cast_back
from tile_kernels_aot.reference.moe import fma_f32


def _row_weights(pos_to_token_topk: torch.Tensor, topk_weights: torch.Tensor, num_rows: int) -> torch.Tensor:
    """float32 [num_rows]: topk_weights.flatten()[pos_to_token_topk], 0 where the index is negative."""
    flat = topk_weights.reshape(-1).float()
    index = pos_to_token_topk.long()
    w = torch.zeros(num_rows, dtype=torch.float32, device=topk_weights.device)
    valid = index >= 0
    w[valid] = flat[index[valid]]
    return w


def _clamp(l: torch.Tensor, r: torch.Tensor, c: Optional[float]) -> tuple[torch.Tensor, torch.Tensor]:
    if c is None:
        return l, r
    return torch.clamp(l, max=c), torch.clamp(r, min=-c, max=c)


def swiglu_forward(
    x: torch.Tensor,
    pos_to_token_topk: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    swiglu_clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """float32 [N, hidden] = act(x) (times the row's routing weight with pos_to_token_topk, 0 for a negative
    index). With clamped_count (int64 [3]) and a clamp value, adds the counts of l > c, r > c, r < -c."""
    hidden = x.shape[1] // 2
    xf = x.float()
    l, r = xf[:, :hidden], xf[:, hidden:]
    c = swiglu_clamp_value
    if c is not None and clamped_count is not None:
        clamped_count[0] += (l > c).sum()
        clamped_count[1] += (r > c).sum()
        clamped_count[2] += (r < -c).sum()
    l, r = _clamp(l, r, c)
    out = l / (1.0 + torch.exp(-l)) * r
    if pos_to_token_topk is not None:
        out = out * _row_weights(pos_to_token_topk, topk_weights, x.shape[0]).unsqueeze(1)
    return out


def _scale(amax: torch.Tensor, floor: float, round_sf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sf, multiplier) float32 of block amaxes, as the kernels: the power of two at or above sf is
    2^(((bits(sf) - 1) >> 23) + 1 - 127) and its exact inverse."""
    clamped = amax.clamp(min=floor)
    sf = clamped / torch.full_like(clamped, E4M3_MAX)
    if not round_sf:
        return sf, torch.full_like(clamped, E4M3_MAX) / clamped
    exponent = ((sf.view(torch.int32).long() - 1) >> 23) + 1  # biased
    return (exponent << 23).to(torch.int32).view(torch.float32), ((254 - exponent) << 23).to(torch.int32).view(torch.float32)


def _per_token_cast(v: torch.Tensor, block: int, floor: float, round_sf: bool, col_major: bool, packed: bool):
    """e4m3 cast of float32 [M, K] in (1, block) blocks (K a multiple of block), scale factors in the layout asked."""
    m, k = v.shape
    blocks = v.view(m, k // block, block)
    sf, multiplier = _scale(blocks.abs().amax(dim=2) if m else blocks.new_zeros((0, k // block)), floor, round_sf)
    data = (blocks * multiplier.unsqueeze(2)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(m, k)
    if m == 0 and col_major:
        return data, _empty_sf(k // block, col_major, packed, v.device)
    return data, _format_sf(sf, col_major, packed)


def swiglu_forward_and_per_token_cast(
    x: torch.Tensor,
    fmt: str,
    num_per_channels: int,
    pos_to_token_topk: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
    pos_to_expert: Optional[torch.Tensor] = None,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    swiglu_clamp_value: Optional[float] = None,
    clamped_count: Optional[torch.Tensor] = None,
    sf_clamp_min: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """swiglu_forward, then an e4m3 cast per (1, num_per_channels) block. Rows with pos_to_expert < 0 (which
    the op leaves unwritten) come out as the cast of a zero row, as in upstream's test; their clamp counts
    are excluded, as the op skips them."""
    if fmt != 'e4m3':
        raise ValueError(f"reference swiglu_forward_and_per_token_cast: fmt must be 'e4m3', got {fmt!r}")
    if pos_to_expert is not None and clamped_count is not None:
        kept = pos_to_expert >= 0
        swiglu_forward(x[kept], None, None, swiglu_clamp_value, clamped_count)
        clamped_count = None
    act = swiglu_forward(x, pos_to_token_topk, topk_weights, swiglu_clamp_value, clamped_count)
    if pos_to_expert is not None:
        act = act.masked_fill((pos_to_expert < 0).unsqueeze(1), 0)
    floor = E4M3_AMAX_FLOOR if sf_clamp_min is None else sf_clamp_min
    return _per_token_cast(act, num_per_channels, floor, round_sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)


def swiglu_forward_and_per_channel_cast_and_transpose(
    x: torch.Tensor,
    fmt: str,
    num_per_tokens: int,
    round_sf: bool = False,
    without_transpose: bool = False,
    swiglu_clamp_value: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """act rounded to bf16, cast per (num_per_tokens, 1) block; data transposed to [hidden, T] unless
    without_transpose. Scale factors float32 [T / num_per_tokens, hidden]."""
    if fmt != 'e4m3':
        raise ValueError(f"reference swiglu_forward_and_per_channel_cast_and_transpose: fmt must be 'e4m3', got {fmt!r}")
    act = swiglu_forward(x, swiglu_clamp_value=swiglu_clamp_value).bfloat16()
    data, sf = cast(act, 'e4m3', (num_per_tokens, 1), round_sf=round_sf)
    return (data if without_transpose else data.T.contiguous()), sf


def swiglu_backward(
    x: tuple[torch.Tensor, torch.Tensor],
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    num_per_channels: int,
    swiglu_clamp_value: Optional[float] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out float32 [N, hidden] = act * w, x_grad float32 [N, 2 * hidden], weight_grad float32 [T, K]), as
    upstream's torch/swiglu.py: x dequantised as float(q) * sf; s = 1 / (1 + exp(-l)); gws = g * w * s;
    dl = gws * r * fma(l, 1 - s, 1) and dr = gws * l, zero where the input was clamped;
    weight_grad[t, k] = sum over the row of g * act (0 for slots no row maps to)."""
    data, sf = x
    hidden = data.shape[-1] // 2
    data = data.reshape(-1, 2 * hidden)
    grad = grad_out.reshape(-1, hidden).float()
    xf = cast_back((data, sf), 'fp32', (1, num_per_channels))
    l, r = xf[:, :hidden], xf[:, hidden:]
    c = swiglu_clamp_value
    if c is not None:
        clamped_l = l > c
        clamped_r = (r > c) | (r < -c)
    l, r = _clamp(l, r, c)
    denominator = 1.0 + torch.exp(-l)
    sig = torch.ones_like(l) / denominator
    w = _row_weights(pos_to_token_topk, weight, data.shape[0]).unsqueeze(1)
    gws = grad * w * sig
    dl = gws * r * fma_f32(l, 1.0 - sig, torch.ones_like(l))
    dr = gws * l
    if c is not None:
        dl = dl.masked_fill(clamped_l, 0.0)
        dr = dr.masked_fill(clamped_r, 0.0)
    act = l / denominator * r
    weight_grad = torch.zeros_like(weight, dtype=torch.float32)
    index = pos_to_token_topk.long()
    valid = index >= 0
    weight_grad.view(-1)[index[valid]] = (grad * act).sum(dim=1)[valid]
    return act * w, torch.cat([dl, dr], dim=1), weight_grad


def swiglu_backward_and_per_token_cast(
    x: tuple[torch.Tensor, torch.Tensor],
    grad_out: torch.Tensor,
    weight: torch.Tensor,
    pos_to_token_topk: torch.Tensor,
    token_topk_to_pos: torch.Tensor,
    num_per_channels: int,
    round_sf: bool = False,
    swiglu_clamp_value: Optional[float] = None,
):
    """(out bf16, (x_grad e4m3, sf float32 row-major), x_grad bf16, weight_grad float32): swiglu_backward,
    with x_grad cast per (1, num_per_channels) block from its float32 values."""
    out, x_grad, weight_grad = swiglu_backward(x, grad_out, weight, pos_to_token_topk, token_topk_to_pos, num_per_channels,
                                               swiglu_clamp_value)
    q, sf = _per_token_cast(x_grad, num_per_channels, E4M3_AMAX_FLOOR, round_sf, False, False)
    return out.bfloat16(), (q, sf), x_grad.bfloat16(), weight_grad
