"""Manifold hyper-connection (mHC) references in plain PyTorch, with upstream TileKernels' names.

A residual stream of `mhc` copies (..., mhc, H) is mixed around every sublayer: the pre step turns the
residual into the sublayer's input with a norm, a small projection and a Sinkhorn-normalised mixing matrix;
the post step writes the sublayer's output back into the streams. These are differentiable with torch
autograd, which is what the GPU tests compare the kernels' backward passes against.
"""

from __future__ import annotations

import torch

__all__ = [
    'expand_to_mhc_ref', 'mhc_head_compute_mix_ref', 'mhc_head_ref', 'mhc_post_ref', 'mhc_pre_apply_mix_ref',
    'mhc_pre_norm_fn_ref', 'mhc_pre_ref', 'mhc_pre_split_mixes_ref', 'sinkhorn_normalize_ref',
]


def expand_to_mhc_ref(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    """(..., H) -> (..., mhc_mult, H): every stream starts as a copy of the hidden state."""
    return hidden.unsqueeze(-2).expand(*hidden.shape[:-1], mhc_mult, hidden.shape[-1]).contiguous()


def sinkhorn_normalize_ref(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """Row softmax plus eps, a column normalisation, then repeat - 1 rounds of row and column normalisation
    (each a division by the sum plus eps) over the last two dims."""
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def mhc_head_compute_mix_ref(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                             mhc_pre_eps: float) -> torch.Tensor:
    """sigmoid(input_mix * scale + base) + pre_eps: the head's mixing weights of the streams."""
    return torch.sigmoid(input_mix * mhc_scale + mhc_base) + mhc_pre_eps


def mhc_pre_split_mixes_ref(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                            mhc_post_mult_value: float, mhc_pre_eps: float
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split (a, b, mhc * (mhc + 2)) mixes into the pre weights (a, b, mhc, 1), the post weights (a, b, mhc, 1)
    and the residual mixing matrix (a, b, mhc, mhc), each group scaled by its entry of `mhc_scale` (3,) and
    shifted by `mhc_base`."""
    a, b = input_mixes.shape[:2]
    scale = torch.cat([mhc_scale[0].expand(mhc_mult), mhc_scale[1].expand(mhc_mult), mhc_scale[2].expand(mhc_mult * mhc_mult)])
    mixes = input_mixes * scale + mhc_base
    pre = mixes[:, :, :mhc_mult].sigmoid().unsqueeze(-1) + mhc_pre_eps
    post = (mixes[:, :, mhc_mult:2 * mhc_mult].sigmoid() * mhc_post_mult_value).unsqueeze(-1)
    comb = mixes[:, :, 2 * mhc_mult:].view(a, b, mhc_mult, mhc_mult)
    return pre, post, comb


def mhc_pre_apply_mix_ref(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """The sublayer input: sum over streams of mix (..., mhc, 1) times x (..., mhc, H), in float, then bf16."""
    return (x * mix).sum(-2).bfloat16()


def mhc_post_ref(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                 comb_res_mix: torch.Tensor) -> torch.Tensor:
    """New streams: out[o] = post[o] * x + sum_i comb[i, o] * residual[i], in float, then bf16."""
    mixed = torch.einsum('abmn,abmc->abnc', comb_res_mix, residual.float())
    return (x.float().unsqueeze(-2) * post_layer_mix + mixed).bfloat16()


def mhc_pre_norm_fn_ref(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                        mhc_norm_eps: float) -> torch.Tensor:
    """The mixes of the pre step: the flattened streams (a, b, mhc * H) projected by fn (mhc3, mhc * H) (times
    the norm weight, if given), scaled by the RMS norm rsqrt(mean(x^2) + eps) of the flattened streams."""
    if mhc_norm_weight is not None:
        mhc_fn = mhc_fn * mhc_norm_weight
    x = residual.flatten(2, 3).float()
    if mhc_fn.dtype != torch.float32:
        raise TypeError(f'mhc_pre_norm_fn_ref: fn must be float32, got {mhc_fn.dtype}')
    width = mhc_fn.shape[-1]
    mixes = torch.einsum('mbk,nbk->mbn', x.view(-1, 1, width), mhc_fn.view(mhc_fn.shape[0], 1, width))
    sqrsum = x.view(-1, 1, width).square().sum(-1)
    mixes = (mixes * (sqrsum.unsqueeze(-1) / width + mhc_norm_eps).rsqrt()).sum(-2)
    return mixes.view(*x.shape[:2], mhc_fn.shape[0])


def mhc_pre_ref(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
                post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6,
                sinkhorn_repeat: int = 10) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The whole pre step of one sublayer, composed of the references above (upstream's mhc_pre)."""
    mixes = mhc_pre_norm_fn_ref(residual, fn, norm_weight, norm_eps)
    pre, post, comb = mhc_pre_split_mixes_ref(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb = sinkhorn_normalize_ref(comb, sinkhorn_repeat, sinkhorn_eps)
    return mhc_pre_apply_mix_ref(residual, pre), (post, comb)


def mhc_head_ref(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                 norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
                 pre_eps: float = 1e-6) -> torch.Tensor:
    """The head's input from the streams (upstream's mhc_head): fn is (mhc, mhc * H)."""
    mixes = mhc_pre_norm_fn_ref(residual, fn, norm_weight, norm_eps)[..., :mhc_mult]
    mix = mhc_head_compute_mix_ref(mixes, scale.reshape(1), base, pre_eps)
    return mhc_pre_apply_mix_ref(residual, mix.unsqueeze(-1))
