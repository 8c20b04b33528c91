"""The mHC ops as torch.autograd.Functions over the raw kernels of :mod:`tile_kernels_aot.mhc` (upstream's
``tile_kernels.modeling.mhc.ops``).

Fused gradient accumulation. In a layer, the residual x_l feeds both the pre step of a sublayer
(mhc_pre_norm_fn and mhc_pre_apply_mix) and its post step (mhc_post). The post step's backward runs first:
it returns d_residual and also leaves that tensor on the residual's storage as ``grad_from_mhc_post``.
The pre ops' backwards then add their residual gradients into it in place and return None for the
residual, which saves a full-size gradient tensor and an addition per pre op; mhc_pre_norm_fn, the last
of them, removes the stash. Without a stash (no mhc_post after the pre step), or with
``fuse_grad_acc=False``, they return their own gradient, and the sums autograd forms are the same.

Under torch.compile (``torch.compiler.is_compiling()``) every op takes that unfused path: dynamo cannot trace
attributes of an untyped storage, and in a compiled graph the residual gradients are tensors of the graph, whose
sum the compiler plans itself. The gradients are the same.
"""

from __future__ import annotations

import torch

from tile_kernels_aot.mhc.expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_bwd, mhc_head_compute_mix_fwd
from tile_kernels_aot.mhc.multilayer_recompute import mhc_multilayer_recompute
from tile_kernels_aot.mhc.norm_fn import (
    check_pre_norm_fn_fwd, mhc_fn_normw_merge_bwd, mhc_fn_normw_merge_fwd, mhc_pre_norm_fn_bwd, mhc_pre_norm_fn_fwd,
)
from tile_kernels_aot.mhc.post import mhc_post_bwd, mhc_post_fwd
from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd
from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse
from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd
from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd

STASH = 'grad_from_mhc_post'  # the attribute mhc_post's backward leaves on the residual's storage

__all__ = [
    'ExpandToMHCFn', 'MHCHeadComputeMix', 'MHCPost', 'MHCPreApplyMix', 'MHCPreNormFn', 'MHCPreSplitMixes',
    'expand_to_mhc', 'mhc_head_compute_mix', 'mhc_multilayer_recompute', 'mhc_post', 'mhc_post_bwd', 'mhc_post_fwd',
    'mhc_pre_apply_mix', 'mhc_pre_big_fuse', 'mhc_pre_norm_fn', 'mhc_pre_split_mixes', 'sinkhorn_normalize',
]


def _stash(x: torch.Tensor) -> torch.Tensor | None:
    """The residual gradient mhc_post's backward left on x's storage, viewed as x, or None (always None under
    torch.compile, where mhc_post's backward leaves none)."""
    if torch.compiler.is_compiling():
        return None
    stashed = getattr(x.untyped_storage(), STASH, None)
    return None if stashed is None else stashed.view_as(x)


class ExpandToMHCFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None) -> torch.Tensor:
        return expand_to_mhc_fwd(hidden, mhc_mult, out)

    @staticmethod
    def backward(ctx, out_grad: torch.Tensor):
        return expand_to_mhc_bwd(out_grad), None, None


def expand_to_mhc(hidden: torch.Tensor, mhc_mult: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """(..., H) bf16 -> (..., mhc_mult, H): a copy per stream; the backward sums the streams in fp32."""
    return ExpandToMHCFn.apply(hidden, mhc_mult, out)


class _MHCFnNormwMerge(torch.autograd.Function):
    """fn * norm_weight (broadcast over fn's rows). The backward adds into ``.main_grad`` of either input where
    it has one (returning None for it), as upstream does for weights kept in fp32 gradient buffers."""

    @staticmethod
    def forward(ctx, fn: torch.Tensor, normw: torch.Tensor) -> torch.Tensor:
        ctx.fn_main_grad = getattr(fn, 'main_grad', None)
        ctx.normw_main_grad = getattr(normw, 'main_grad', None)
        ctx.save_for_backward(fn, normw)
        return mhc_fn_normw_merge_fwd(fn, normw)

    @staticmethod
    def backward(ctx, out_fn_grad: torch.Tensor):
        fn, normw = ctx.saved_tensors
        fn_grad = ctx.fn_main_grad if ctx.fn_main_grad is not None else torch.zeros_like(fn)
        normw_grad = ctx.normw_main_grad if ctx.normw_main_grad is not None else torch.zeros_like(normw)
        mhc_fn_normw_merge_bwd(fn, normw, out_fn_grad.contiguous(), fn_grad, normw_grad)
        return (None if ctx.fn_main_grad is not None else fn_grad,
                None if ctx.normw_main_grad is not None else normw_grad)


class MHCPreNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, fn: torch.Tensor, norm_eps: float, fuse_grad_acc: bool, n_splits: int) -> torch.Tensor:
        mixes, fn_tf32, out_mul, sqrsum = mhc_pre_norm_fn_fwd(x, fn, norm_eps, n_splits)
        ctx.save_for_backward(x, fn_tf32, out_mul, sqrsum)
        ctx.norm_eps = norm_eps
        ctx.fuse_grad_acc = fuse_grad_acc
        return mixes

    @staticmethod
    def backward(ctx, out_grad: torch.Tensor):
        x, fn_tf32, out_mul, sqrsum = ctx.saved_tensors
        stashed = _stash(x) if ctx.fuse_grad_acc else None
        x_grad = stashed if stashed is not None else torch.zeros_like(x)
        fn_grad = mhc_pre_norm_fn_bwd(out_grad.contiguous(), x, fn_tf32, out_mul, sqrsum, ctx.norm_eps, x_grad)
        if stashed is not None:
            delattr(x.untyped_storage(), STASH)  # the last pre op of the layer: the stash has served
            return None, fn_grad, None, None, None
        return x_grad, fn_grad, None, None, None


def mhc_pre_norm_fn(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                    mhc_norm_eps: float, fuse_grad_acc: bool = True, n_splits: int = 16) -> torch.Tensor:
    """The mixes (..., mhc3) of the pre step: the flattened streams times tf32(fn) (times the norm weight, if
    given), scaled by the RMS norm of the streams. The GEMM is split over `n_splits` slices of mhc * H, whose
    partial sums are added in slice order."""
    if mhc_norm_weight is not None and not torch.compiler.is_compiling():  # the forward's checks, before the merge launches
        check_pre_norm_fn_fwd('mhc_pre_norm_fn', residual, mhc_fn, mhc_norm_eps, n_splits, mhc_norm_weight=mhc_norm_weight)
    return pre_norm_fn_checked(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps, fuse_grad_acc, n_splits)


def pre_norm_fn_checked(residual: torch.Tensor, mhc_fn: torch.Tensor, mhc_norm_weight: torch.Tensor | None,
                        mhc_norm_eps: float, fuse_grad_acc: bool = True, n_splits: int = 16) -> torch.Tensor:
    """mhc_pre_norm_fn for a caller that has run check_pre_norm_fn_fwd on these operands (the composites)."""
    if mhc_norm_weight is not None:
        mhc_fn = _MHCFnNormwMerge.apply(mhc_fn, mhc_norm_weight)
    return MHCPreNormFn.apply(residual, mhc_fn, mhc_norm_eps, fuse_grad_acc, n_splits)


class MHCPreSplitMixes(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                mhc_post_mult_value: float, mhc_pre_eps: float):
        pre, post, comb = mhc_pre_split_mixes_fwd(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)
        ctx.save_for_backward(input_mixes, post, mhc_scale, mhc_base)
        ctx.mhc_mult = mhc_mult
        ctx.mhc_post_mult_value = mhc_post_mult_value
        return pre, post, comb

    @staticmethod
    def backward(ctx, pre_grad: torch.Tensor, post_grad: torch.Tensor, comb_grad: torch.Tensor):
        input_mixes, post, mhc_scale, mhc_base = ctx.saved_tensors
        mixes_grad, scale_grad, base_grad = mhc_pre_split_mixes_bwd(
            pre_grad.contiguous(), post_grad.contiguous(), comb_grad.contiguous(), input_mixes, post, mhc_scale, mhc_base,
            ctx.mhc_mult, ctx.mhc_post_mult_value)
        return mixes_grad, scale_grad, base_grad, None, None, None


def mhc_pre_split_mixes(input_mixes: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_mult: int,
                        mhc_post_mult_value: float, mhc_pre_eps: float):
    """(pre_layer_mix, post_layer_mix, comb_res_mix) from the mixes; see reference.mhc_pre_split_mixes_ref."""
    return MHCPreSplitMixes.apply(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)


class _SinkhornNormalize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, repeat: int, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.repeat, ctx.eps = repeat, eps
        return mhc_sinkhorn_fwd(x, repeat, eps)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (x,) = ctx.saved_tensors
        return mhc_sinkhorn_bwd(grad_output.contiguous(), x, ctx.repeat, ctx.eps), None, None


def sinkhorn_normalize(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    """Sinkhorn normalisation of the (..., n, n) matrices of x (fp32); the backward is exact reverse mode
    through every step."""
    return _SinkhornNormalize.apply(x.contiguous() if isinstance(x, torch.Tensor) else x, repeat, eps)  # mhc_sinkhorn_fwd names a non-tensor


class MHCPreApplyMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, mix)
        return mhc_pre_apply_mix_fwd(x, mix, out)

    @staticmethod
    def backward(ctx, o_grad: torch.Tensor):
        x, mix = ctx.saved_tensors
        stashed = _stash(x)
        x_grad = stashed if stashed is not None else torch.zeros_like(x)
        mix_grad = mhc_pre_apply_mix_bwd(o_grad.contiguous(), x, mix, x_grad)
        return (None if stashed is not None else x_grad), mix_grad, None


def mhc_pre_apply_mix(x: torch.Tensor, mix: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The sublayer input (..., H) bf16: the streams of x (..., mhc, H) weighted by mix (..., mhc, 1)."""
    return MHCPreApplyMix.apply(x, mix, out)


class MHCPost(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
                out: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, residual, post_layer_mix, comb_res_mix)
        return mhc_post_fwd(x, residual, post_layer_mix, comb_res_mix, out)

    @staticmethod
    def backward(ctx, d_o: torch.Tensor):
        return *mhc_post_bwd(*ctx.saved_tensors, d_o.contiguous(), fuse_grad_acc=not torch.compiler.is_compiling()), None


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor, comb_res_mix: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """The new streams: post_layer_mix * x + comb_res_mix^T @ residual, per token, in fp32, stored as bf16."""
    return MHCPost.apply(x, residual, post_layer_mix, comb_res_mix, out)


class MHCHeadComputeMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor, mhc_pre_eps: float) -> torch.Tensor:
        ctx.save_for_backward(input_mix, mhc_scale, mhc_base)
        return mhc_head_compute_mix_fwd(input_mix, mhc_scale, mhc_base, mhc_pre_eps)

    @staticmethod
    def backward(ctx, output_mix_grad: torch.Tensor):
        input_mix, mhc_scale, mhc_base = ctx.saved_tensors
        return *mhc_head_compute_mix_bwd(output_mix_grad.contiguous(), input_mix, mhc_scale, mhc_base), None


def mhc_head_compute_mix(input_mix: torch.Tensor, mhc_scale: torch.Tensor, mhc_base: torch.Tensor,
                         mhc_pre_eps: float) -> torch.Tensor:
    """sigmoid(input_mix * scale + base) + pre_eps, with scale (1,) and base (mhc,)."""
    return MHCHeadComputeMix.apply(input_mix, mhc_scale, mhc_base, mhc_pre_eps)
