"""mhc_post_fwd / _bwd: the next residual streams from a layer's output and the current streams (upstream TileKernels'
``mhc_post_fwd`` / ``mhc_post_bwd``, same signatures)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _stream_checks as checks

FWD = 'mhc.post_fwd'
BWD = 'mhc.post_bwd'


def _inputs(op: str, x: object, residual: object, post_layer_mix: object, comb_res_mix: object) -> tuple[tuple[int, ...], int, int]:
    mhc, h = checks.streams(op, 'residual', residual)
    lead = checks.leading(residual, 2)
    checks.tail_tensor(op, 'x', x, torch.bfloat16, 1)
    checks.expect_shape(op, 'x', x, (*lead, h), "residual's token dims, then H")
    checks.tail_tensor(op, 'post_layer_mix', post_layer_mix, torch.float32, 2)
    checks.expect_shape(op, 'post_layer_mix', post_layer_mix, (*lead, mhc, 1), "residual's token dims, then (mhc, 1)")
    checks.tail_tensor(op, 'comb_res_mix', comb_res_mix, torch.float32, 2)
    checks.expect_shape(op, 'comb_res_mix', comb_res_mix, (*lead, mhc, mhc), "residual's token dims, then (mhc, mhc)")
    for name, t in (('x', x), ('residual', residual), ('post_layer_mix', post_layer_mix), ('comb_res_mix', comb_res_mix)):
        _checks.contiguous(op, name, t)
    return lead, mhc, h


@_plans.launch_plan
def mhc_post_fwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[..., o, :] = post_layer_mix[..., o, 0] * x + sum over i of comb_res_mix[..., i, o] * residual[..., i, :]``.

    Args:
        x: ``[..., H]`` bfloat16 layer output.
        residual: ``[..., mhc, H]`` bfloat16 streams.
        post_layer_mix: ``[..., mhc, 1]`` float32.
        comb_res_mix: ``[..., mhc, mhc]`` float32.
        out: optional ``[..., mhc, H]`` bfloat16, written and returned (it may be ``residual`` itself).

    Every tensor contiguous; bf16 ones 16-byte aligned, float32 ones aligned to 4 * gcd(mhc, 4) bytes.

    Returns:
        ``[..., mhc, H]`` bfloat16: the sum in fp32 (the post product, then one fma a stream in ascending i), rounded
        once.
    """
    if is_compiling():
        return _custom_ops.mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)
    op = 'mhc_post_fwd'
    lead, mhc, h = _inputs(op, x, residual, post_layer_mix, comb_res_mix)
    tensors = dict(x=x, residual=residual, post_layer_mix=post_layer_mix, comb_res_mix=comb_res_mix)
    if out is not None:
        checks.tail_tensor(op, 'out', out, torch.bfloat16, 2)
        checks.expect_shape(op, 'out', out, tuple(residual.shape), "residual's shape")
        _checks.contiguous(op, 'out', out)
        tensors['out'] = out
    device = _checks.on_one_cuda_device(op, **tensors)
    tokens = checks.num_tokens(lead)
    if tokens == 0:
        return torch.empty_like(residual) if out is None else out
    kernel = find_kernel(FWD, {'mhc': mhc, 'hidden': h}, device)
    checks.aligned(op, kernel, {'x': x, 'residual': residual, **({'out': out} if out is not None else {})},
                   {'post_layer_mix': post_layer_mix, 'comb_res_mix': comb_res_mix})
    if out is None:
        out = torch.empty_like(residual)
    kernel(device, {'x': x.view(tokens, h), 'residual': residual.view(tokens, mhc, h), 'post_mix': post_layer_mix.view(tokens, mhc),
                    'comb_mix': comb_res_mix.view(tokens, mhc * mhc), 'out': out.view(tokens, mhc, h)})
    return out


def mhc_post_bwd(
    x: torch.Tensor,
    residual: torch.Tensor,
    post_layer_mix: torch.Tensor,
    comb_res_mix: torch.Tensor,
    d_o: torch.Tensor,
    fuse_grad_acc: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of :func:`mhc_post_fwd`.

    Args:
        x, residual, post_layer_mix, comb_res_mix: the forward's inputs (as there).
        d_o: ``[..., mhc, H]`` bfloat16 gradient of the output (made contiguous if it is not; then 16-byte aligned).
        fuse_grad_acc: also stash d_residual on residual's storage as ``grad_from_mhc_post``, where the backward of
            mhc_pre_norm_fn and mhc_pre_apply_mix add their residual gradients into it (as upstream).

    Returns:
        ``(d_x, d_residual, d_post_layer_mix, d_comb_res_mix)``, shaped as the inputs: ``d_x = sum over o of post[o]
        * d_o[o]`` and ``d_residual[i] = sum over o of comb[i, o] * d_o[o]`` (bf16), ``d_post[o] = sum over H of x *
        d_o[o]`` and ``d_comb[i, o] = sum over H of residual[i] * d_o[o]`` (float32).
    """
    if is_compiling():
        return _custom_ops.mhc_post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o, fuse_grad_acc)
    if not isinstance(fuse_grad_acc, bool):
        raise TypeError(f'mhc_post_bwd: fuse_grad_acc must be a bool, got {type(fuse_grad_acc).__name__}')
    d_x, d_residual, d_post, d_comb = _post_bwd(x, residual, post_layer_mix, comb_res_mix, d_o)
    if fuse_grad_acc:
        residual.untyped_storage().grad_from_mhc_post = d_residual
    return d_x, d_residual, d_post, d_comb


@_plans.launch_plan
def _post_bwd(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
              d_o: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mhc_post_bwd but the stash (a Python side effect, which a launch plan does not repeat)."""
    op = 'mhc_post_bwd'
    lead, mhc, h = _inputs(op, x, residual, post_layer_mix, comb_res_mix)
    checks.tail_tensor(op, 'd_o', d_o, torch.bfloat16, 2)
    checks.expect_shape(op, 'd_o', d_o, tuple(residual.shape), "residual's shape")
    device = _checks.on_one_cuda_device(op, x=x, residual=residual, post_layer_mix=post_layer_mix, comb_res_mix=comb_res_mix, d_o=d_o)
    tokens = checks.num_tokens(lead)
    kernel = find_kernel(BWD, {'mhc': mhc, 'hidden': h}, device) if tokens else None
    if kernel is not None:
        d_o = d_o.contiguous()
        checks.aligned(op, kernel, {'x': x, 'residual': residual, 'd_o': d_o}, {'post_layer_mix': post_layer_mix, 'comb_res_mix': comb_res_mix})
    d_x, d_residual = torch.empty_like(x), torch.empty_like(residual)
    d_post, d_comb = torch.empty_like(post_layer_mix), torch.empty_like(comb_res_mix)
    if kernel is not None:
        kernel(device, {
            'd_o': d_o.view(tokens, mhc, h), 'x': x.view(tokens, h), 'residual': residual.view(tokens, mhc, h),
            'post_mix': post_layer_mix.view(tokens, mhc), 'comb_mix': comb_res_mix.view(tokens, mhc * mhc),
            'd_x': d_x.view(tokens, h), 'd_residual': d_residual.view(tokens, mhc, h), 'd_post': d_post.view(tokens, mhc),
            'd_comb': d_comb.view(tokens, mhc * mhc)})
    return d_x, d_residual, d_post, d_comb
