"""mhc_sinkhorn_fwd / _bwd: Sinkhorn normalisation of (..., n, n) float32 matrices (upstream TileKernels'
``_mhc_sinkhorn_fwd`` / ``_bwd``, with repeat and eps run-time arguments)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _mix_checks as checks

FWD = 'mhc.sinkhorn_fwd'
BWD = 'mhc.sinkhorn_bwd'


def _matrices(op: str, name: str, x: object) -> tuple[int, int]:
    _checks.tensor(op, name, x, ndim=range(2, 10), dtypes=(torch.float32,))
    n = x.shape[-1]
    if x.shape[-2] != n or n < 1:
        raise ValueError(f'{op}: {name} must have shape (..., n, n), got {tuple(x.shape)}')
    checks.contiguous_aligned(op, name, x)
    return n, x.numel() // (n * n)


@_plans.launch_plan
def mhc_sinkhorn_fwd(x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """Sinkhorn-normalise each (n, n) matrix of x.

    ``x = softmax(x, -1) + eps; x /= x.sum(-2) + eps``, then ``repeat - 1`` rounds of
    ``x /= x.sum(-1) + eps; x /= x.sum(-2) + eps``, every sum in index order.

    Args:
        x: ``[..., n, n]`` float32, contiguous, 16-byte aligned (n = mhc of a prebuilt spec).
        repeat: ``>= 1``; the forward has no upper bound (mhc_sinkhorn_bwd has one).
        eps: finite float.

    Returns:
        A new float32 tensor of x's shape.
    """
    if is_compiling():
        return _custom_ops.mhc_sinkhorn_fwd(x, repeat, eps)
    op = 'mhc_sinkhorn_fwd'
    n, num_tokens = _matrices(op, 'x', x)
    _checks.integer(op, 'repeat', repeat, low=1, high=2**31 - 1)
    eps = _checks.real(op, 'eps', eps)
    device = _checks.on_one_cuda_device(op, x=x)
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    kernel = find_kernel(FWD, {'mhc': n}, device)
    kernel(device, {'x': x.view(num_tokens, n, n), 'out': out.view(num_tokens, n, n)}, {'repeat': repeat, 'eps': eps})
    return out


@_plans.launch_plan
def mhc_sinkhorn_bwd(grad_out: torch.Tensor, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
    """The gradient of :func:`mhc_sinkhorn_fwd` with respect to x: exact reverse mode through the softmax and all
    2 * repeat normalisations.

    Args:
        grad_out: ``[..., n, n]`` float32, x's shape, contiguous, 16-byte aligned.
        x, repeat, eps: as given to the forward; ``repeat`` at most the binary's ``max_repeat`` constant (the
            backward keeps every step's input in shared memory, sized for that many rounds).

    Returns:
        grad_in, float32, x's shape.
    """
    if is_compiling():
        return _custom_ops.mhc_sinkhorn_bwd(grad_out, x, repeat, eps)
    op = 'mhc_sinkhorn_bwd'
    n, num_tokens = _matrices(op, 'x', x)
    _matrices(op, 'grad_out', grad_out)
    if grad_out.shape != x.shape:
        raise ValueError(f'{op}: grad_out must have x\'s shape {tuple(x.shape)}, got {tuple(grad_out.shape)}')
    _checks.integer(op, 'repeat', repeat, low=1, high=2**31 - 1)
    eps = _checks.real(op, 'eps', eps)
    device = _checks.on_one_cuda_device(op, grad_out=grad_out, x=x)
    if num_tokens == 0:
        return torch.empty_like(x)
    kernel = find_kernel(BWD, {'mhc': n}, device)
    max_repeat = kernel.entry.constants['max_repeat']
    if repeat > max_repeat:
        raise ValueError(f'{op}: repeat must be in [1, {max_repeat}] (the steps the backward keeps in shared memory), got {repeat}')
    grad_in = torch.empty_like(x)
    kernel(device, {'grad_out': grad_out.view(num_tokens, n, n), 'x': x.view(num_tokens, n, n),
                    'grad_in': grad_in.view(num_tokens, n, n)}, {'repeat': repeat, 'eps': eps})
    return grad_in
