"""What the casts with one scale factor per (1, n) block of a row share about those scale factors: the
buffer type (float32 in any strides, or the bytes of packed UE8M0 words), a thread's amax of bf16 values, the
CTA-wide amax of a row, and the store. Used by per_token_cast, per_token_requant, the per-token SwiGLU
forward and the E5M6 casts.

Its own module (not common.py), so that a change here re-lowers only those kernels.
"""

from tilelang import language as T

from kernel_src.quant.addressing import unsigned_index


def token_sf_tensor(packed: bool, rows, blocks, words, word_stride, stride_t, stride_k, row_bytes=None):
    """Scale factors as the kernels read and write them: float32 [rows, blocks] in any strides, or the bytes
    of packed UE8M0 int32 words (word w of row r is bytes [4r, 4r + 4) of row w of the uint8 view, and
    holds the exponents of blocks 4w..4w+3; `row_bytes` = 4 * rows, its own variable where no other buffer
    binds the rows)."""
    if packed:
        return T.StridedTensor[(words, rows * 4 if row_bytes is None else row_bytes), (word_stride, 1), T.uint8]
    return T.StridedTensor[(rows, blocks), (stride_t, stride_k), T.float32]


@T.macro
def bf16_amax_into(values, amax, rows: int, row_pairs: int, row=0, into=0):
    """amax[into] = max(amax[into], largest |v| of rows row .. row + rows of the local bf16 buffer `values`, each
    2 * row_pairs wide), on bf16 pairs: |a| and max are exact in bf16 and one instruction covers two elements, and no
    float32 copy of the values is made (they are widened only where they are cast). __hmax2 skips a NaN as fmaxf
    does; a pair maximum left NaN (every value NaN) is skipped by the fmaxf that fold it in."""
    pairs = T.view(values, (values.shape[0], row_pairs), T.bfloat16x2)
    pair_amax = T.alloc_local((1,), T.bfloat16x2)
    pair_amax[0] = T.abs2(pairs[row, 0])
    for p in T.unroll(1, row_pairs):
        pair_amax[0] = T.max2(pair_amax[0], T.abs2(pairs[row, p]))
    for j in T.unroll(1, rows):
        for p in T.unroll(row_pairs):
            pair_amax[0] = T.max2(pair_amax[0], T.abs2(pairs[row + j, p]))
    pair_halves = T.view(pair_amax, (2,), T.bfloat16)
    amax[into] = T.max(amax[into], T.max(T.Cast('float32', pair_halves[0]), T.Cast('float32', pair_halves[1])))


@T.macro
def cta_max(amax, red, tid, num_warps: int):
    """amax[0] of every thread = the largest amax[0] of the CTA: a warp butterfly, then the warps' maxima
    through `red` (shared, one float32 per warp)."""
    for s in T.unroll(5):
        amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 16 >> s))
    if tid % 32 == 0:
        red[tid // 32] = amax[0]
    T.sync_threads()
    for w in T.unroll(num_warps):
        amax[0] = T.max(amax[0], red[w])


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


def sf_flat_view(out_sf, packed: bool):
    """(view, row_step, block_step): out_sf (a token_sf_tensor) as one flat span from its first element to its
    last, and a row's and a block's steps in it (packed: in bytes, 4 a row and a word's stride a block's word),
    for store_token_sf_flat."""
    if packed:
        view = T.Tensor(((out_sf.shape[0] - 1) * out_sf.strides[0] + out_sf.shape[1],), T.uint8, out_sf.data)
        return view, 4, out_sf.strides[0]
    view = T.Tensor(((out_sf.shape[0] - 1) * out_sf.strides[0] + (out_sf.shape[1] - 1) * out_sf.strides[1] + 1,), T.float32, out_sf.data)
    return view, out_sf.strides[0], out_sf.strides[1]


@T.macro
def store_token_sf_flat(out_sf_flat, packed: bool, row, col, value, npc_log2, hidden, num_tokens, num_sf_blocks, num_sf_words, sf_row_step,
                        sf_block_step):
    """store_token_sf of the block holding column col of row, through sf_flat_view's view by an unsigned 32-bit index
    (see unsigned_index): for scale factors the op allocates, whose every index stays below the element count of
    the data, which the ops keep under 2^31. A column past hidden in a row's last, partial, block still names that
    block: the lane that stores a block's scale factor may hold one of its padding vectors."""
    block = col >> npc_log2
    if row < num_tokens and (block << npc_log2) < hidden:
        if packed:
            if (block >> 2) < num_sf_words:
                store_block_sf_flat(out_sf_flat, packed, row, block, value, ((block + 1) << npc_log2) >= hidden, sf_row_step, sf_block_step)
        elif block < num_sf_blocks:
            store_block_sf_flat(out_sf_flat, packed, row, block, value, False, sf_row_step, sf_block_step)


@T.macro
def store_block_sf_flat(out_sf_flat, packed: bool, row, block, value, last_in_row, sf_row_step, sf_block_step):
    """store_token_sf_flat's store, unmasked: for a row and block the caller knows are in the buffer (its own
    checks, or one chunk per scale factor of an op-allocated buffer: kernel_src.quant.per_token_requant)."""
    if packed:
        # Byte block % 4 of word block / 4 of the row (sf_row_step 4, sf_block_step the word stride);
        # the last block of a row zeroes the rest of its word (deterministic output).
        byte_index = (block >> 2) * sf_block_step + row * 4 + (block & 3)
        out_sf_flat[unsigned_index(byte_index)] = T.Cast(T.uint8, value)
        if last_in_row:
            for b in T.unroll(1, 4):
                if (block & 3) + b < 4:
                    out_sf_flat[unsigned_index(byte_index + b)] = T.uint8(0)
    else:
        out_sf_flat[unsigned_index(row * sf_row_step + block * sf_block_step)] = value
