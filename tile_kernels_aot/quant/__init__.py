"""quant ops (upstream TileKernels v1 names and signatures).

Built in this release:

* ``per_token_cast``, ``per_token_cast_with_sf_only`` and ``per_token_cast_with_precomputed_sf``
  (per_token.py): bfloat16 or float32 input (any row stride, last dim contiguous, hidden a multiple of 16)
  to e4m3 or e2m1 (two codes per int8, low nibble = even column), 16, 32, 64 or 128 channels per scale
  factor, or one per row (``num_per_channels == hidden``, hidden a multiple of 64 and at most 16384 bf16 /
  8192 fp32 elements); scale factors row-major float32, TMA-aligned column-major float32, or packed UE8M0
  (column-major, with ``round_sf``); with or without ``round_sf``. ``per_token_cast`` also re-quantises an
  e4m3 / e2m1 ``(data, sf)`` input with scale factors per ``x_block_size`` block (per_token_requant).
* ``cast_back`` and ``per_token_cast_back`` (per_token.py): e4m3 or e2m1 data with scale factors per
  ``(m, n)`` block (m a power of two, n a multiple of 16) in any of those layouts, to bf16 or fp32.
* ``per_token_cast(fmt='e5m6')`` and ``cast_back(x_special_fmt='e5m6')`` (e5m6.py, also exported as
  ``per_token_cast_to_e5m6`` and ``cast_back_from_e5m6``): 12-bit floats, one scale factor per token.
* ``per_block_cast``, ``per_block_cast_with_sf_only``, ``per_block_cast_with_precomputed_sf`` (per_block.py):
  bfloat16 or float32 ``(num_tokens, hidden)`` to e4m3 or e2m1 with one scale factor per
  ``(block_m, block_k)`` block, blocks (128, 128) and (32, 32) prebuilt ((128, 32) and (32, 128) are
  declared and build on request); ``per_block_cast_lossless``: e2m1 ``(data, sf)`` with power-of-two scale
  factors on small blocks to e4m3 on (1, 128), (32, 32) or (128, 128) blocks, without loss.
* ``per_channel_cast``, ``per_channel_cast_fused`` and ``per_channel_cast_and_transpose`` (per_channel.py):
  e4m3 with one scale factor per channel and block of tokens, the fused one gathering rows and
  dequantising an e4m3 input first; ``unpack_from_e2m1fn_x2``, a pure-PyTorch e2m1 decoder for debugging.
* ``swiglu_forward_and_per_token_cast``, ``swiglu_forward_and_per_channel_cast_and_transpose`` and
  ``swiglu_backward_and_per_token_cast`` (swiglu.py): SwiGLU fused with e4m3 casts.

Not built (they raise NotImplementedError naming what is missing; nothing falls back to a slower path):
``fmt='e5m6'`` in ``per_token_cast_with_sf_only`` and ``per_token_cast_with_precomputed_sf``, and a
precomputed packed UE8M0 ``sf``. (Upstream asserts on a quantised input to the sf-only and precomputed
variants; so do these, with a ValueError.)

Every argument is checked before anything is allocated or launched; what varies at run time (token
counts, hidden sizes, strides, flags) is a run-time argument of the kernels. Helpers the families share
live in _common.py.
"""

from tile_kernels_aot.quant._common import QuantTensor
from tile_kernels_aot.quant.e5m6 import cast_back_from_e5m6, per_token_cast_to_e5m6
from tile_kernels_aot.quant.per_block import (
    per_block_cast, per_block_cast_lossless, per_block_cast_with_precomputed_sf, per_block_cast_with_sf_only,
)
from tile_kernels_aot.quant.per_channel import per_channel_cast, per_channel_cast_and_transpose, per_channel_cast_fused, unpack_from_e2m1fn_x2
from tile_kernels_aot.quant.per_token import (
    cast_back, per_token_cast, per_token_cast_back, per_token_cast_spec, per_token_cast_with_precomputed_sf, per_token_cast_with_sf_only,
)
from tile_kernels_aot.quant.swiglu import (
    swiglu_backward_and_per_token_cast, swiglu_forward_and_per_channel_cast_and_transpose, swiglu_forward_and_per_token_cast,
)

__all__ = [
    'QuantTensor',
    'per_token_cast', 'per_token_cast_with_sf_only', 'per_token_cast_with_precomputed_sf', 'per_token_cast_spec',
    'cast_back', 'per_token_cast_back', 'per_token_cast_to_e5m6', 'cast_back_from_e5m6',
    'per_block_cast', 'per_block_cast_with_sf_only', 'per_block_cast_with_precomputed_sf', 'per_block_cast_lossless',
    'per_channel_cast', 'per_channel_cast_fused', 'per_channel_cast_and_transpose', 'unpack_from_e2m1fn_x2',
    'swiglu_forward_and_per_token_cast', 'swiglu_forward_and_per_channel_cast_and_transpose', 'swiglu_backward_and_per_token_cast',
]
