"""Upstream's ``tile_kernels.torch.mhc``: the mHC references."""

from tile_kernels_aot.reference.mhc import *  # noqa: F403
from tile_kernels_aot.reference.mhc import __all__  # noqa: F401
