"""Upstream's name for the references: ``tile_kernels.torch`` becomes ``tile_kernels_aot.torch``."""

from tile_kernels_aot.reference import *  # noqa: F403
from tile_kernels_aot.reference import __all__  # noqa: F401
