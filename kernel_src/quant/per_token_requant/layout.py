"""per_token_requant's layout: the spec's compile-time choices, the run-time dims, how the chunks are dealt to the
threads, the loads of a chunk and the tiled store of packed scale factors."""

import dataclasses

from tilelang import language as T

from kernel_src.quant.addressing import unsigned_index, unsigned_wide_dot, unsigned_wide_mad
from kernel_src.quant.common import FORMATS, SF_FORMATS
from kernel_src.quant.token_sf import store_block_sf_flat, store_token_sf, token_sf_tensor

NUM_THREADS = 128
CHUNK = 32  # logical elements a chunk, a thread's unit of work
# Two layouts of the chunks over the CTAs, chosen per (in_fmt, fmt, in_sf_format) by measurement:
# - a row's consecutive chunks, CHUNKS_PER_THREAD of them a thread, NUM_THREADS apart (each warp's loads one contiguous
#   run), all loaded before any is encoded. e4m3 -> e2m1 waits on each chunk's load -> amax -> scale -> encode chain
#   with no pipe saturated, and two chunks a thread keep more of it in flight; every other spec is fastest with one.
# - TILED: a CTA takes TILE_ROWS rows of TILE_CHUNKS chunks, so that its packed UE8M0 scale factors fill whole 32-byte
#   sectors (a word of eight rows), which it gathers in shared memory and stores as such (store_tile_sf). With a row's
#   consecutive chunks each lane's byte store takes a sector of its own, which keeps the L2 busy for the e2m1-input
#   UE8M0 specs; the e4m3-input specs and float32 scale factors gain nothing from tiles.
TILE_ROWS = 8
TILE_CHUNKS = NUM_THREADS // TILE_ROWS
TILED = {('e2m1', 'e2m1', 'ue8m0'), ('e2m1', 'e4m3', 'ue8m0')}
CHUNKS_PER_THREAD = {('e4m3', 'e2m1', sf): 2 for sf in SF_FORMATS}
# The untiled specs store a chunk's scale factor through a flat view by an unsigned 32-bit index (store_block_sf_flat),
# where the strided buffer's 64-bit addressing takes about 10 instructions a chunk more, and every spec loads x and its
# scale factors through flat views too (load_chunk). e4m3 -> e4m3 keeps the strided buffers and masks: the flat store
# makes its float32 variant slower (its SASS, the same loads and stores with a predicated store for a branch, does not
# explain why), and with the unmasked scale factor load nvcc keeps its 32 bytes as sixteen 16-bit halves (32 permutes
# more).
STRIDED_BUFFERS = {('e4m3', 'e4m3')}
# Bytes of x a vector load takes (compile time, vec_bytes): 32, a whole chunk of e4m3 input, is one 256-bit load on
# SM100, a whole 32-byte sector, for an x whose pointer and row stride are 32-byte aligned; 16 takes any 16-byte
# aligned x (the op's choice: tile_kernels_aot.quant.per_token.per_token_requant_spec). On sm_90a a 32-byte vector is
# two 16-byte loads, and ptxas gives both widths the same SASS. An e2m1 chunk is 16 bytes: 16 only.
VEC_BYTES = (16, 32)
# CTAs per SM the register allocation must allow, where it costs no spills. e4m3 to e4m3 takes 53 registers unbounded
# (56 allocated: 9 CTAs, 36 KB of loads in flight per SM, one 32-byte chunk a thread); 48 give 10 CTAs and 40 KB, as
# upstream's kernel (48 registers, 10 CTAs of 4 KB), with packed UE8M0 input scale factors; with float32 ones 48 spill
# 8 bytes. e4m3 -> e2m1, both of whose encoders read the f16 pairs the amax widened (f16_lanes), fits 48 registers with
# two chunks a thread (10 CTAs, 80 KB in flight; its float32 path goes eight values at a time). An e2m1 chunk is only
# 16 bytes, and its table path needs few registers: 16 CTAs (32 registers, the SM's 2048 threads) keep 32 KB in flight.
MIN_BLOCKS = {
    ('e4m3', 'e4m3', 'ue8m0'): 10,
    **{('e4m3', 'e2m1', sf): 10 for sf in SF_FORMATS},
    **{('e2m1', fmt, sf): 16 for fmt in FORMATS for sf in SF_FORMATS},
}
# SM100's ptxas spills e4m3 -> e2m1 at 48 registers (8 bytes a thread) with float32 scale factors, and with packed
# UE8M0 ones from 32-byte vectors; by (family, in_fmt, fmt, in_sf_format, vec_bytes).
MIN_BLOCKS_BY_FAMILY = {
    ('sm_100', 'e4m3', 'e2m1', 'f32', 16): 9,
    ('sm_100', 'e4m3', 'e2m1', 'f32', 32): 8,
    ('sm_100', 'e4m3', 'e2m1', 'ue8m0', 32): 9,
}


@dataclasses.dataclass(frozen=True)
class Paths:
    """The compile-time choices of one spec: its formats and scale-factor storages, its layout, and which encoders
    its chunks take. The kernel's macros read them as plain Python values."""

    in_fmt: str
    fmt: str
    in_sf_format: str
    sf_format: str
    vec_bytes: int

    in_fp4 = property(lambda self: self.in_fmt == 'e2m1')
    out_fp4 = property(lambda self: self.fmt == 'e2m1')
    in_packed = property(lambda self: self.in_sf_format == 'ue8m0')
    packed = property(lambda self: self.sf_format == 'ue8m0')
    fmax = property(lambda self: FORMATS[self.fmt][0])
    floor = property(lambda self: FORMATS[self.fmt][1])
    in_bytes = property(lambda self: CHUNK // 2 if self.in_fp4 else CHUNK)  # bytes of a chunk of x
    out_bytes = property(lambda self: CHUNK // 2 if self.out_fp4 else CHUNK)
    in_dtype = property(lambda self: T.int8 if self.in_fp4 else T.float8_e4m3fn)
    out_dtype = property(lambda self: T.int8 if self.out_fp4 else T.float8_e4m3fn)
    # e4m3 -> e2m1 in f16 lanes (f16_lanes).
    f16_path = property(lambda self: not self.in_fp4 and self.out_fp4)
    # Where e2m1_finite_top_nibble encodes (E2M1_SIGNED_PRELUDE): e4m3 -> e2m1's float32 path, and e2m1 -> e2m1's
    # per-chunk tables unless UE8M0 in and out makes every factor a power of two (see encode_table).
    finite_tables = property(lambda self: self.in_fp4 and self.out_fp4 and not (self.in_packed and self.packed))
    finite_encoder = property(lambda self: self.f16_path or self.finite_tables)
    exponent_path = property(lambda self: self.in_fp4 and self.out_fp4 and self.in_packed and self.packed)  # EXPONENT_PATH_INPUTS
    f16_exponent_path = property(lambda self: self.f16_path and self.in_packed and self.packed)  # F16_EXPONENT_PATH_INPUTS
    integer_sf = property(lambda self: self.exponent_path or self.f16_exponent_path)  # the scale factor's byte in sf_exponent
    spec = property(lambda self: (self.in_fmt, self.fmt, self.in_sf_format))
    tiled = property(lambda self: self.spec in TILED)
    strided = property(lambda self: (self.in_fmt, self.fmt) in STRIDED_BUFFERS)
    flat_sf_store = property(lambda self: not self.tiled and not self.strided)
    per_thread = property(lambda self: CHUNKS_PER_THREAD.get(self.spec, 1))


@dataclasses.dataclass(frozen=True, eq=False)
class Dims:
    """The kernel's run-time dims and strides (T.dynamic), and the types of its scale-factor buffers."""

    num_tokens: object
    in_width: object  # bytes per input row: hidden, or hidden / 2 for e2m1
    row_stride: object
    hidden: object
    num_in_sf_rows: object
    num_in_sf_blocks: object
    num_in_sf_words: object
    in_sf_row_bytes: object
    in_sf_word_stride: object
    in_sf_stride_t: object
    in_sf_stride_k: object
    in_sf_type: object
    num_sf_blocks: object
    num_sf_words: object
    sf_word_stride: object
    sf_type: object

    @staticmethod
    def of(p: Paths) -> 'Dims':
        num_tokens = T.dynamic('num_tokens')
        in_width = T.dynamic('in_width')
        row_stride = T.dynamic('row_stride')
        hidden = in_width * 2 if p.in_fp4 else in_width
        num_in_sf_rows, num_in_sf_blocks, num_in_sf_words = T.dynamic('num_in_sf_rows'), T.dynamic('num_in_sf_blocks'), T.dynamic('num_in_sf_words')
        in_sf_row_bytes = T.dynamic('in_sf_row_bytes')
        in_sf_word_stride, in_sf_stride_t, in_sf_stride_k = T.dynamic('in_sf_word_stride'), T.dynamic('in_sf_stride_t'), T.dynamic('in_sf_stride_k')
        in_sf_type = token_sf_tensor(p.in_packed, num_in_sf_rows, num_in_sf_blocks, num_in_sf_words, in_sf_word_stride, in_sf_stride_t,
                                     in_sf_stride_k, in_sf_row_bytes)
        num_sf_blocks, num_sf_words = T.dynamic('num_sf_blocks'), T.dynamic('num_sf_words')
        sf_word_stride = T.dynamic('sf_word_stride')
        sf_type = token_sf_tensor(p.packed, num_tokens, num_sf_blocks, num_sf_words, sf_word_stride, T.dynamic('sf_stride_t'),
                                  T.dynamic('sf_stride_k'))
        return Dims(num_tokens, in_width, row_stride, hidden, num_in_sf_rows, num_in_sf_blocks, num_in_sf_words, in_sf_row_bytes,
                    in_sf_word_stride, in_sf_stride_t, in_sf_stride_k, in_sf_type, num_sf_blocks, num_sf_words, sf_word_stride, sf_type)


@dataclasses.dataclass(eq=False)
class ChunkSite:
    """Where chunk k of a thread lies, and the kernel's values its path reads and stores through: plain Python
    attributes holding TIR expressions (a variable's read, a buffer, a kernel argument), which a macro uses exactly as
    the kernel body would. (A macro's own parameters are bound to locals of their own.) The fields of another layout
    or storage are None."""

    k: object
    row: object
    chunk: object  # of the row, in chunks
    active: object
    block: object  # the scale factor's block (STRIDED_BUFFERS)
    tid: object
    npc_log2: object
    round_sf: object
    block_writer: object  # the thread's chunks are the first of their blocks
    one_chunk_blocks: object
    scales: object  # the thread's input scale factors (load_chunk)
    out: object
    out_sf: object
    out_sf_flat: object
    sf_row_step: object
    sf_block_step: object
    staged: object  # TILED: the tile's scale factors in shared memory
    tile_row: object
    tile_chunk: object


@T.macro
def load_chunk(p: Paths, d: Dims, x, x_sf, all_data, scales, k, row, chunk, active, in_row, in_block):
    """Chunk k of the thread's: its bytes into all_data[k * in_bytes ...], its input scale factor into scales[k]
    (zeros when inactive). x and x_sf are flat views (but STRIDED_BUFFERS), read by unsigned 32 x 32 -> 64-bit
    offsets (addressing), where the strided buffers' signed 64-bit row * stride takes about 10 instructions a chunk
    more; the scale factor unmasked: the op checks that x_sf has exactly the blocks of x (check_input_sf), so an
    active chunk's block is always there."""
    in_bytes = p.in_bytes
    scales[k] = T.Cast(scales.dtype, 0)
    if active:
        for e in T.vectorized(in_bytes):
            if p.strided:
                all_data[k * in_bytes + e] = x[row, chunk * in_bytes + e]
            else:
                all_data[k * in_bytes + e] = x[unsigned_wide_mad(row, d.row_stride // p.vec_bytes, chunk * (in_bytes // p.vec_bytes)) * p.vec_bytes
                                               + e]
        if p.strided:
            if p.in_packed:
                if (in_block >> 2) < d.num_in_sf_words and in_row * 4 < d.in_sf_row_bytes:
                    scales[k] = T.Cast('int32', x_sf[in_block >> 2, in_row * 4 + (in_block & 3)])
            elif in_row < d.num_in_sf_rows and in_block < d.num_in_sf_blocks:
                scales[k] = x_sf[in_row, in_block]
        elif p.in_packed:
            scales[k] = T.Cast('int32', x_sf[unsigned_wide_mad(in_block >> 2, d.in_sf_word_stride, in_row * 4 + (in_block & 3))])
        else:
            scales[k] = x_sf[unsigned_wide_dot(in_row, d.in_sf_stride_t, in_block, d.in_sf_stride_k)]
    else:
        # Zero words, not T.cast(0, e4m3) bytes: nvcc does not fold that conversion, and its F2FP, byte merges and
        # copies (8-12 SASS instructions a chunk, predicated off in active threads but issued by all) would stay in
        # every thread's stream.
        zero_words = T.view(all_data, (p.per_thread * in_bytes // 4,), T.uint32)
        for w in T.unroll(in_bytes // 4):
            zero_words[k * in_bytes // 4 + w] = T.uint32(0)


@T.macro
def store_tile_sf(d: Dims, out_sf, staged, exponent, active, tid, tile_row, tile_chunk, npc_log2):
    """The tile's packed UE8M0 scale factors: each block's first lane puts its exponent byte in shared memory (zero
    when inactive: as store_token_sf, a word's bytes past the row's last block are zero), then one lane a word of
    a row stores it, eight lanes a word of eight rows: 32 contiguous bytes, a whole sector."""
    blocks_log2 = npc_log2 - 5  # chunks a block, as a shift
    tile_word = (tile_chunk >> blocks_log2) >> 2  # the tile's first word (a tile spans 1, 2 or 4)
    if ((tid % TILE_CHUNKS) & ((1 << blocks_log2) - 1)) == 0:
        staged[(tid // TILE_CHUNKS) * TILE_CHUNKS + ((tid % TILE_CHUNKS) >> blocks_log2)] = T.if_then_else(active, T.Cast(T.uint8, exponent),
                                                                                             T.uint8(0))
    T.sync_threads()
    # The words a tile spans from a local: under `tid // 8 < (4 >> (npc_log2 - 5))` tilelang drops the whole
    # branch (docs/design.md).
    tile_words = T.alloc_var(T.int32)
    tile_words = (TILE_CHUNKS >> blocks_log2) >> 2
    word_bytes = T.alloc_local((4,), T.uint8)
    if tid // TILE_ROWS < tile_words and tile_row + tid % TILE_ROWS < d.num_tokens and tile_word + tid // TILE_ROWS < d.num_sf_words:
        for b in T.vectorized(4):
            word_bytes[b] = staged[(tid % TILE_ROWS) * TILE_CHUNKS + (tid // TILE_ROWS) * 4 + b]
        for b in T.vectorized(4):
            out_sf[tile_word + tid // TILE_ROWS, (tile_row + tid % TILE_ROWS) * 4 + b] = word_bytes[b]


@T.macro
def store_chunk_sf(p: Paths, d: Dims, site: ChunkSite, sf_value: T.Ref):
    """The scale factor of the chunk's block, sf_value (its float32, or with integer_sf its exponent byte), from the
    block's first lane: gathered per tile (store_tile_sf), through the flat view, or (STRIDED_BUFFERS) masked in the
    strided buffer, by a lane test of its own (block_writer there moves its SASS)."""
    if p.tiled:
        store_tile_sf(d, site.out_sf, site.staged, sf_value, site.active, site.tid, site.tile_row, site.tile_chunk, site.npc_log2)
    elif p.flat_sf_store and p.packed:
        # The op pads a row's chunks to whole words of packed scale factors (4 blocks), so the bytes past a row's last
        # block are those of inactive chunks, which store zero (deterministic output) where the last block's lane would
        # take a test and three stores a chunk. Unmasked: the op allocates the buffer (alloc_sf).
        if site.block_writer and site.row < d.num_tokens:
            store_block_sf_flat(site.out_sf_flat, p.packed, site.row, site.chunk >> (site.npc_log2 - 5), T.if_then_else(site.active, sf_value, 0),
                                False, site.sf_row_step, site.sf_block_step)
    elif p.flat_sf_store:
        if site.active and site.block_writer:
            store_block_sf_flat(site.out_sf_flat, p.packed, site.row, site.chunk >> (site.npc_log2 - 5), sf_value, False, site.sf_row_step,
                                site.sf_block_step)
    elif site.active and (site.tid & ((1 << (site.npc_log2 - 5)) - 1)) == 0:
        store_token_sf(site.out_sf, p.packed, site.row, site.block, sf_value, (site.block + 1) << site.npc_log2 >= d.hidden, d.num_sf_blocks,
                       d.num_sf_words)


@T.macro
def store_codes(p: Paths, site: ChunkSite, codes):
    """The chunk's codes (e2m1 pairs or e4m3 bytes, out_bytes of them) into its place in out: e2m1 through a flat view
    by an unsigned 32-bit offset (the op keeps the output below 2^31 elements), e4m3 into the 2-d buffer (as its
    scale factors, see STRIDED_BUFFERS, the flat store makes it slower)."""
    code_bytes = T.view(codes, (p.out_bytes,), p.out_dtype)
    if site.active:
        if p.out_fp4:
            out_flat = T.Tensor((site.out.shape[0] * site.out.shape[1],), p.out_dtype, site.out.data)
            for e in T.vectorized(p.out_bytes):
                out_flat[unsigned_index(site.row * site.out.shape[1] + site.chunk * p.out_bytes) + e] = code_bytes[e]
        else:
            for e in T.vectorized(p.out_bytes):
                site.out[site.row, site.chunk * p.out_bytes + e] = code_bytes[e]
