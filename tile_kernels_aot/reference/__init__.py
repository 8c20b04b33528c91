"""Pure-PyTorch references for every op: the oracles the GPU tests compare against, runnable on CPU.

Also importable as ``tile_kernels_aot.torch``, the name upstream TileKernels uses for its references.
"""

from tile_kernels_aot.reference.block_cast import (
    per_block_cast, per_block_cast_lossless, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only,
)
from tile_kernels_aot.reference.cast import cast, cast_back
from tile_kernels_aot.reference.e5m6 import cast_back_from_e5m6, cast_to_e5m6
from tile_kernels_aot.reference.per_channel import per_channel_cast, per_channel_cast_and_transpose, per_channel_cast_fused
from tile_kernels_aot.reference.mhc import (
    expand_to_mhc_ref, mhc_head_compute_mix_ref, mhc_head_ref, mhc_post_ref, mhc_pre_apply_mix_ref, mhc_pre_norm_fn_ref,
    mhc_pre_ref, mhc_pre_split_mixes_ref, sinkhorn_normalize_ref,
)
from tile_kernels_aot.reference.moe import (
    aux_fi, group_count, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight, topk_sum_and_topk_group_idx,
)
from tile_kernels_aot.reference.moe import (
    expand_to_fused, expand_to_fused_with_sf, fma_f32, fused_num_expanded_tokens, get_fused_mapping, reduce_fused,
)
from tile_kernels_aot.reference.swiglu import (
    swiglu_backward, swiglu_backward_and_per_token_cast, swiglu_forward, swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_token_cast,
)
from tile_kernels_aot.reference.topk import stable_topk, top2_sum_gate
from tile_kernels_aot.reference.transpose import batched_transpose, transpose
from tile_kernels_aot.reference.engram import engram_gate_ref, engram_hash_ref, fused_weight_ref, grad_w_reduce_ref, make_offsets

__all__ = [
    'swiglu_backward', 'swiglu_backward_and_per_token_cast', 'swiglu_forward', 'swiglu_forward_and_per_channel_cast_and_transpose',
    'swiglu_forward_and_per_token_cast',
    'aux_fi', 'batched_transpose', 'cast', 'cast_back', 'group_count', 'inplace_unique_group_indices', 'mask_indices_by_tp',
    'normalize_weight', 'stable_topk', 'top2_sum_gate', 'topk_sum_and_topk_group_idx', 'transpose',
    'expand_to_fused', 'expand_to_fused_with_sf', 'fma_f32', 'fused_num_expanded_tokens', 'get_fused_mapping', 'reduce_fused',
    'per_block_cast', 'per_block_cast_lossless', 'per_block_cast_with_precomputed_sf', 'per_block_cast_with_sf_only',
    'expand_to_mhc_ref', 'mhc_head_compute_mix_ref', 'mhc_head_ref', 'mhc_post_ref', 'mhc_pre_apply_mix_ref',
    'mhc_pre_norm_fn_ref', 'mhc_pre_ref', 'mhc_pre_split_mixes_ref', 'sinkhorn_normalize_ref',
    'cast_back_from_e5m6', 'cast_to_e5m6', 'per_channel_cast', 'per_channel_cast_and_transpose', 'per_channel_cast_fused',
    'engram_gate_ref', 'engram_hash_ref', 'fused_weight_ref', 'grad_w_reduce_ref', 'make_offsets',
]
