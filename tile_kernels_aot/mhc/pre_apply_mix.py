"""mhc_pre_apply_mix_fwd / _bwd: a layer's input as the weighted sum of the residual streams (upstream TileKernels'
``_mhc_pre_apply_mix_fwd`` / ``_bwd``)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _stream_checks as checks

FWD = 'mhc.pre_apply_mix_fwd'
BWD = 'mhc.pre_apply_mix_bwd'


def _inputs(op: str, x: object, mix: object) -> tuple[tuple[int, ...], int, int]:
    mhc, h = checks.streams(op, 'x', x)
    lead = checks.leading(x, 2)
    checks.tail_tensor(op, 'mix', mix, torch.float32, 2)
    checks.expect_shape(op, 'mix', mix, (*lead, mhc, 1), "x's token dims, then (mhc, 1)")
    _checks.contiguous(op, 'x', x)
    _checks.contiguous(op, 'mix', mix)
    return lead, mhc, h


@_plans.launch_plan
def mhc_pre_apply_mix_fwd(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Mix the streams of each token into one hidden state.

    Args:
        x: ``[..., mhc, H]`` bfloat16 residual streams, contiguous, 16-byte aligned.
        mix: ``[..., mhc, 1]`` float32 weights, contiguous, aligned to 4 * gcd(mhc, 4) bytes.
        out: optional ``[..., H]`` bfloat16, contiguous, 16-byte aligned, written and returned.

    Returns:
        ``[..., H]`` bfloat16: ``sum over m of mix[..., m, 0] * x[..., m, :]`` in fp32 (m ascending, one fma a
        stream after the first product), rounded once.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_apply_mix_fwd(x, mix, out)
    op = 'mhc_pre_apply_mix_fwd'
    lead, mhc, h = _inputs(op, x, mix)
    if out is not None:
        checks.tail_tensor(op, 'out', out, torch.bfloat16, 1)
        checks.expect_shape(op, 'out', out, (*lead, h), "x's token dims, then H")
        _checks.contiguous(op, 'out', out)
        device = _checks.on_one_cuda_device(op, x=x, mix=mix, out=out)
    else:
        device = _checks.on_one_cuda_device(op, x=x, mix=mix)
    tokens = checks.num_tokens(lead)
    if tokens == 0:
        return x.new_empty((*lead, h)) if out is None else out
    kernel = find_kernel(FWD, {'mhc': mhc, 'hidden': h}, device)
    checks.aligned(op, kernel, {'x': x, **({'out': out} if out is not None else {})}, {'mix': mix})
    if out is None:
        out = x.new_empty((*lead, h))
    kernel(device, {'x': x.view(tokens, mhc, h), 'mix': mix.view(tokens, mhc), 'out': out.view(tokens, h)})
    return out


@_plans.launch_plan
def mhc_pre_apply_mix_bwd(o_grad: torch.Tensor, x: torch.Tensor, mix: torch.Tensor, x_grad: torch.Tensor) -> torch.Tensor:
    """The gradients of :func:`mhc_pre_apply_mix_fwd`.

    Args:
        o_grad: ``[..., H]`` bfloat16 gradient of the output (made contiguous if it is not; then 16-byte aligned).
        x, mix: the forward's inputs.
        x_grad: ``[..., mhc, H]`` bfloat16, contiguous, 16-byte aligned: ``mix_m * o_grad`` is added into it in
            place (fp32, one fma, rounded back to bf16).

    Returns:
        mix_grad, ``[..., mhc, 1]`` float32: ``sum over H of o_grad * x[..., m, :]``.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_apply_mix_bwd(o_grad, x, mix, x_grad)
    op = 'mhc_pre_apply_mix_bwd'
    lead, mhc, h = _inputs(op, x, mix)
    checks.tail_tensor(op, 'o_grad', o_grad, torch.bfloat16, 1)
    checks.expect_shape(op, 'o_grad', o_grad, (*lead, h), "x's token dims, then H")
    checks.tail_tensor(op, 'x_grad', x_grad, torch.bfloat16, 2)
    checks.expect_shape(op, 'x_grad', x_grad, tuple(x.shape), "x's shape")
    _checks.contiguous(op, 'x_grad', x_grad)
    device = _checks.on_one_cuda_device(op, o_grad=o_grad, x=x, mix=mix, x_grad=x_grad)
    tokens = checks.num_tokens(lead)
    if tokens == 0:
        return mix.new_empty(mix.shape)
    kernel = find_kernel(BWD, {'mhc': mhc, 'hidden': h}, device)
    o_grad = o_grad.contiguous()
    checks.aligned(op, kernel, {'o_grad': o_grad, 'x': x, 'x_grad': x_grad}, {'mix': mix})
    mix_grad = mix.new_empty(mix.shape)
    kernel(device, {'o_grad': o_grad.view(tokens, h), 'x': x.view(tokens, mhc, h), 'mix': mix.view(tokens, mhc),
                    'x_grad': x_grad.view(tokens, mhc, h), 'mix_grad': mix_grad.view(tokens, mhc)})
    return mix_grad
