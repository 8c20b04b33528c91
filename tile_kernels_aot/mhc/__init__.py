"""Manifold hyper-connection (mHC) kernels as raw forward and backward functions (tensors in, outputs
allocated or given), including upstream TileKernels' ``tile_kernels.mhc`` functions (mhc_post_fwd, mhc_post_bwd,
mhc_multilayer_recompute, round_to_tf32). The autograd ops and composites are in
:mod:`tile_kernels_aot.modeling.mhc`.

Every float (eps, pre_eps, post multiplier, Sinkhorn eps), the Sinkhorn repeat, the GEMM's split count and the
token count are run-time arguments: a binary is specialised on the stream count and, where a kernel tiles over
it, the hidden size only.
"""

from tile_kernels_aot.mhc.expand import expand_to_mhc_bwd, expand_to_mhc_fwd
from tile_kernels_aot.mhc.head_compute_mix import mhc_head_compute_mix_bwd, mhc_head_compute_mix_fwd
from tile_kernels_aot.mhc.multilayer_recompute import mhc_multilayer_recompute
from tile_kernels_aot.mhc.norm_fn import (
    mhc_fn_normw_merge_bwd, mhc_fn_normw_merge_fwd, mhc_pre_norm_fn_bwd, mhc_pre_norm_fn_fwd, mhc_pre_norm_fn_gemm,
    round_to_tf32,
)
from tile_kernels_aot.mhc.post import mhc_post_bwd, mhc_post_fwd
from tile_kernels_aot.mhc.pre_apply_mix import mhc_pre_apply_mix_bwd, mhc_pre_apply_mix_fwd
from tile_kernels_aot.mhc.pre_big_fuse import mhc_pre_big_fuse
from tile_kernels_aot.mhc.pre_split_mixes import mhc_pre_split_mixes_bwd, mhc_pre_split_mixes_fwd
from tile_kernels_aot.mhc.sinkhorn import mhc_sinkhorn_bwd, mhc_sinkhorn_fwd

__all__ = [
    'expand_to_mhc_bwd', 'expand_to_mhc_fwd', 'mhc_fn_normw_merge_bwd', 'mhc_fn_normw_merge_fwd', 'mhc_head_compute_mix_bwd',
    'mhc_head_compute_mix_fwd', 'mhc_multilayer_recompute', 'mhc_post_bwd', 'mhc_post_fwd', 'mhc_pre_apply_mix_bwd',
    'mhc_pre_apply_mix_fwd', 'mhc_pre_big_fuse', 'mhc_pre_norm_fn_bwd', 'mhc_pre_norm_fn_fwd', 'mhc_pre_norm_fn_gemm',
    'mhc_pre_split_mixes_bwd', 'mhc_pre_split_mixes_fwd', 'mhc_sinkhorn_bwd', 'mhc_sinkhorn_fwd', 'round_to_tf32',
]
