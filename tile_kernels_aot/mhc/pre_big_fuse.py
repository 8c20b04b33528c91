"""mhc_pre_big_fuse: the whole inference pre step of a sublayer in two launches (upstream TileKernels'
``mhc_pre_big_fuse``, with every float, the Sinkhorn repeat and n_splits run-time arguments)."""

from __future__ import annotations

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _mix_checks as checks
from tile_kernels_aot.mhc.norm_fn import FWD_MUL, MAX_N_SPLITS, mhc_pre_norm_fn_gemm, round_to_tf32

KERNEL = 'mhc.pre_big_fuse'
MAX_MHC = 4  # mhc * (mhc + 2) mixes: one warp's lanes, as in the norm kernels


@_plans.launch_plan
def mhc_pre_big_fuse(residual: torch.Tensor, fn: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                     rms_eps: float, mhc_pre_eps: float, mhc_sinkhorn_eps: float, mhc_post_mult_value: float,
                     sinkhorn_repeat: int, n_splits: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pre step without autograd: the norm's split-K GEMM (mhc.pre_norm_fn_fwd_mul), then one kernel that reduces
    its partials and splits, Sinkhorn-normalises and applies the mixes, bit for bit as mhc_pre_norm_fn_fwd ->
    mhc_pre_split_mixes_fwd -> mhc_sinkhorn_fwd -> mhc_pre_apply_mix_fwd with the same n_splits.

    Args:
        residual: ``[..., mhc, H]`` bf16 CUDA tensor, contiguous, 16-byte aligned; ``mhc <= 4``.
        fn: ``[mhc * (mhc + 2), mhc * H]`` float32, before TF32 rounding (the op rounds it).
        mhc_scale: ``[3]`` float32; mhc_base: ``[mhc * (mhc + 2)]`` float32.
        rms_eps, mhc_pre_eps, mhc_sinkhorn_eps, mhc_post_mult_value: finite floats.
        sinkhorn_repeat: ``>= 1``.
        n_splits: slices of mhc * H the GEMM is split into, ``1 <= n_splits <= 256``.

    Returns:
        ``(post_mix [..., mhc, 1], comb_mix [..., mhc, mhc], layer_input [..., H])``: float32, float32, bf16.
    """
    if is_compiling():
        return _custom_ops.mhc_pre_big_fuse(residual, fn, mhc_scale, mhc_base, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
                                            mhc_post_mult_value, sinkhorn_repeat, n_splits)
    op = 'mhc_pre_big_fuse'
    _checks.tensor(op, 'residual', residual, ndim=range(2, 10), dtypes=(torch.bfloat16,))
    mhc, hidden = residual.shape[-2:]
    _checks.integer(op, 'residual.shape[-2] (mhc)', mhc, low=1, high=MAX_MHC)
    _checks.integer(op, 'residual.shape[-1] (hidden)', hidden, low=1)
    checks.contiguous_aligned(op, 'residual', residual)
    mhc3 = mhc * (mhc + 2)
    _checks.tensor(op, 'fn', fn, ndim=2, dtypes=(torch.float32,))
    if tuple(fn.shape) != (mhc3, mhc * hidden):
        raise ValueError(f'{op}: fn must have shape ({mhc3}, {mhc * hidden}) for residual {tuple(residual.shape)}, got {tuple(fn.shape)}')
    checks.vector(op, 'mhc_scale', mhc_scale, 3)
    checks.vector(op, 'mhc_base', mhc_base, mhc3)
    floats = {name: _checks.real(op, name, value) for name, value in (
        ('rms_eps', rms_eps), ('mhc_pre_eps', mhc_pre_eps), ('mhc_sinkhorn_eps', mhc_sinkhorn_eps),
        ('mhc_post_mult_value', mhc_post_mult_value))}
    _checks.integer(op, 'sinkhorn_repeat', sinkhorn_repeat, low=1, high=2**31 - 1)
    _checks.integer(op, 'n_splits', n_splits, low=1, high=MAX_N_SPLITS)
    device = _checks.on_one_cuda_device(op, residual=residual, fn=fn, mhc_scale=mhc_scale, mhc_base=mhc_base)
    lead = tuple(residual.shape[:-2])
    num_tokens = residual.numel() // (mhc * hidden)
    post_mix = residual.new_empty((*lead, mhc, 1), dtype=torch.float32)
    comb_mix = residual.new_empty((*lead, mhc, mhc), dtype=torch.float32)
    layer_input = residual.new_empty((*lead, hidden))
    if num_tokens == 0:
        return post_mix, comb_mix, layer_input
    spec = {'mhc': mhc, 'hidden': hidden}
    kernel = find_kernel(KERNEL, spec, device)
    find_kernel(FWD_MUL, spec, device)  # both binaries found before anything is launched
    residual_flat = residual.view(num_tokens, mhc, hidden)
    partial_mul, partial_sqrsum = mhc_pre_norm_fn_gemm(residual_flat, round_to_tf32(fn), n_splits)
    kernel(device, {'partial_mul': partial_mul, 'partial_sqrsum': partial_sqrsum, 'scale': mhc_scale.view(3),
                    'base': mhc_base.view(mhc3), 'residual': residual_flat, 'post': post_mix.view(num_tokens, mhc),
                    'comb': comb_mix.view(num_tokens, mhc * mhc), 'layer_input': layer_input.view(num_tokens, hidden)},
           {'width': mhc * hidden, 'rms_eps': floats['rms_eps'], 'pre_eps': floats['mhc_pre_eps'],
            'sinkhorn_eps': floats['mhc_sinkhorn_eps'], 'post_mult_value': floats['mhc_post_mult_value'],
            'sinkhorn_repeat': sinkhorn_repeat})
    return post_mix, comb_mix, layer_input
