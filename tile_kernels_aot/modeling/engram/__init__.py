"""Engram autograd ops, as upstream's ``tile_kernels.modeling.engram``."""

from tile_kernels_aot.modeling.engram.engram_gate import EngramGateFn, engram_gate

__all__ = ['EngramGateFn', 'engram_gate']
