"""The scale-factor store of the casts with one scale per (1, n) block of a row: per_token_cast,
per_token_requant and the per-token SwiGLU forward.

Its own module (not common.py), so that a change here re-lowers only those three kernels.
"""

from tilelang import language as T


@T.macro
def store_token_sf(out_sf, packed: bool, row, block, value, last_in_row, num_sf_blocks, num_sf_words):
    """The scale factor `value` of block `block` of `row`, masked against the buffer's dims: float32 at
    out_sf[row, block], or (packed) its UE8M0 exponent as byte block % 4 of word block / 4, out_sf being
    the uint8 view (words, rows * 4) of the int32 words. With `last_in_row` the rest of the word is zeroed:
    upstream leaves those bytes unset, zeros make the output deterministic."""
    if packed:
        if (block >> 2) < num_sf_words:
            out_sf[block >> 2, row * 4 + (block & 3)] = T.Cast(T.uint8, value)
            if last_in_row:
                for b in T.unroll(1, 4):
                    if (block & 3) + b < 4:
                        out_sf[block >> 2, row * 4 + (block & 3) + b] = T.uint8(0)
    elif block < num_sf_blocks:
        out_sf[row, block] = value
