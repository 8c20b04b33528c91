"""EngramGateFn: the Engram gate with its fused RMSNorm weights as one autograd op (upstream's signature)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot.engram import _check_gate_fwd, engram_gate_bwd, engram_gate_fwd, fused_weight, grad_w_reduce


def _check_shapes(hidden_states, k, v) -> None:
    """The shapes the reshapes of forward rely on, refused with the op's name (engram_gate_fwd checks the rest)."""
    for name, t in (('hidden_states', hidden_states), ('k', k), ('v', v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f'engram_gate: {name} must be a torch.Tensor, got {type(t).__name__}')
    shape = tuple(hidden_states.shape)
    if len(shape) < 2 or 0 in shape[-2:] or tuple(k.shape) != shape or tuple(v.shape) != shape[:-2] + shape[-1:]:
        raise ValueError(f'engram_gate: hidden_states must be [*, 4, H] (H > 0), k of its shape and v [*, H], got shapes {shape}, '
                         f'{tuple(k.shape)} and {tuple(v.shape)}')


class EngramGateFn(torch.autograd.Function):
    """out = x + sigmoid(signed_sqrt(dot(RMSNorm(x, wh), RMSNorm(k, we)) / sqrt(H))) * v, per stream.

    Args (of ``apply``):
        hidden_states: ``[*, 4, H]`` bf16.
        k: ``[*, 4, H]`` bf16 (its rows may be strided, as engram_gate_fwd takes them).
        v: ``[*, H]`` bf16.
        weight_hidden, weight_embed: ``[4, H]`` bf16 RMSNorm weights of x and k.
        clamp_value: floor of the gate's ``|s|`` before the square root.
        eps: RMSNorm epsilon.

    Returns ``[*, 4, H]`` bf16. In backward, a weight with a ``main_grad`` attribute (an fp32 ``[4, H]`` buffer) gets
    its gradient added into it in place and None is returned for it; otherwise a new fp32 gradient is returned.
    """

    @staticmethod
    def forward(ctx, hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps):
        _check_shapes(hidden_states, k, v)
        shape = hidden_states.shape
        hc, hidden = shape[-2], shape[-1]
        x = hidden_states.reshape(-1, hc, hidden)
        k = k.reshape(-1, hc, hidden)
        v = v.reshape(-1, hidden)
        if not is_compiling():  # everything engram_gate_fwd checks, before fused_weight launches
            _check_gate_fwd('engram_gate', x, k, v, None, eps, clamp_value, True, weight_hidden=weight_hidden, weight_embed=weight_embed)
        weight_fused = fused_weight(weight_hidden, weight_embed)
        out, dot, gate, rstd_x, rstd_k = engram_gate_fwd(x, k, v, weight_fused, eps, clamp_value, save_for_backward=True)
        ctx.save_for_backward(x, k, v, weight_hidden, weight_embed, weight_fused, dot, gate, rstd_x, rstd_k)
        ctx.clamp_value = clamp_value
        ctx.shape = shape
        return out.view(shape)

    @staticmethod
    def backward(ctx, grad_output):
        x, k, v, weight_hidden, weight_embed, weight_fused, dot, gate, rstd_x, rstd_k = ctx.saved_tensors
        shape = ctx.shape
        grad_out = grad_output.reshape(x.shape).contiguous()
        grad_x, grad_k, grad_v, grad_w_partial = engram_gate_bwd(grad_out, x, k, v, weight_fused, dot, gate, rstd_x, rstd_k,
                                                                 ctx.clamp_value)
        main_wh = getattr(weight_hidden, 'main_grad', None)
        main_we = getattr(weight_embed, 'main_grad', None)
        grad_wh = main_wh if main_wh is not None else torch.zeros_like(weight_hidden, dtype=torch.float32)
        grad_we = main_we if main_we is not None else torch.zeros_like(weight_embed, dtype=torch.float32)
        grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_wh, grad_we)
        return (grad_x.view(shape), grad_k.view(shape), grad_v.view(*shape[:-2], shape[-1]),
                None if main_wh is not None else grad_wh, None if main_we is not None else grad_we, None, None)


engram_gate = EngramGateFn.apply
