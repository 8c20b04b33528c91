"""expand_to_mhc_fwd / _bwd: a hidden state copied into mhc residual streams, and its gradient summed back (upstream
TileKernels' ``expand_to_mhc_fwd_tl`` / ``expand_to_mhc_bwd_tl`` behind ``expand_to_mhc``)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _stream_checks as checks

FWD = 'mhc.expand_to_mhc_fwd'
BWD = 'mhc.expand_to_mhc_bwd'


@_plans.launch_plan
def expand_to_mhc_fwd(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Copy each token's hidden state into ``mhc_mult`` streams.

    Args:
        hidden: ``[..., H]`` bfloat16, contiguous, 16-byte aligned.
        mhc_mult: the stream count, ``>= 1`` (a prebuilt spec's mhc).
        out: optional ``[..., mhc_mult, H]`` bfloat16, contiguous, 16-byte aligned, written and returned.

    Returns:
        ``[..., mhc_mult, H]`` bfloat16: ``out[..., m, :] = hidden`` for every m.
    """
    if is_compiling():
        return _custom_ops.expand_to_mhc_fwd(hidden, mhc_mult, out)
    op = 'expand_to_mhc_fwd'
    checks.tail_tensor(op, 'hidden', hidden, torch.bfloat16, 1)
    _checks.integer(op, 'mhc_mult', mhc_mult, low=1)
    _checks.contiguous(op, 'hidden', hidden)
    lead, h = tuple(hidden.shape[:-1]), hidden.shape[-1]
    if out is not None:
        checks.tail_tensor(op, 'out', out, torch.bfloat16, 2)
        checks.expect_shape(op, 'out', out, (*lead, mhc_mult, h), "hidden's shape with mhc_mult streams")
        _checks.contiguous(op, 'out', out)
        device = _checks.on_one_cuda_device(op, hidden=hidden, out=out)
    else:
        device = _checks.on_one_cuda_device(op, hidden=hidden)
    tokens = checks.num_tokens(lead)
    if tokens == 0:
        return hidden.new_empty((*lead, mhc_mult, h)) if out is None else out
    kernel = find_kernel(FWD, {'mhc': mhc_mult, 'hidden': h}, device)
    checks.aligned(op, kernel, {'hidden': hidden, **({'out': out} if out is not None else {})})
    if out is None:
        out = hidden.new_empty((*lead, mhc_mult, h))
    kernel(device, {'x': hidden.view(tokens, h), 'out': out.view(tokens, mhc_mult, h)})
    return out


@_plans.launch_plan
def expand_to_mhc_bwd(out_grad: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`expand_to_mhc_fwd`: the sum over the streams.

    Args:
        out_grad: ``[..., mhc, H]`` bfloat16 (made contiguous if it is not; then 16-byte aligned).

    Returns:
        ``[..., H]`` bfloat16: ``sum over m of out_grad[..., m, :]``, added in fp32 in ascending m, rounded once.
    """
    if is_compiling():
        return _custom_ops.expand_to_mhc_bwd(out_grad)
    op = 'expand_to_mhc_bwd'
    mhc, h = checks.streams(op, 'out_grad', out_grad)
    lead = checks.leading(out_grad, 2)
    device = _checks.on_one_cuda_device(op, out_grad=out_grad)
    tokens = checks.num_tokens(lead)
    if tokens == 0:
        return out_grad.new_empty((*lead, h))
    kernel = find_kernel(BWD, {'mhc': mhc, 'hidden': h}, device)
    out_grad = out_grad.contiguous()
    checks.aligned(op, kernel, {'out_grad': out_grad})
    x_grad = out_grad.new_empty((*lead, h))
    kernel(device, {'out_grad': out_grad.view(tokens, mhc, h), 'x_grad': x_grad.view(tokens, h)})
    return x_grad
