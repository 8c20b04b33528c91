"""mHC composites for a model: the pre step of a sublayer, the head's input and the expansion of the
embedding (upstream's ``tile_kernels.modeling.mhc.functional``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.compiler import is_compiling

from tile_kernels_aot import _checks
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.mhc import _mix_checks as checks
from tile_kernels_aot.mhc import head_compute_mix, pre_apply_mix, pre_split_mixes, sinkhorn
from tile_kernels_aot.mhc.norm_fn import check_pre_norm_fn_fwd, mix_count
from tile_kernels_aot.modeling.mhc.ops import (
    expand_to_mhc, mhc_head_compute_mix, mhc_pre_apply_mix, mhc_pre_big_fuse, mhc_pre_split_mixes, pre_norm_fn_checked,
    sinkhorn_normalize,
)


def _check_step(op: str, residual, fn, scale, base, norm_weight, norm_eps: float, mhc_mult: int, n_splits: int,
                floats: dict[str, float], sinkhorn_repeat: int | None = None) -> None:
    """What the ops of a composite check, checked before the first of them launches: mhc_mult against residual, the
    scale and base vectors (the pre step's when `sinkhorn_repeat` is given, else the head's), the floats, the norm's
    operands, one device for all, and every binary of the step. Under torch.compile the custom ops check instead."""
    if is_compiling():
        return
    _checks.integer(op, 'mhc_mult', mhc_mult, low=1)
    if isinstance(residual, torch.Tensor) and residual.dim() >= 2 and residual.shape[-2] != mhc_mult:
        raise ValueError(f'{op}: mhc_mult must be the stream count of residual (..., mhc_mult, H), got {mhc_mult} for shape '
                         f'{tuple(residual.shape)}')
    pre = sinkhorn_repeat is not None
    checks.vector(op, 'scale', scale, 3 if pre else 1)
    checks.vector(op, 'base', base, mix_count(mhc_mult) if pre else mhc_mult)
    if pre:
        checks.contiguous_aligned(op, 'base', base)  # pre_split_mixes_fwd reads it in vectors
    for name, value in floats.items():
        _checks.real(op, name, value)
    if pre:
        _checks.integer(op, 'sinkhorn_repeat', sinkhorn_repeat, low=1, high=2**31 - 1)
    weights = {'scale': scale, 'base': base} if norm_weight is None else {'scale': scale, 'base': base, 'norm_weight': norm_weight}
    num_tokens, mhc, hidden, _, device, _ = check_pre_norm_fn_fwd(op, residual, fn, norm_eps, n_splits, **weights)
    if num_tokens:
        for kernel in (pre_split_mixes.FWD, sinkhorn.FWD) if pre else (head_compute_mix.FWD,):
            find_kernel(kernel, {'mhc': mhc}, device)
        find_kernel(pre_apply_mix.FWD, {'mhc': mhc, 'hidden': hidden}, device)


def expand_from_embedding(x: torch.Tensor, mhc_mult: int = 4) -> torch.Tensor:
    """The residual streams (..., mhc_mult, H) of an embedding (..., H): a copy per stream."""
    return expand_to_mhc(x, mhc_mult)


def mhc_pre(
    residual: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    mhc_mult: int = 4,
    post_mult_value: float = 1.0,
    pre_eps: float = 1e-6,
    sinkhorn_eps: float = 1e-6,
    sinkhorn_repeat: int = 10,
    n_splits: int = 16,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The pre step of one sublayer: norm and projection, split of the mixes, Sinkhorn, stream mixing.

    Args:
        residual: ``(..., mhc_mult, H)`` bf16 streams.
        fn: ``(mhc_mult * (mhc_mult + 2), mhc_mult * H)`` fp32 projection.
        scale: ``(3,)`` fp32 scales of the pre, post and residual mixes; base: ``(mhc_mult * (mhc_mult + 2),)`` fp32.
        norm_weight: optional ``(mhc_mult * H,)`` fp32 RMSNorm weight, folded into fn (not used when grad is
            disabled, as upstream).
        norm_eps, pre_eps, sinkhorn_eps, post_mult_value, sinkhorn_repeat, n_splits: run-time arguments of the
            kernels; any values share the same binaries.

    Returns:
        ``(layer_input (..., H) bf16, (post_mix (..., mhc_mult, 1), comb_mix (..., mhc_mult, mhc_mult)))``; pass the
        pair to mhc_post. With grad disabled the whole step is the single fused kernel mhc_pre_big_fuse, whose
        results equal those of the separate kernels bit for bit.
    """
    if not torch.is_grad_enabled():
        post_mix, comb_mix, layer_input = mhc_pre_big_fuse(
            residual, fn, scale, base, rms_eps=norm_eps, mhc_pre_eps=pre_eps, mhc_sinkhorn_eps=sinkhorn_eps,
            mhc_post_mult_value=post_mult_value, sinkhorn_repeat=sinkhorn_repeat, n_splits=n_splits)
        return layer_input, (post_mix, comb_mix)
    _check_step('mhc_pre', residual, fn, scale, base, norm_weight, norm_eps, mhc_mult, n_splits,
                {'post_mult_value': post_mult_value, 'pre_eps': pre_eps, 'sinkhorn_eps': sinkhorn_eps}, sinkhorn_repeat)
    mixes = pre_norm_fn_checked(residual, fn, norm_weight, norm_eps, n_splits=n_splits)
    pre_mix, post_mix, comb_mix = mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb_mix = sinkhorn_normalize(comb_mix, repeat=sinkhorn_repeat, eps=sinkhorn_eps)
    return mhc_pre_apply_mix(residual, pre_mix), (post_mix, comb_mix)


def mhc_head(
    residual: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    mhc_mult: int = 4,
    pre_eps: float = 1e-6,
    n_splits: int = 16,
) -> torch.Tensor:
    """The input of the LM head from the streams.

    fn is ``(mhc_mult, mhc_mult * H)``; it is zero-padded to the pre step's ``mhc_mult * (mhc_mult + 2)`` rows so
    that the same norm kernel serves, and the first mhc_mult mixes become the head's weights. scale is ``(1,)``
    (or a scalar tensor), base ``(mhc_mult,)``. Returns ``(..., H)`` bf16.
    """
    # What the padding below relies on; the ops it calls check the rest.
    for name, t in (('residual', residual), ('fn', fn)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f'mhc_head: {name} must be a torch.Tensor, got {type(t).__name__}')
    if isinstance(mhc_mult, bool) or not isinstance(mhc_mult, int) or residual.dim() < 2 or mhc_mult != residual.shape[-2]:
        raise ValueError(f'mhc_head: mhc_mult must be the stream count of residual (..., mhc_mult, H), got {mhc_mult!r} for shape '
                         f'{tuple(residual.shape)}')
    rows = mhc_mult * (mhc_mult + 2)
    if fn.dim() == 2 and fn.shape[0] < rows:
        fn = F.pad(fn, (0, 0, 0, rows - fn.shape[0]))
    _check_step('mhc_head', residual, fn, scale, base, norm_weight, norm_eps, mhc_mult, n_splits, {'pre_eps': pre_eps})
    mixes = pre_norm_fn_checked(residual, fn, norm_weight, norm_eps, n_splits=n_splits)[..., :mhc_mult].contiguous()
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        scale = scale.reshape(1)
    mix = mhc_head_compute_mix(mixes, scale, base, pre_eps)
    return mhc_pre_apply_mix(residual, mix.unsqueeze(-1))
