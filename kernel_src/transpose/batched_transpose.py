"""transpose.batched_transpose: out[b, j, i] = x[b, i, j] for (B, M, N) with M, N multiples of 64.

A transpose moves bits, so the program works on 32-bit words and is specialised on the element size,
not the dtype: one cubin serves bf16, fp16 and int16 alike. Each thread loads a v x v block of
elements with `vec_bytes` vector loads (v = vec_bytes / elem_bytes), transposes it in registers with
byte permutes, and stores v vectors of the output. A warp places 8 lanes along a row and 4 along a
column, so both its loads and its stores cover whole 32-byte sectors: no shared memory, no barrier.

Row and batch strides are run-time arguments. `vec_bytes` is the alignment the variant needs of the
data pointer and of the row stride in bytes; the op picks the widest variant the input allows.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

LANES_ALONG_ROW = 8  # lanes sharing one input row: 8 x vec_bytes >= 32 bytes per row segment
LANES_ALONG_COL = 4  # lanes sharing one output row: 4 x vec_bytes >= 16 bytes per row segment
WORD_BYTES = 4


def _block_edge(elem_bytes: int, vec_bytes: int) -> int:
    return vec_bytes // elem_bytes


def check(elem_bytes: int, vec_bytes: int, tile_m: int, tile_n: int) -> None:
    if elem_bytes not in (1, 2, 4):
        raise ValueError(f'elem_bytes must be 1, 2 or 4, got {elem_bytes}')
    if vec_bytes not in (4, 8, 16) or vec_bytes < elem_bytes:
        raise ValueError(f'vec_bytes must be 4, 8 or 16 and at least elem_bytes, got {vec_bytes}')
    if tile_m not in (64, 128) or tile_n not in (64, 128):
        raise ValueError(f'tiles must be 64 or 128, got {tile_m}x{tile_n}')
    v = _block_edge(elem_bytes, vec_bytes)
    if tile_m % (LANES_ALONG_COL * v) or tile_n % (LANES_ALONG_ROW * v):
        raise ValueError(f'a warp tile of {LANES_ALONG_COL * v}x{LANES_ALONG_ROW * v} does not divide {tile_m}x{tile_n}')


def check_or_none(elem_bytes: int, vec_bytes: int, tile_m: int, tile_n: int) -> str | None:
    try:
        check(elem_bytes, vec_bytes, tile_m, tile_n)
    except ValueError as exc:
        return str(exc)
    return None


def build(arch: Arch, elem_bytes: int, vec_bytes: int, tile_m: int, tile_n: int, max_warps: int = 8) -> KernelProgram:
    v = _block_edge(elem_bytes, vec_bytes)  # block edge in elements
    per_word = WORD_BYTES // elem_bytes  # elements per 32-bit word
    vec_words = max(vec_bytes // WORD_BYTES, 1)
    bits = 8 * elem_bytes
    elem_mask = (1 << bits) - 1
    warp_m, warp_n = LANES_ALONG_COL * v, LANES_ALONG_ROW * v
    warp_tiles_n = tile_n // warp_n
    num_warp_tiles = (tile_m // warp_m) * warp_tiles_n
    num_warps = min(num_warp_tiles, max_warps)  # fewer warps: more tiles, so more loads in flight, per thread
    tiles_per_warp = num_warp_tiles // num_warps

    num_batches = T.dynamic('num_batches')
    num_rows = T.dynamic('num_rows')  # M, in elements
    row_words = T.dynamic('row_words')  # N, in words
    row_stride = T.dynamic('row_stride')  # in words
    batch_stride = T.dynamic('batch_stride')  # in words

    def block_origin(pid_m, pid_n, tid, t):
        """Input row and column (in elements) of the t-th v x v block of a thread."""
        warp_tile = tid // 32 * tiles_per_warp + t
        lane = tid % 32
        row = pid_m * tile_m + warp_tile // warp_tiles_n * warp_m + lane // LANES_ALONG_ROW * v
        col = pid_n * tile_n + warp_tile % warp_tiles_n * warp_n + lane % LANES_ALONG_ROW * v
        return row, col

    @T.prim_func
    def batched_transpose(
        x: T.StridedTensor[(num_batches, num_rows, row_words), (batch_stride, row_stride, 1), T.uint32],
        out: T.Tensor[(num_batches, row_words * per_word, num_rows // per_word), T.uint32],
    ):
        with T.Kernel(row_words // (tile_n // per_word), num_rows // tile_m, num_batches, threads=32 * num_warps) as (pid_n, pid_m, pid_b):
            T.assume(num_rows % tile_m == 0)
            T.assume(row_words % (tile_n // per_word) == 0)
            T.assume(row_stride % vec_words == 0)
            T.assume(batch_stride % vec_words == 0)
            tid = T.get_thread_binding()
            src = T.alloc_local((tiles_per_warp, v, vec_words), T.uint32)
            dst = T.alloc_local((tiles_per_warp, v, vec_words), T.uint32)
            # Issue every load of the thread before the first permute, so they are all in flight at once.
            for t in T.unroll(tiles_per_warp):
                row, col = block_origin(pid_m, pid_n, tid, t)
                for i in T.unroll(v):
                    for k in T.vectorized(vec_words):
                        src[t, i, k] = x[pid_b, row + i, col // per_word + k]
            for t in T.unroll(tiles_per_warp):
                # Output row j, word w gathers element j of input rows w*per_word .. w*per_word+per_word-1.
                for j in T.unroll(v):
                    for w in T.unroll(vec_words):
                        word = T.alloc_var(T.uint32)
                        word = T.uint32(0)
                        for r in T.unroll(per_word):
                            element = (src[t, w * per_word + r, j // per_word] >> T.uint32(bits * (j % per_word))) & T.uint32(elem_mask)
                            word = word | (element << T.uint32(bits * r))
                        dst[t, j, w] = word
            for t in T.unroll(tiles_per_warp):
                row, col = block_origin(pid_m, pid_n, tid, t)
                for j in T.unroll(v):
                    for w in T.vectorized(vec_words):
                        out[pid_b, col + j, row // per_word + w] = dst[t, j, w]

    return KernelProgram(batched_transpose, alignment={'x': vec_bytes, 'out': 16})


def prebuilt():
    for elem_bytes in (1, 2, 4):
        for vec_bytes in (16, 8, 4):
            for tile_m, tile_n in ((64, 64), (128, 128)):
                if check_or_none(elem_bytes, vec_bytes, tile_m, tile_n) is None:
                    yield dict(elem_bytes=elem_bytes, vec_bytes=vec_bytes, tile_m=tile_m, tile_n=tile_n)


DECL = KernelDecl(
    name='transpose.batched_transpose',
    params=(param('elem_bytes', 'int', 'eb'), param('vec_bytes', 'int', 'v'), param('tile_m', 'int', 'tm'), param('tile_n', 'int', 'tn')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={
        'tl.disable_warp_specialized': True,
        # Lower global accesses to explicit ld/st.global: without it nvcc splits the 16-byte store of a
        # register array into four 4-byte stores.
        'tl.enable_lower_ldgstg': True,
    },
)
