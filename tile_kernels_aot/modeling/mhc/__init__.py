"""mHC for models: the autograd ops (:mod:`.ops`) and the composites (:mod:`.functional`), with upstream
TileKernels' ``tile_kernels.modeling.mhc`` names and signatures.

A layer with manifold hyper-connections runs, for each sublayer F::

    layer_input, (post_mix, comb_mix) = mhc_pre(residual, fn, scale, base, ...)
    residual = mhc_post(F(layer_input), residual, post_mix, comb_mix)
"""

from tile_kernels_aot.modeling.mhc import ops
from tile_kernels_aot.modeling.mhc.functional import expand_from_embedding, mhc_head, mhc_pre
from tile_kernels_aot.modeling.mhc.ops import (
    expand_to_mhc, mhc_head_compute_mix, mhc_multilayer_recompute, mhc_post, mhc_post_bwd, mhc_post_fwd,
    mhc_pre_apply_mix, mhc_pre_big_fuse, mhc_pre_norm_fn, mhc_pre_split_mixes, sinkhorn_normalize,
)

__all__ = [
    'expand_from_embedding', 'expand_to_mhc', 'mhc_head', 'mhc_head_compute_mix', 'mhc_multilayer_recompute', 'mhc_post',
    'mhc_post_bwd', 'mhc_post_fwd', 'mhc_pre', 'mhc_pre_apply_mix', 'mhc_pre_big_fuse', 'mhc_pre_norm_fn',
    'mhc_pre_split_mixes', 'ops', 'sinkhorn_normalize',
]
