"""Engram references (upstream's tile_kernels.torch.engram names): n-gram hashing and the gate, in plain torch.

engram_gate_ref is differentiable, so torch autograd of it is the backward oracle; fused_weight_ref and
grad_w_reduce_ref are the two small ops around it.
"""

from __future__ import annotations

import torch


def make_offsets(vocab_sizes: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sums of each layer's table sizes: ``[L, N-1, M]`` int32 -> ``[L, (N-1) * M]`` int32."""
    flat = vocab_sizes.reshape(vocab_sizes.shape[0], -1)
    return (flat.cumsum(1, dtype=torch.int32) - flat).to(torch.int32)


def engram_hash_ref(
    ngram_token_ids: torch.Tensor,
    multipliers: torch.Tensor,
    vocab_sizes: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """``[L, T, (N-1) * M]`` int32 table indices: h_n = h_{n-1} XOR id_n * m[l, n] (int64, wrapping), index =
    (h_n mod vocab_sizes[l, n-1, j]) + offsets[l, (n-1) * M + j] with torch's floored modulus."""
    max_ngram_size = multipliers.shape[1]
    products = ngram_token_ids.to(torch.int64).unsqueeze(0) * multipliers.unsqueeze(1)  # [L, T, N]
    mixed = products[:, :, 0]
    columns = []
    for n in range(1, max_ngram_size):
        mixed = mixed ^ products[:, :, n]
        columns.append(torch.remainder(mixed.unsqueeze(-1), vocab_sizes[:, n - 1].to(torch.int64).unsqueeze(1)).to(torch.int32))
    return torch.cat(columns, dim=-1) + offsets.unsqueeze(1)


def fused_weight_ref(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    return weight_hidden.float() * weight_embed.float()


def engram_gate_ref(
    hidden_states: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    weight_hidden: torch.Tensor,
    weight_embed: torch.Tensor,
    clamp_value: float,
    eps: float,
    save_for_backward: bool = False,
):
    """out = bf16(x + sigmoid(sign(s) * sqrt(max(|s|, clamp_value))) * v) with s = sum(x * wh * k * we) * rstd_x *
    rstd_k / sqrt(H), all in fp32. With save_for_backward it returns (out, dot, gate, rstd_x, rstd_k), dot being
    the raw sum(x * wh * k * we) that engram_gate_fwd saves."""
    hidden = hidden_states.shape[-1]
    x = hidden_states.float()
    kf = k.float()
    rstd_x = torch.rsqrt(x.square().mean(-1) + eps)
    rstd_k = torch.rsqrt(kf.square().mean(-1) + eps)
    dot = ((x * weight_hidden.float()) * (kf * weight_embed.float())).sum(-1)
    s = dot * rstd_x * rstd_k * hidden ** -0.5
    gate = (s.abs().clamp_min(clamp_value).sqrt() * s.sign()).sigmoid()
    out = (x + gate.unsqueeze(-1) * v.float().unsqueeze(-2)).bfloat16()
    if save_for_backward:
        return out, dot, gate, rstd_x, rstd_k
    return out


def grad_w_reduce_ref(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """In place: grad_weight_hidden += sum(partials) * weight_embed, grad_weight_embed += sum(partials) * weight_hidden."""
    total = grad_w_partial.sum(0)
    grad_weight_hidden += total * weight_embed.float()
    grad_weight_embed += total * weight_hidden.float()
