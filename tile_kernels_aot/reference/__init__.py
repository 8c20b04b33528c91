"""Pure-PyTorch references for every op: the oracles the GPU tests compare against, runnable on CPU.

Also importable as ``tile_kernels_aot.torch``, the name upstream TileKernels uses for its references.
"""

from tile_kernels_aot.reference.cast import cast, cast_back
from tile_kernels_aot.reference.topk import stable_topk
from tile_kernels_aot.reference.transpose import batched_transpose, transpose

__all__ = ['batched_transpose', 'cast', 'cast_back', 'stable_topk', 'transpose']
