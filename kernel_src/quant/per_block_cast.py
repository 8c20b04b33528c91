"""quant.per_block_cast: bf16/fp32 (num_tokens, hidden) to e4m3 or e2m1 with one scale factor per
(block_m, block_k) block of tokens x channels.

Per block: amax = max |x|, clamped = max(amax, floor), sf = clamped / max and the multiplier max / clamped
(two IEEE divisions, as upstream), or with `round_sf` sf rounded up to a power of two and the multiplier
its exact inverse. e4m3: max 448, floor 1e-4, out = e4m3_satfinite(x * multiplier). e2m1: max 6, floor
6 * 2^-126, out = e2m1 RTNE saturated at 6, two codes per byte, the even column in the low nibble.

Compile time: the input dtype, the format, the block shape and the scale-factor storage (float32 in any
strides, i.e. row-major or TMA-aligned column-major, or packed UE8M0 bytes). Run time: the token count,
the hidden size (a multiple of 16), the row stride, round_sf and the mode (cast, scale factors only, or
cast with precomputed float32 scale factors, whose multiplier is 1 / sf).

Layout (`TileShape`): a CTA of 256 threads owns one row block (block_m rows) and `lanes` vectors (`vec_bytes`, 16 or 32) of
each of those rows. A warp covers 32 / lanes rows of `lanes` adjacent vectors (256 or 512 contiguous bytes
per row), and thread (warp w, lane l) holds vector l % lanes of rows j * 8 * (32 / lanes) + w * (32 / lanes)
+ l // lanes, j < vectors. So all of a thread's vectors lie in one scale-factor block, and the block amax
is: the thread's own maximum, a butterfly over the lanes of the block (and over the rows of a warp when a warp
covers several), then the eight warps' partials through shared memory. All loads are issued before any
arithmetic. Rows past num_tokens and vectors past hidden read as zero (e4m3) or re-read the last row or the
row's last vector in the same block (e2m1), which cannot raise an amax, and every store is masked against
the buffer dims, so no run-time argument can make the kernel write out of bounds. Unlike upstream (whose
kernel leaves them unset), the bytes of a packed UE8M0 word past the last block are written as zero.
"""

import dataclasses

import tilelang  # noqa: F401  (tilelang before tvm)
from tilelang import language as T

from kernel_src.cuda import prelude
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import unsigned_wide_mad
from kernel_src.quant.common import (
    FORMATS, IN_DTYPES, MODE_PRECOMPUTED, MODE_SF_ONLY, SF_FORMATS, e2m1_vector_codes, inverse_pow2, pow2, pow2_scale_exponent,
)

NUM_THREADS = 256
NUM_WARPS = NUM_THREADS // 32
# Bytes a vector: 32 where the input's pointer and row stride allow (one 256-bit access on SM100, as upstream's
# casts use there; two 16-byte ones on sm_90a), else 16. A CTA row covers the same bytes either way, in half as many
# lanes, so a warp covers twice the rows and a thread holds half as many vectors.
VEC_BYTES = (16, 32)
BLOCK_SIZES = (32, 128)
PREBUILT_BLOCKS = ((128, 128), (32, 32))  # the block shapes upstream tests; the other two build on request
# CTAs per SM the register allocation must allow for e4m3 with 128-row blocks (256 threads: at most 80 registers):
# 3 CTAs, 96 KB of loads in flight per SM. Without the cap, the unmasked path of interior CTAs takes 83-86
# registers, 2 CTAs per SM.
E4M3_MIN_BLOCKS = {128: 3}
# CTAs per SM for e2m1, by input dtype and block_m (256 threads: 2 CTAs at most 128 registers, 4 at most 64, 6
# at most 40): with its loads and stores free of branches, nvcc otherwise encodes every vector at once for
# ILP (167 registers for bf16 128-row blocks, one CTA per SM; float32 32-row blocks 47, 5 CTAs). float32
# 128-row blocks hold twice the loaded bytes: capped at 64 registers they are slower than at 2 CTAs.
E2M1_MIN_BLOCKS = {('bfloat16', 128): 4, ('bfloat16', 32): 6, ('float32', 128): 2, ('float32', 32): 6}


@dataclasses.dataclass(frozen=True)
class TileShape:
    """Which vectors a thread of a 256-thread CTA holds, for a reduction block of block_m rows and
    lanes_per_block vectors per row (shared with quant.per_block_cast_lossless)."""

    block_m: int  # rows per scale-factor block; 1 = a block is part of one row
    lanes_per_block: int  # vectors of a row in one block (a power of two, at most 32)
    lanes: int  # vectors of a row per CTA (16 or 32)
    vectors: int  # vectors per thread

    @property
    def rows_per_warp(self) -> int:
        return 32 // self.lanes

    @property
    def rows(self) -> int:  # rows per CTA
        return self.vectors * NUM_WARPS * self.rows_per_warp

    @property
    def blocks_per_row(self) -> int:  # blocks across the CTA's columns
        return self.lanes // self.lanes_per_block

    def row(self, tid, j):
        """The CTA row of a thread's j-th vector."""
        lane, warp = tid % 32, tid // 32
        return j * (NUM_WARPS * self.rows_per_warp) + warp * self.rows_per_warp + lane // self.lanes

    def lane_col(self, tid):
        """The vector (within the CTA's columns) that the thread holds in each of its rows."""
        return tid % self.lanes

    @staticmethod
    def for_block(block_m: int, lanes_per_block: int, vec_bytes: int = 16) -> 'TileShape':
        if block_m == 1:
            # Independent rows: a row segment of 32 vectors per warp, 4 rows per thread.
            assert vec_bytes == 16
            return TileShape(1, lanes_per_block, 32, 4)
        # 512 bytes of a row per CTA where a block is 32 rows or 512 bytes wide, else 256.
        lanes = (512 if (block_m == 32 or lanes_per_block * vec_bytes == 512) else 256) // vec_bytes
        shape = TileShape(block_m, lanes_per_block, lanes, block_m * lanes // NUM_THREADS)
        assert shape.rows == block_m and lanes % lanes_per_block == 0
        return shape


# Lane-wise max / min of two bf16 pairs held in uint32 words (tk_bf16x2_max / tk_bf16x2_min: __hmax2 / __hmin2, which
# nvcc fuses into one three-input VHMNMX.BF16_V2 per two new words; like fmaxf, both return the other operand for a
# NaN), as device functions in the kernel's prelude: the words are also read as uint32 for the widening, and tilelang's
# storage rewrite rejects a local buffer viewed both as uint32 and as bfloat16x2.
_BF16X2_PRELUDE = prelude('bf16x2_minmax.cuh')


def bf16x2_max(a, b):
    return T.call_extern('uint32', 'tk_bf16x2_max', a, b)


def bf16x2_min(a, b):
    return T.call_extern('uint32', 'tk_bf16x2_min', a, b)


def bf16_low_as_float(word):
    """float32 of the bf16 in the low half of a uint32 word (exact: a bf16 is the top half of its float32)."""
    return T.reinterpret(word << T.uint32(16), T.float32)


def bf16_high_as_float(word):
    return T.reinterpret(word & T.uint32(0xFFFF0000), T.float32)


@T.macro
def block_max(tile: TileShape, value, i, red, tid):
    """Max of value[i] (a float32 local holding the thread's partial) over the thread's block, in place.

    For block_m == 1, value[i] is the partial of one row and only lanes combine; otherwise it is the partial
    of all the thread's rows, and `red` (shared, (NUM_WARPS, blocks_per_row) float32) combines the warps."""
    for s in T.unroll(tile.lanes_per_block.bit_length() - 1):
        value[i] = T.max(value[i], T.shfl_xor(value[i], 1 << s))
    if tile.block_m > 1:
        for r in range(tile.rows_per_warp.bit_length() - 1):  # a warp's rows: lanes `lanes` apart
            value[i] = T.max(value[i], T.shfl_xor(value[i], tile.lanes << r))
        lane = tid % 32
        if lane < tile.lanes and lane % tile.lanes_per_block == 0:
            red[tid // 32, lane // tile.lanes_per_block] = value[i]
        T.sync_threads()
        for w in T.unroll(NUM_WARPS):
            value[i] = T.max(value[i], red[w, tile.lane_col(tid) // tile.lanes_per_block])


@T.macro
def store_sf(out_sf, packed: bool, sf_row, block, sf, last):
    """Store power-of-two or float32 scale factor `sf` of block (sf_row, block), masked against out_sf's dims.

    Packed: out_sf is the uint8 (words, 4 * rows) view, and `last` (the row's last block) zeroes the bytes of
    the word past the block, so the output is deterministic."""
    if packed:
        if (block >> 2) < out_sf.shape[0] and sf_row * 4 + 3 < out_sf.shape[1]:
            out_sf[block >> 2, sf_row * 4 + (block & 3)] = T.Cast(T.uint8, T.reinterpret(sf, T.uint32) >> T.uint32(23))
            if last:
                for b in T.unroll(1, 4):
                    if (block & 3) + b < 4:
                        out_sf[block >> 2, sf_row * 4 + (block & 3) + b] = T.uint8(0)
    elif sf_row < out_sf.shape[0] and block < out_sf.shape[1]:
        out_sf[sf_row, block] = sf


def check(in_dtype: str, fmt: str, block_m: int, block_k: int, sf_format: str, vec_bytes: int) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if fmt not in FORMATS:
        raise ValueError(f'fmt must be one of {sorted(FORMATS)}, got {fmt!r}')
    if block_m not in BLOCK_SIZES or block_k not in BLOCK_SIZES:
        raise ValueError(f'block_m and block_k must be in {BLOCK_SIZES}, got ({block_m}, {block_k})')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')
    if vec_bytes not in VEC_BYTES:
        raise ValueError(f'vec_bytes must be one of {VEC_BYTES}, got {vec_bytes!r}')


def build(arch: Arch, in_dtype: str, fmt: str, block_m: int, block_k: int, sf_format: str, vec_bytes: int) -> KernelProgram:
    elem_bytes = IN_DTYPES[in_dtype]
    epv = vec_bytes // elem_bytes  # elements per vector
    code_word = f'uint{4 * epv}'  # e2m1: the codes of one vector
    fp4 = fmt == 'e2m1'
    bf16_pairs = fp4 and in_dtype == 'bfloat16'
    packed = sf_format == 'ue8m0'
    fmax, floor = FORMATS[fmt]
    tile = TileShape.for_block(block_m, block_k // epv, vec_bytes)
    cols = tile.lanes * epv  # columns per CTA

    num_tokens = T.dynamic('num_tokens')
    hidden = T.dynamic('hidden')
    row_stride = T.dynamic('row_stride')
    num_sf_rows = T.dynamic('num_sf_rows')
    num_sf_blocks = T.dynamic('num_sf_blocks')
    sf_stride_m = T.dynamic('sf_stride_m')
    sf_stride_k = T.dynamic('sf_stride_k')
    num_sf_words = T.dynamic('num_sf_words')
    num_sf_bytes = T.dynamic('num_sf_bytes')
    sf_word_stride = T.dynamic('sf_word_stride')
    out_type = (num_tokens, hidden // 2) if fp4 else (num_tokens, hidden)
    out_dtype = T.int8 if fp4 else T.float8_e4m3fn
    if packed:
        # The bytes of the int32 words: word w of row block m holds the UE8M0 exponents of blocks 4w..4w+3
        # in bytes [4m, 4m + 4) of row w.
        sf_type = T.StridedTensor[(num_sf_words, num_sf_bytes), (sf_word_stride, 1), T.uint8]
    else:
        sf_type = T.StridedTensor[(num_sf_rows, num_sf_blocks), (sf_stride_m, sf_stride_k), T.float32]

    # The thread's vectors, each checked against the buffer dims; zeros outside (they cannot raise an amax).
    @T.macro
    def load_masked(x, values, bx, col, tid):
        for j in T.unroll(tile.vectors):
            row = bx * block_m + tile.row(tid, j)
            if row < num_tokens and col < hidden:
                for e in T.vectorized(epv):
                    values[j, e] = x[row, col + e]
            else:
                for e in T.vectorized(epv):
                    values[j, e] = T.cast(0, in_dtype)

    # e2m1: the thread's vectors with no branch, each from a row and column clamped into x. A row past
    # num_tokens re-reads the last row, which lies in the same row block (the CTA's first row is inside x); a
    # vector past hidden re-reads the row's last vector, which lies in the thread's own scale-factor block
    # whenever that block has a column inside x (hidden and block starts are multiples of the vector), and
    # otherwise the block is neither stored nor scale-factored. A re-read value is already in its block's
    # amax, so the amax is that of the block's elements inside x. Addressed in whole vectors by one
    # IMAD.WIDE.U32 each: under the per-vector bounds branch (load_masked) every load redid a signed 64-bit
    # address in a branch of its own, some 32 instructions a load; splitting off an unmasked path instead
    # (as e4m3 does) doubled the e2m1 registers.
    @T.macro
    def load_clamped(x_flat, values, bx, col, tid):
        vector = T.min(col, hidden - epv) // epv
        for j in T.unroll(tile.vectors):
            row = T.min(bx * block_m + tile.row(tid, j), num_tokens - 1)
            for e in T.vectorized(epv):
                values[j, e] = x_flat[unsigned_wide_mad(row, row_stride // epv, vector) * epv + e]

    # The casts and stores of a thread's vectors; `masked` (a Python bool) checks each against the buffer
    # dims. `source` is the thread's bf16 pairs as words (bf16 e2m1) or its values widened to float32.
    @T.macro
    def cast_and_store(out, out_flat, source, multiplier, bx, col, tid, masked):
        for j in T.unroll(tile.vectors):
            row = bx * block_m + tile.row(tid, j)
            if fp4:
                # One word of codes seen as bytes, packed outside the store's condition (as in
                # per_token_cast): the byte-vector store then reads the word back whole.
                codes = T.alloc_local((1,), code_word)
                if bf16_pairs:
                    elements = [(bf16_high_as_float if e % 2 else bf16_low_as_float)(source[j, e // 2]) for e in range(epv)]
                else:
                    elements = [source[j, e] for e in range(epv)]
                codes[0] = e2m1_vector_codes([v * multiplier for v in elements])
                code_bytes = T.view(codes, (epv // 2,), T.int8)
                if T.And(row < num_tokens, col < hidden) if masked else T.bool(True):
                    # In whole code words, unsigned (one IMAD.WIDE.U32), not signed 64-bit row * width + col.
                    for e in T.vectorized(epv // 2):
                        out_flat[unsigned_wide_mad(row, hidden // epv, col // epv) * (epv // 2) + e] = code_bytes[e]
            elif T.And(row < num_tokens, col < hidden) if masked else T.bool(True):
                # Vectorised, so that tilelang converts pairs (one F2FP per two elements, packed in
                # place) instead of one F2FP per element and a byte merge each.
                quantized = T.alloc_local((epv,), T.float8_e4m3fn)
                for e in T.vectorized(epv):
                    quantized[e] = T.Cast(T.float8_e4m3fn, source[j, e] * multiplier)
                for e in T.vectorized(epv):
                    out[row, col + e] = quantized[e]

    @T.prim_func
    def per_block_cast(
        x: T.StridedTensor[(num_tokens, hidden), (row_stride, 1), in_dtype],
        out: T.Tensor[out_type, out_dtype],
        out_sf: sf_type,
        round_sf: T.int32,
        mode: T.int32,
    ):
        # Row blocks on x (up to 2^31 - 1 of them), column slices on y.
        with T.Kernel(T.ceildiv(num_tokens, block_m), T.ceildiv(hidden, cols), threads=NUM_THREADS,
                      prelude=_BF16X2_PRELUDE if bf16_pairs else None) as (bx, by):
            T.assume(hidden % 16 == 0)
            T.assume(row_stride % epv == 0)
            if not fp4 and block_m in E4M3_MIN_BLOCKS:
                T.annotate_min_blocks_per_sm(E4M3_MIN_BLOCKS[block_m])
            if fp4:
                T.annotate_min_blocks_per_sm(E2M1_MIN_BLOCKS[in_dtype, block_m])
            tid = T.get_thread_binding()
            values = T.alloc_local((tile.vectors, epv), in_dtype)
            amax = T.alloc_local((1,), T.float32)
            sf = T.alloc_var(T.float32)
            multiplier = T.alloc_var(T.float32)
            red = T.alloc_shared((NUM_WARPS, tile.blocks_per_row), T.float32)
            out_flat = None
            if fp4:
                # Flat views for the e2m1 loads and stores: x up to its last row's start plus hidden, out whole.
                x_flat = T.Tensor(((num_tokens - 1) * row_stride + hidden,), in_dtype, x.data)
                out_flat = T.reshape(out, (num_tokens * out_type[1],))
            col = by * cols + tile.lane_col(tid) * epv
            block = col // block_k  # the thread's scale-factor column

            # e4m3: a CTA whose rows and columns all lie inside x (every CTA but those of the last row block
            # or column slice) loads and stores with no masks. Under a per-vector bounds check each load sat
            # in a branch of its own with its 64-bit address redone: some 30 instructions between loads, the
            # last of the eight issued at instruction 257 (upstream's kernel, which splits the same way: 68).
            # (e2m1 loads clamped instead, see load_clamped: the split doubled its registers, 64 to 128 for bf16.)
            if not fp4:
                interior = T.alloc_var(T.bool)
                interior = T.And((bx + 1) * block_m <= num_tokens, by * cols + cols <= hidden)
                if interior:
                    for j in T.unroll(tile.vectors):
                        for e in T.vectorized(epv):
                            values[j, e] = x[bx * block_m + tile.row(tid, j), col + e]
                else:
                    load_masked(x, values, bx, col, tid)
            else:
                load_clamped(x_flat, values, bx, col, tid)
            if bf16_pairs:
                # The amax of bf16 e2m1 on the pairs as loaded: a lane-wise max and min over the words (two
                # three-input instructions per four words), widened once at the end, so that only the packed
                # words (not 64 widened floats) stay live across the CTA barrier; each element is widened
                # once, by one shift or mask, where it is cast.
                words = T.view(values, (tile.vectors, epv // 2), T.uint32)
                pair_max = T.alloc_local((1,), T.uint32)
                pair_min = T.alloc_local((1,), T.uint32)
                pair_max[0] = T.uint32(0)
                pair_min[0] = T.uint32(0)
                for j in T.unroll(tile.vectors):
                    for w in T.unroll(epv // 2):
                        pair_max[0] = bf16x2_max(pair_max[0], words[j, w])
                        pair_min[0] = bf16x2_min(pair_min[0], words[j, w])
                # pair_max >= 0 >= pair_min lane-wise, so the largest magnitude is the max of the four |.|.
                amax[0] = T.max(T.max(T.abs(bf16_low_as_float(pair_max[0])), T.abs(bf16_high_as_float(pair_max[0]))),
                                T.max(T.abs(bf16_low_as_float(pair_min[0])), T.abs(bf16_high_as_float(pair_min[0]))))
            else:
                # bf16 widened to float32 once, for the amax and the cast alike: converting at each use left
                # nvcc unpacking every element twice.
                if in_dtype == 'float32':
                    wide = values
                else:
                    wide = T.alloc_local((tile.vectors, epv), T.float32)
                    for j in T.unroll(tile.vectors):
                        for e in T.vectorized(epv):
                            wide[j, e] = T.Cast('float32', values[j, e])
                amax[0] = T.float32(0)
                for j in T.unroll(tile.vectors):
                    for e in T.unroll(epv):
                        amax[0] = T.max(amax[0], T.abs(wide[j, e]))
            # Reduced in every mode, so that the CTA-wide barrier inside is never under a branch.
            block_max(tile, amax, 0, red, tid)

            clamped = T.max(amax[0], T.float32(floor))
            if packed or round_sf != 0:  # UE8M0 scale factors are powers of two: the op requires round_sf
                exponent = pow2_scale_exponent(clamped, fmax)
                multiplier = inverse_pow2(exponent)
                sf = pow2(exponent)
            else:
                sf = clamped / T.float32(fmax)
                multiplier = T.float32(fmax) / clamped
            if not packed:
                if mode == MODE_PRECOMPUTED:
                    multiplier = T.float32(0)
                    if bx < num_sf_rows and block < num_sf_blocks:
                        multiplier = T.float32(1) / out_sf[bx, block]
            # One thread per block stores its scale factor: warp 0, first row, first lane of the block.
            if mode != MODE_PRECOMPUTED and tid < tile.lanes and tid % tile.lanes_per_block == 0 and col < hidden:
                store_sf(out_sf, packed, bx, block, sf, col + block_k >= hidden)

            if mode != MODE_SF_ONLY:
                if fp4:
                    cast_and_store(out, out_flat, words if bf16_pairs else wide, multiplier, bx, col, tid, True)
                else:
                    if interior:
                        cast_and_store(out, out_flat, wide, multiplier, bx, col, tid, False)
                    else:
                        cast_and_store(out, out_flat, wide, multiplier, bx, col, tid, True)

    return KernelProgram(per_block_cast, alignment={'x': vec_bytes, 'out': 16, 'out_sf': 1 if packed else 4})


def constants(arch: Arch, in_dtype: str, fmt: str, block_m: int, block_k: int, sf_format: str, vec_bytes: int) -> dict[str, int]:
    """cta_columns: the columns of a CTA's tile (`cols` in build); the grid's y is ceil(hidden / cta_columns), which
    the op keeps within 65535."""
    epv = vec_bytes // IN_DTYPES[in_dtype]
    return {'cta_columns': TileShape.for_block(block_m, block_k // epv, vec_bytes).lanes * epv}


def prebuilt():
    for in_dtype in IN_DTYPES:
        for fmt in FORMATS:
            for block_m, block_k in PREBUILT_BLOCKS:
                for sf_format in SF_FORMATS:
                    for vec_bytes in VEC_BYTES:
                        yield dict(in_dtype=in_dtype, fmt=fmt, block_m=block_m, block_k=block_k, sf_format=sf_format, vec_bytes=vec_bytes)


DECL = KernelDecl(
    name='quant.per_block_cast',
    params=(
        param('in_dtype', 'str', ''),
        param('fmt', 'str', ''),
        param('block_m', 'int', 'bm'),
        param('block_k', 'int', 'bk'),
        param('sf_format', 'str', 'sf'),
        param('vec_bytes', 'int', 'vb'),
    ),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    # Every access is masked explicitly (against the buffer dims); tilelang's own per-element guards would
    # stop the 16-byte vectorisation, since it cannot prove that a vector never straddles the run-time hidden.
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
    constants=constants,
)
