"""mhc_head_compute_mix_fwd / _bwd: the head's stream weights (upstream TileKernels' ``_mhc_head_compute_mix_fwd``
/ ``_bwd``, with pre_eps a run-time argument)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _mix_checks as checks

FWD = 'mhc.head_compute_mix_fwd'
BWD = 'mhc.head_compute_mix_bwd'


def _input_mix(op: str, name: str, t: object) -> tuple[int, int]:
    _checks.tensor(op, name, t, ndim=range(1, 10), dtypes=(torch.float32,))
    n = t.shape[-1]
    if n < 1:
        raise ValueError(f'{op}: {name} must have at least one stream, got shape {tuple(t.shape)}')
    checks.contiguous_aligned(op, name, t)
    return n, t.numel() // n


@_plans.launch_plan
def mhc_head_compute_mix_fwd(input_mix: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, pre_eps: float) -> torch.Tensor:
    """``sigmoid(input_mix * scale + base) + pre_eps``.

    Args:
        input_mix: ``[..., mhc]`` float32, contiguous, 16-byte aligned.
        scale: 1 float32 element; base: ``[mhc]`` float32.
        pre_eps: finite float.

    Returns:
        float32 of input_mix's shape.
    """
    if is_compiling():
        return _custom_ops.mhc_head_compute_mix_fwd(input_mix, scale, base, pre_eps)
    op = 'mhc_head_compute_mix_fwd'
    n, num_tokens = _input_mix(op, 'input_mix', input_mix)
    checks.vector(op, 'scale', scale, 1)
    checks.vector(op, 'base', base, n)
    pre_eps = _checks.real(op, 'pre_eps', pre_eps)
    device = _checks.on_one_cuda_device(op, input_mix=input_mix, scale=scale, base=base)
    out = torch.empty_like(input_mix)
    if num_tokens == 0:
        return out
    kernel = find_kernel(FWD, {'mhc': n}, device)
    kernel(device, {'input_mix': input_mix.view(num_tokens, n), 'scale': scale.view(1), 'base': base.view(n),
                    'out': out.view(num_tokens, n)}, {'pre_eps': pre_eps})
    return out


@_plans.launch_plan
def mhc_head_compute_mix_bwd(grad: torch.Tensor, input_mix: torch.Tensor, scale: torch.Tensor,
                             base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`mhc_head_compute_mix_fwd`.

    Args:
        grad: the output's gradient, input_mix's shape, float32, contiguous, 16-byte aligned.
        input_mix, scale, base: as given to the forward.

    Returns:
        ``(input_grad (input_mix's shape), scale_grad [1], base_grad [mhc])``, float32. The token sums are taken in
        a fixed order: bitwise the same at any SM count.
    """
    if is_compiling():
        return _custom_ops.mhc_head_compute_mix_bwd(grad, input_mix, scale, base)
    op = 'mhc_head_compute_mix_bwd'
    n, num_tokens = _input_mix(op, 'input_mix', input_mix)
    _input_mix(op, 'grad', grad)
    if grad.shape != input_mix.shape:
        raise ValueError(f'{op}: grad must have input_mix\'s shape {tuple(input_mix.shape)}, got {tuple(grad.shape)}')
    checks.vector(op, 'scale', scale, 1)
    checks.vector(op, 'base', base, n)
    device = _checks.on_one_cuda_device(op, grad=grad, input_mix=input_mix, scale=scale, base=base)
    if num_tokens == 0:
        return torch.empty_like(input_mix), scale.new_zeros((1,)), base.new_zeros((n,))
    kernel = find_kernel(BWD, {'mhc': n}, device)
    chunk = kernel.entry.constants['chunk_tokens']
    input_grad = torch.empty_like(input_mix)
    partial = input_mix.new_empty(((num_tokens + chunk - 1) // chunk, n + 1))
    scale_grad = scale.new_empty((1,))
    base_grad = base.new_empty((n,))
    kernel(device, {'grad': grad.view(num_tokens, n), 'input_mix': input_mix.view(num_tokens, n), 'scale': scale.view(1),
                    'base': base.view(n), 'input_grad': input_grad.view(num_tokens, n), 'partial': partial,
                    'scale_grad': scale_grad, 'base_grad': base_grad})
    return input_grad, scale_grad, base_grad
