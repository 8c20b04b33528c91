"""Autograd ops and model-level composites, as upstream TileKernels' ``tile_kernels.modeling``."""

from tile_kernels_aot.modeling import engram, mhc

__all__ = ['engram', 'mhc']
