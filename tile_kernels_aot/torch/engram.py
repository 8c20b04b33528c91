"""Upstream's ``tile_kernels.torch.engram``: the Engram references."""

from tile_kernels_aot.reference.engram import engram_gate_ref, engram_hash_ref, fused_weight_ref, grad_w_reduce_ref, make_offsets

__all__ = ['engram_gate_ref', 'engram_hash_ref', 'fused_weight_ref', 'grad_w_reduce_ref', 'make_offsets']
