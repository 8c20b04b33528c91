"""quant.per_token_requant: per_token_cast of an already quantised (data, sf) input, without a bf16 round trip.

The input is e4m3 data, or e2m1 pairs (int8, low nibble = even column), with one scale factor per
(in_block_m, in_block_k) block; the output is e4m3 or e2m1 with one scale factor per (1, num_per_channels)
block, exactly as upstream's per_token_cast computes it for a QuantTensor:
  amax  = max over the block of |q| * s, s the input scale factor of each element (float32; the max of |q|
          within a 32-element chunk times its s is the same number, rounding being monotone),
  sf / multiplier from amax as in per_token_cast (floor, two divisions, or round_sf's powers of two),
  out   = cast(q * (s * multiplier)), the two factors multiplied first, as upstream.

Layout (layout.py): the chunks of 32 elements form a flat sequence of all rows' chunks, each row padded to whole
output blocks, so the chunks of a block are adjacent lanes and its amax is a butterfly of shuffles over
num_per_channels / 32 lanes. Thread t of CTA b owns chunk b * 128 + t, or chunks (2 b + k) * 128 + t for k < 2
(CHUNKS_PER_THREAD), or, TILED, chunk 16 j + t % 16 of row 8 i + t / 16, tile (i, j) = divmod(b, tiles a row). A
chunk lies inside one input block (the input block width is a power of two of at least 32). Compile time: the two
formats, the two scale-factor storages (float32 in any strides, or packed UE8M0 bytes) and the width of x's loads
(VEC_BYTES); run time: hidden, the block sizes (as shifts), round_sf and the strides. Every access is masked against
the buffer dims.

The kernel (kernel.py) loads all of a thread's chunks, then takes each through one path, which computes its amax,
scale factor and codes and stores them:
- e2m1 input (e2m1_input.py): the chunk's amax is the value of its largest magnitude code, and its codes come from a
  table of the eight magnitudes' outputs;
- e4m3 to e2m1 (f16_lanes.py): two elements an instruction in f16 lanes, under a power-of-two factor or by the ratio
  path, else in float32;
- e4m3 to e4m3 (scale.py): element by element in float32.

The chunk's row, chunk of the row and the scale factors' block indices are int32 locals bound once: pasted as
expressions, tilelang widens each use to 64 bits before its shifts, and every address takes 64-bit shifts and
multiplies.
"""

from kernel_src.quant.per_token_requant.e2m1_input import (
    CANONICAL_FIRST_CODES, CANONICAL_TIE_FACTOR, CANONICAL_WINDOW, E2M1_VALUES, EXPONENT_PATH_INPUTS, HALF_TABLE_HIGH, HALF_TABLE_LOW,
    POW2_TABLE_SHIFTS, SHIFTED_CODE_STEP, SHIFTED_CODE_TABLE,
)
from kernel_src.quant.per_token_requant.f16_lanes import (
    E4M3_TO_E2M1_F16_PRELUDE, F16_EXPONENT_PATH_BYTES, F16_EXPONENT_PATH_CARRY, F16_EXPONENT_PATH_INPUTS, RATIO_DOWN, RATIO_NUDGE, RATIO_UP,
)
from kernel_src.quant.per_token_requant.kernel import DECL, build, check, prebuilt
from kernel_src.quant.per_token_requant.layout import CHUNK, CHUNKS_PER_THREAD, NUM_THREADS, TILE_CHUNKS, TILE_ROWS, VEC_BYTES

__all__ = [
    'CANONICAL_FIRST_CODES', 'CANONICAL_TIE_FACTOR', 'CANONICAL_WINDOW', 'CHUNK', 'CHUNKS_PER_THREAD', 'DECL', 'E2M1_VALUES',
    'E4M3_TO_E2M1_F16_PRELUDE', 'EXPONENT_PATH_INPUTS', 'F16_EXPONENT_PATH_BYTES', 'F16_EXPONENT_PATH_CARRY', 'F16_EXPONENT_PATH_INPUTS',
    'HALF_TABLE_HIGH', 'HALF_TABLE_LOW', 'NUM_THREADS', 'POW2_TABLE_SHIFTS', 'RATIO_DOWN', 'RATIO_NUDGE', 'RATIO_UP', 'SHIFTED_CODE_STEP',
    'SHIFTED_CODE_TABLE', 'TILE_CHUNKS', 'TILE_ROWS', 'VEC_BYTES', 'build', 'check', 'prebuilt',
]
