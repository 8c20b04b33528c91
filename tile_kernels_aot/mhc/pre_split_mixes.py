"""mhc_pre_split_mixes_fwd / _bwd: the pre step's mixes split into the pre and post weights and the residual
mixing matrix (upstream TileKernels' ``_mhc_pre_split_mixes_fwd`` / ``_bwd``, with every float a run-time
argument)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _mix_checks as checks

FWD = 'mhc.pre_split_mixes_fwd'
BWD = 'mhc.pre_split_mixes_bwd'


def _mixes(op: str, mixes: object, mhc_mult: object) -> tuple[int, int]:
    _checks.integer(op, 'mhc_mult', mhc_mult, low=1)
    mhc3 = mhc_mult * (mhc_mult + 2)
    checks.float32_rows(op, 'mixes', mixes, (mhc3,))
    return mhc3, mixes.numel() // mhc3


@_plans.launch_plan
def mhc_pre_split_mixes_fwd(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                            post_mult_value: float, pre_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the mixes of the pre step.

    Args:
        mixes: ``[..., mhc * (mhc + 2)]`` float32, contiguous, 16-byte aligned.
        scale: ``[3]`` float32: the scales of the pre, post and comb groups.
        base: ``[mhc * (mhc + 2)]`` float32, 16-byte aligned.
        mhc_mult: ``mhc``, the number of residual streams.
        post_mult_value, pre_eps: finite floats.

    Returns:
        ``pre [..., mhc, 1] = sigmoid(mixes[:mhc] * scale[0] + base[:mhc]) + pre_eps``,
        ``post [..., mhc, 1] = sigmoid(mixes[mhc:2mhc] * scale[1] + base[mhc:2mhc]) * post_mult_value`` and
        ``comb [..., mhc, mhc] = mixes[2mhc:] * scale[2] + base[2mhc:]`` (row-major), all float32.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_split_mixes_fwd(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    op = 'mhc_pre_split_mixes_fwd'
    mhc3, num_tokens = _mixes(op, mixes, mhc_mult)
    checks.vector(op, 'scale', scale, 3)
    checks.contiguous_aligned(op, 'base', checks.vector(op, 'base', base, mhc3))
    post_mult_value = _checks.real(op, 'post_mult_value', post_mult_value)
    pre_eps = _checks.real(op, 'pre_eps', pre_eps)
    device = _checks.on_one_cuda_device(op, mixes=mixes, scale=scale, base=base)
    lead = tuple(mixes.shape[:-1])
    pre = mixes.new_empty((*lead, mhc_mult, 1))
    post = mixes.new_empty((*lead, mhc_mult, 1))
    comb = mixes.new_empty((*lead, mhc_mult, mhc_mult))
    if num_tokens == 0:
        return pre, post, comb
    kernel = find_kernel(FWD, {'mhc': mhc_mult}, device)
    kernel(device, {'mixes': mixes.view(num_tokens, mhc3), 'scale': scale.view(3), 'base': base.view(mhc3),
                    'pre': pre.view(num_tokens, mhc_mult), 'post': post.view(num_tokens, mhc_mult),
                    'comb': comb.view(num_tokens, mhc_mult * mhc_mult)},
           {'post_mult_value': post_mult_value, 'pre_eps': pre_eps})
    return pre, post, comb


@_plans.launch_plan
def mhc_pre_split_mixes_bwd(pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor, mixes: torch.Tensor,
                            post_mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, mhc_mult: int,
                            post_mult_value: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`mhc_pre_split_mixes_fwd`.

    Args:
        pre_grad, post_grad: ``[..., mhc, 1]`` float32; comb_grad: ``[..., mhc, mhc]`` float32 (all contiguous,
            16-byte aligned).
        mixes, scale, base, mhc_mult, post_mult_value: as given to the forward.
        post_mix: the forward's post output ``[..., mhc, 1]`` (upstream's signature). It is checked but not read:
            the kernel recomputes the sigmoid from mixes, so a post_mult_value of 0 needs no division.

    Returns:
        ``(mixes_grad [..., mhc * (mhc + 2)], scale_grad [3], base_grad [mhc * (mhc + 2)])``, float32. The
        token sums of scale_grad and base_grad are taken in a fixed order: bitwise the same at any SM count.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_split_mixes_bwd(pre_grad, post_grad, comb_grad, mixes, post_mix, scale, base, mhc_mult,
                                                   post_mult_value)
    op = 'mhc_pre_split_mixes_bwd'
    mhc3, num_tokens = _mixes(op, mixes, mhc_mult)
    n = mhc_mult
    for name, t, tail in (('pre_grad', pre_grad, (n, 1)), ('post_grad', post_grad, (n, 1)), ('comb_grad', comb_grad, (n, n)),
                          ('post_mix', post_mix, (n, 1))):
        checks.float32_rows(op, name, t, tail)
        checks.same_leading(op, ('mixes', name), mixes, t, 1, 2)
    checks.vector(op, 'scale', scale, 3)
    checks.vector(op, 'base', base, mhc3)
    post_mult_value = _checks.real(op, 'post_mult_value', post_mult_value)
    device = _checks.on_one_cuda_device(op, pre_grad=pre_grad, post_grad=post_grad, comb_grad=comb_grad, mixes=mixes,
                                        post_mix=post_mix, scale=scale, base=base)
    if num_tokens == 0:
        return torch.empty_like(mixes), scale.new_zeros((3,)), base.new_zeros((mhc3,))
    kernel = find_kernel(BWD, {'mhc': mhc_mult}, device)
    chunk = kernel.entry.constants['chunk_tokens']
    mixes_grad = torch.empty_like(mixes)
    partial = mixes.new_empty(((num_tokens + chunk - 1) // chunk, mhc3 + 3))
    scale_grad = scale.new_empty((3,))
    base_grad = base.new_empty((mhc3,))
    kernel(device, {'pre_grad': pre_grad.view(num_tokens, n), 'post_grad': post_grad.view(num_tokens, n),
                    'comb_grad': comb_grad.view(num_tokens, n * n), 'mixes': mixes.view(num_tokens, mhc3),
                    'scale': scale.view(3), 'base': base.view(mhc3), 'mixes_grad': mixes_grad.view(num_tokens, mhc3),
                    'partial': partial, 'scale_grad': scale_grad, 'base_grad': base_grad},
           {'post_mult_value': post_mult_value})
    return mixes_grad, scale_grad, base_grad
