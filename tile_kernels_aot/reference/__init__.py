"""Pure-PyTorch references for every op: the oracles the GPU tests compare against, runnable on CPU.

Also importable as ``tile_kernels_aot.torch``, the name upstream TileKernels uses for its references.
"""

from tile_kernels_aot.reference.cast import cast, cast_back
from tile_kernels_aot.reference.moe import (
    aux_fi, group_count, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight, topk_sum_and_topk_group_idx,
)
from tile_kernels_aot.reference.topk import stable_topk
from tile_kernels_aot.reference.transpose import batched_transpose, transpose

__all__ = [
    'aux_fi', 'batched_transpose', 'cast', 'cast_back', 'group_count', 'inplace_unique_group_indices', 'mask_indices_by_tp',
    'normalize_weight', 'stable_topk', 'topk_sum_and_topk_group_idx', 'transpose',
]
