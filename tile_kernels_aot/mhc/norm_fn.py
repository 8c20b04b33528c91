"""mHC pre-norm ops: the merge of fn with a norm weight, and mixes = (x @ tf32(fn)^T) * rsqrt(mean(x^2) + eps) over
the flattened streams x (mhc * H values a token), forward and backward (upstream TileKernels v1's norm_fn kernels).

The forward GEMM is split over ``n_splits`` slices of mhc * H (honoured, where upstream forces 1): partial
products and sums of squares ``(n_splits, T, ...)`` that the norm kernel adds in slice order, so a result depends
on ``n_splits`` but on nothing else (not the GPU's SM count). ``eps`` and ``n_splits`` are run-time arguments.
"""

from __future__ import annotations

import math

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel

# Argument domains the ops check before they look at a device (the kernels' check() refuses specs beyond them).
MAX_MHC = 4  # mhc * (mhc + 2) product columns fit the kernels' 32 padded ones
MAX_N_SPLITS = 256  # more slices than the widest prebuilt width has GEMM steps (128 at mhc * H = 32768) only adds zeros
ALIGNMENT = 16  # bytes: the kernels read fn, normw and the residual rows in 16-byte vectors
COLUMN_MULTIPLE = 4  # fn_normw_merge: float32 columns a thread takes (the kernels' manifest constant column_multiple)

MERGE_FWD, MERGE_BWD = 'mhc.fn_normw_merge_fwd', 'mhc.fn_normw_merge_bwd'
FWD_MUL, FWD_NORM = 'mhc.pre_norm_fn_fwd_mul', 'mhc.pre_norm_fn_fwd_norm'
BWD_NORM, BWD_MUL = 'mhc.pre_norm_fn_bwd_norm', 'mhc.pre_norm_fn_bwd_mul'


def mix_count(mhc: int) -> int:
    return mhc * (mhc + 2)


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """Upstream's rounding of a float32 tensor for the TF32 MMA: 0x1000 added to every value's bits, so that the MMA,
    which drops the low 13 bits, sees it rounded half away from zero. Returns a new contiguous float32 tensor."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError(f'round_to_tf32: x must be a float32 torch.Tensor, got {getattr(x, "dtype", type(x).__name__)}')
    return (x.contiguous().view(torch.int32) + 0x1000).view(torch.float32)


def _mhc_of_rows(op: str, name: str, rows: int) -> int:
    """The stream count whose mhc * (mhc + 2) product rows fn has."""
    for mhc in range(1, MAX_MHC + 1):
        if mix_count(mhc) == rows:
            return mhc
    raise ValueError(f'{op}: {name} must have mhc * (mhc + 2) rows for an mhc in [1, {MAX_MHC}] '
                     f'({", ".join(str(mix_count(m)) for m in range(1, MAX_MHC + 1))}), got {rows}')


def _residual(op: str, name: str, residual: torch.Tensor) -> tuple[int, int, int]:
    """(tokens, mhc, hidden) of a contiguous (..., mhc, H) bf16 residual."""
    if isinstance(residual, torch.Tensor) and residual.dim() < 2:
        raise ValueError(f'{op}: {name} must have at least 2 dimensions (..., mhc, H), got shape {tuple(residual.shape)}')
    _checks.tensor(op, name, residual, ndim=range(2, 9), dtypes=(torch.bfloat16,))
    mhc, hidden = residual.shape[-2:]
    _checks.integer(op, f'{name}.shape[-2] (mhc)', mhc, low=1, high=MAX_MHC)
    _checks.integer(op, f'{name}.shape[-1] (hidden)', hidden, low=1)
    _checks.contiguous(op, name, residual, ALIGNMENT)
    return math.prod(residual.shape[:-2]), mhc, hidden


def _fn(op: str, name: str, fn: torch.Tensor, mhc: int, hidden: int) -> None:
    _checks.tensor(op, name, fn, ndim=2, dtypes=(torch.float32,))
    _checks.shape(op, name, fn, (mix_count(mhc), mhc * hidden))


@_plans.launch_plan
def mhc_fn_normw_merge_fwd(fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
    """fn with its columns scaled by an RMS-norm weight: ``fn * normw``.

    Args:
        fn: ``[mhc * (mhc + 2), width]`` float32 CUDA tensor, contiguous, 16-byte aligned; ``width`` a multiple of 4.
        normw: ``[width]`` float32, contiguous, 16-byte aligned.

    Returns:
        A new ``[mhc * (mhc + 2), width]`` float32 tensor.
    """
    if is_compiling():
        return _custom_ops.mhc_fn_normw_merge_fwd(fn, normw)
    op = 'mhc_fn_normw_merge_fwd'
    mhc, width = _merge_operands(op, fn, normw)
    device = _checks.on_one_cuda_device(op, fn=fn, normw=normw)
    kernel = find_kernel(MERGE_FWD, {'mhc': mhc}, device) if width else None
    out = torch.empty_like(fn)
    if width:
        kernel(device, {'fn': fn, 'normw': normw, 'out_fn': out})
    return out


@_plans.launch_plan
def mhc_fn_normw_merge_bwd(fn: torch.Tensor, normw: torch.Tensor, out_fn_grad: torch.Tensor, fn_grad: torch.Tensor,
                           normw_grad: torch.Tensor) -> None:
    """The merge's backward, accumulated in place: ``fn_grad += out_fn_grad * normw`` and
    ``normw_grad += sum over rows of out_fn_grad * fn`` (each column's sum taken in row order, then added).

    Args:
        fn, normw: the forward's inputs (see :func:`mhc_fn_normw_merge_fwd`).
        out_fn_grad: gradient of the merged fn, fn's shape, float32, contiguous, 16-byte aligned.
        fn_grad, normw_grad: float32 accumulators of fn's and normw's shapes, contiguous, 16-byte aligned.
    """
    if is_compiling():
        return _custom_ops.mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad, fn_grad, normw_grad)
    op = 'mhc_fn_normw_merge_bwd'
    mhc, width = _merge_operands(op, fn, normw)
    for name, t, like in (('out_fn_grad', out_fn_grad, fn), ('fn_grad', fn_grad, fn), ('normw_grad', normw_grad, normw)):
        _checks.tensor(op, name, t, ndim=like.dim(), dtypes=(torch.float32,))
        _checks.shape(op, name, t, tuple(like.shape))
        _checks.contiguous(op, name, t, ALIGNMENT)
    device = _checks.on_one_cuda_device(op, fn=fn, normw=normw, out_fn_grad=out_fn_grad, fn_grad=fn_grad, normw_grad=normw_grad)
    if width:
        tensors = {'fn': fn, 'normw': normw, 'out_fn_grad': out_fn_grad, 'fn_grad': fn_grad, 'normw_grad': normw_grad}
        find_kernel(MERGE_BWD, {'mhc': mhc}, device)(device, tensors)


def _merge_operands(op: str, fn: torch.Tensor, normw: torch.Tensor) -> tuple[int, int]:
    _checks.tensor(op, 'fn', fn, ndim=2, dtypes=(torch.float32,))
    mhc = _mhc_of_rows(op, 'fn', fn.shape[0])
    width = fn.shape[1]
    if width % COLUMN_MULTIPLE:
        raise ValueError(f'{op}: fn must have a multiple of {COLUMN_MULTIPLE} columns (the kernels take {COLUMN_MULTIPLE} a thread), got {width}')
    _checks.contiguous(op, 'fn', fn, ALIGNMENT)
    _checks.tensor(op, 'normw', normw, ndim=1, dtypes=(torch.float32,))
    _checks.shape(op, 'normw', normw, (width,))
    _checks.contiguous(op, 'normw', normw, ALIGNMENT)
    return mhc, width


@_plans.launch_plan
def mhc_pre_norm_fn_gemm(residual_flat: torch.Tensor, fn_tf32: torch.Tensor, n_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The split-K GEMM of the pre-norm alone (mhc_pre_big_fuse reduces its partials itself).

    Split ``s`` of ``n_splits`` covers GEMM steps ``floor(s * steps / n_splits)`` to
    ``floor((s + 1) * steps / n_splits)`` of mhc * H (``steps`` = mhc * H / the kernel's ``k_step``); a split with
    no steps gets zeros.

    Args:
        residual_flat: ``[T, mhc, H]`` bf16 CUDA tensor, contiguous, 16-byte aligned (a token's streams are read as
            one row of mhc * H values).
        fn_tf32: ``[mhc * (mhc + 2), mhc * H]`` float32, already rounded by :func:`round_to_tf32`, contiguous,
            16-byte aligned.
        n_splits: slices of mhc * H, ``1 <= n_splits <= 256``.

    Returns:
        ``(partial_mul, partial_sqrsum)``: float32 ``[n_splits, T, mhc * (mhc + 2)]`` products of each slice and
        ``[n_splits, T]`` sums of squares of each slice.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_norm_fn_gemm(residual_flat, fn_tf32, n_splits)
    op = 'mhc_pre_norm_fn_gemm'
    _checks.tensor(op, 'residual_flat', residual_flat, ndim=3, dtypes=(torch.bfloat16,))
    num_tokens, mhc, hidden = _residual(op, 'residual_flat', residual_flat)
    _fn(op, 'fn_tf32', fn_tf32, mhc, hidden)
    _checks.contiguous(op, 'fn_tf32', fn_tf32, ALIGNMENT)
    _checks.integer(op, 'n_splits', n_splits, low=1, high=MAX_N_SPLITS)
    device = _checks.on_one_cuda_device(op, residual_flat=residual_flat, fn_tf32=fn_tf32)
    gemm = find_kernel(FWD_MUL, {'mhc': mhc, 'hidden': hidden}, device) if num_tokens else None
    return _gemm(gemm, device, residual_flat.view(num_tokens, mhc * hidden), fn_tf32, n_splits)


def _gemm(gemm, device: int, x: torch.Tensor, fn_tf32: torch.Tensor, n_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens = x.shape[0]
    partial_mul = x.new_empty((n_splits, num_tokens, fn_tf32.shape[0]), dtype=torch.float32)
    partial_sqrsum = x.new_empty((n_splits, num_tokens), dtype=torch.float32)
    if num_tokens:
        gemm(device, {'x': x, 'fn': fn_tf32, 'partial_mul': partial_mul, 'partial_sqrsum': partial_sqrsum})
    return partial_mul, partial_sqrsum


def check_pre_norm_fn_fwd(op: str, residual: torch.Tensor, fn: torch.Tensor, norm_eps: float, n_splits: int,
                          **on_device: torch.Tensor) -> tuple:
    """mhc_pre_norm_fn_fwd's checks and binaries: (tokens, mhc, hidden, eps, device, (gemm, norm) or None at no
    tokens). The pre step's composites run them before anything launches, with their other tensors as `on_device`."""
    num_tokens, mhc, hidden = _residual(op, 'residual', residual)
    _fn(op, 'fn', fn, mhc, hidden)
    eps = _checks.real(op, 'norm_eps', norm_eps)
    _checks.integer(op, 'n_splits', n_splits, low=1, high=MAX_N_SPLITS)
    device = _checks.on_one_cuda_device(op, residual=residual, fn=fn, **on_device)
    kernels = None
    if num_tokens:
        kernels = find_kernel(FWD_MUL, {'mhc': mhc, 'hidden': hidden}, device), find_kernel(FWD_NORM, {'mhc': mhc}, device)
    return num_tokens, mhc, hidden, eps, device, kernels


@_plans.launch_plan
def mhc_pre_norm_fn_fwd(residual: torch.Tensor, fn: torch.Tensor, norm_eps: float, n_splits: int = 16
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pre step's mixes: ``(x @ tf32(fn)^T) * rsqrt(sum(x^2) / (mhc * H) + norm_eps)`` per token, x the token's
    streams flattened to mhc * H values, with TF32 MMA and float32 accumulation.

    Args:
        residual: ``[..., mhc, H]`` bf16 CUDA tensor, contiguous, 16-byte aligned; ``mhc <= 4``.
        fn: ``[mhc * (mhc + 2), mhc * H]`` float32, before TF32 rounding (the op rounds it; any strides).
        norm_eps: the RMS norm's eps (passed to the kernel as float32).
        n_splits: slices of mhc * H the GEMM is split into (``1 <= n_splits <= 256``); the partial sums are added
            in slice order, so the result depends on it but on nothing else.

    Returns:
        ``(mixes, fn_tf32, out_mul, sqrsum)``: mixes ``[..., mhc * (mhc + 2)]``; fn rounded to TF32; the products
        ``[T, mhc * (mhc + 2)]`` and sums of squares ``[T]`` the backward needs (T the product of the leading dims).
    """
    if is_compiling():
        return _custom_ops.mhc_pre_norm_fn_fwd(residual, fn, norm_eps, n_splits)
    num_tokens, mhc, hidden, eps, device, kernels = check_pre_norm_fn_fwd('mhc_pre_norm_fn_fwd', residual, fn, norm_eps, n_splits)
    mhc3 = mix_count(mhc)
    fn_tf32 = round_to_tf32(fn)
    mixes = residual.new_empty((*residual.shape[:-2], mhc3), dtype=torch.float32)
    out_mul = residual.new_empty((num_tokens, mhc3), dtype=torch.float32)
    sqrsum = residual.new_empty((num_tokens,), dtype=torch.float32)
    if num_tokens == 0:
        return mixes, fn_tf32, out_mul, sqrsum
    gemm, norm = kernels
    partial_mul, partial_sqrsum = _gemm(gemm, device, residual.view(num_tokens, mhc * hidden), fn_tf32, n_splits)
    tensors = {'partial_mul': partial_mul, 'partial_sqrsum': partial_sqrsum, 'out_mul': out_mul, 'sqrsum': sqrsum,
               'mixes': mixes.view(num_tokens, mhc3)}
    norm(device, tensors, {'width': mhc * hidden, 'eps': eps})
    return mixes, fn_tf32, out_mul, sqrsum


@_plans.launch_plan
def mhc_pre_norm_fn_bwd(out_grad: torch.Tensor, residual: torch.Tensor, fn_tf32: torch.Tensor, out_mul: torch.Tensor,
                        sqrsum: torch.Tensor, norm_eps: float, x_grad: torch.Tensor) -> torch.Tensor:
    """The pre-norm's backward. With rms = rsqrt(sqrsum / (mhc * H) + eps) and g = tf32(out_grad * rms):
    ``x_grad += g @ fn_tf32 + 2 * x * sqrsum_grad`` (accumulated in float32, stored as bf16), where sqrsum_grad =
    -(sum_j out_grad_j * out_mul_j) * rms / (sqrsum + eps * mhc * H) / 2, and ``fn_grad = g^T @ x``.

    Args:
        out_grad: ``[..., mhc * (mhc + 2)]`` float32 gradient of the mixes, contiguous (residual's leading dims).
        residual: the forward's ``[..., mhc, H]`` bf16 input, contiguous, 16-byte aligned.
        fn_tf32, out_mul, sqrsum: the forward's outputs.
        norm_eps: the forward's eps.
        x_grad: bf16 accumulator of residual's shape, contiguous, 16-byte aligned.

    Returns:
        fn_grad, a new ``[mhc * (mhc + 2), mhc * H]`` float32 tensor. Each column block of it and of x_grad is
        summed by one CTA in token order, so neither depends on the SM count.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_norm_fn_bwd(out_grad, residual, fn_tf32, out_mul, sqrsum, norm_eps, x_grad)
    op = 'mhc_pre_norm_fn_bwd'
    num_tokens, mhc, hidden = _residual(op, 'residual', residual)
    mhc3 = mix_count(mhc)
    _checks.tensor(op, 'out_grad', out_grad, ndim=residual.dim() - 1, dtypes=(torch.float32,))
    _checks.shape(op, 'out_grad', out_grad, (*residual.shape[:-2], mhc3))
    _checks.contiguous(op, 'out_grad', out_grad, 4)
    _fn(op, 'fn_tf32', fn_tf32, mhc, hidden)
    _checks.contiguous(op, 'fn_tf32', fn_tf32, ALIGNMENT)
    _checks.tensor(op, 'out_mul', out_mul, ndim=2, dtypes=(torch.float32,))
    _checks.shape(op, 'out_mul', out_mul, (num_tokens, mhc3))
    _checks.contiguous(op, 'out_mul', out_mul, 4)
    _checks.tensor(op, 'sqrsum', sqrsum, ndim=1, dtypes=(torch.float32,))
    _checks.shape(op, 'sqrsum', sqrsum, (num_tokens,))
    _checks.contiguous(op, 'sqrsum', sqrsum, 4)
    eps = _checks.real(op, 'norm_eps', norm_eps)
    _checks.tensor(op, 'x_grad', x_grad, ndim=residual.dim(), dtypes=(torch.bfloat16,))
    _checks.shape(op, 'x_grad', x_grad, tuple(residual.shape))
    _checks.contiguous(op, 'x_grad', x_grad, ALIGNMENT)
    device = _checks.on_one_cuda_device(op, out_grad=out_grad, residual=residual, fn_tf32=fn_tf32, out_mul=out_mul,
                                        sqrsum=sqrsum, x_grad=x_grad)
    if num_tokens == 0:
        return torch.zeros_like(fn_tf32)
    norm = find_kernel(BWD_NORM, {'mhc': mhc}, device)
    gemm = find_kernel(BWD_MUL, {'mhc': mhc, 'hidden': hidden}, device)
    mul_grad = out_mul.new_empty((num_tokens, norm.entry.constants['mix_columns']))
    sqrsum_grad = sqrsum.new_empty((num_tokens,))
    tensors = {'out_grad': out_grad.view(num_tokens, mhc3), 'out_mul': out_mul, 'sqrsum': sqrsum, 'mul_grad': mul_grad,
               'sqrsum_grad': sqrsum_grad}
    norm(device, tensors, {'width': mhc * hidden, 'eps': eps})
    fn_grad = torch.empty_like(fn_tf32)
    width = mhc * hidden
    gemm(device, {'mul_grad': mul_grad, 'sqrsum_grad': sqrsum_grad, 'x': residual.view(num_tokens, width), 'fn': fn_tf32,
                  'x_grad': x_grad.view(num_tokens, width), 'fn_grad': fn_grad})
    return fn_grad
