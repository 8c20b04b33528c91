"""quant.cast_back: e4m3 or e2m1 data with one scale factor per (num_per_tokens, num_per_channels) block, back
to bf16 or fp32: out = float(q) * sf, rounded once to the output dtype.

The data format, the scale-factor storage (float32 in any strides, or packed UE8M0 bytes) and the output
dtype are compile time; the hidden size, the block width (any multiple of 16), the block height (a power
of two: the scale-factor row of a token is token >> sf_row_shift) and the scale-factor strides are
run-time arguments. A vector is 16 logical elements (16 bytes of e4m3, 8 of e2m1); the
vectors of all rows form one flat sequence and thread t of CTA b holds vectors b * slots + j * 128 + t,
so every slot is busy whatever the hidden size. Rows and blocks come from flat indices by host-computed
multiply-shift magic numbers (see tile_kernels_aot.quant), and every access is masked against the buffer
dims. e2m1 codes decode with integer arithmetic: magnitude codes 2..7 are the float32 with exponent
126 + code // 2 and top mantissa bit code % 2; code 1 is 0.5; bit 3 is the sign.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.common import SF_FORMATS, e2m1_value

NUM_THREADS = 128
NUM_VECTORS = 4
VECTOR_ELEMS = 16
FORMATS = {'e4m3': 1, 'e2m1': 2}  # logical elements per byte
OUT_DTYPES = ('bfloat16', 'float32')


def check(fmt: str, out_dtype: str, sf_format: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f'fmt must be one of {sorted(FORMATS)}, got {fmt!r}')
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f'out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')


def build(arch: Arch, fmt: str, out_dtype: str, sf_format: str, num_threads: int = NUM_THREADS, num_vectors: int = NUM_VECTORS) -> KernelProgram:
    fp4 = fmt == 'e2m1'
    packed = sf_format == 'ue8m0'
    bytes_per_vector = VECTOR_ELEMS // FORMATS[fmt]
    slots = num_threads * num_vectors

    num_tokens = T.dynamic('num_tokens')
    if fp4:
        # The data binds the dims, so the logical hidden is twice the packed width.
        packed_hidden = T.dynamic('packed_hidden')
        hidden = packed_hidden * 2
    else:
        hidden = T.dynamic('hidden')
    num_sf_rows = T.dynamic('num_sf_rows')  # ceil(num_tokens / num_per_tokens)
    num_sf_blocks = T.dynamic('num_sf_blocks')
    sf_stride_t = T.dynamic('sf_stride_t')
    sf_stride_k = T.dynamic('sf_stride_k')
    num_sf_words = T.dynamic('num_sf_words')
    sf_word_stride = T.dynamic('sf_word_stride')
    in_type = T.Tensor[(num_tokens, packed_hidden), T.int8] if fp4 else T.Tensor[(num_tokens, hidden), T.float8_e4m3fn]
    if packed:
        sf_row_bytes = T.dynamic('sf_row_bytes')  # 4 * the rows: no other buffer binds them
        sf_type = T.StridedTensor[(num_sf_words, sf_row_bytes), (sf_word_stride, 1), T.uint8]
    else:
        sf_type = T.StridedTensor[(num_sf_rows, num_sf_blocks), (sf_stride_t, sf_stride_k), T.float32]

    # Row and column (in elements) of a thread's j-th vector, as plain expressions so that tilelang can
    # prove the column a multiple of the vector and emit wide accesses.
    def where(pid, j, tid, vectors_per_row, row_magic, row_shift):
        v = pid * slots + j * num_threads + tid
        row = T.Cast('int32', (T.Cast('int64', v) * row_magic) >> T.Cast('int64', row_shift))
        return row, (v - row * vectors_per_row) * VECTOR_ELEMS

    @T.prim_func
    def cast_back(
        x: in_type,
        x_sf: sf_type,
        out: T.Tensor[(num_tokens, hidden), out_dtype],
        vectors_per_row: T.int32,
        row_magic: T.int64,
        row_shift: T.int32,
        block_magic: T.int64,
        block_shift: T.int32,
        sf_row_shift: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * vectors_per_row, slots), threads=num_threads) as pid:
            if fp4:
                T.assume(packed_hidden % (VECTOR_ELEMS // 2) == 0)
            else:
                T.assume(hidden % VECTOR_ELEMS == 0)
            tid = T.get_thread_binding()
            data = T.alloc_local((num_vectors, bytes_per_vector), T.int8 if fp4 else T.float8_e4m3fn)
            sf = T.alloc_local((num_vectors,), T.float32)
            result = T.alloc_local((VECTOR_ELEMS,), out_dtype)
            # All loads first (data, then the scale factors), so that they are in flight together.
            for j in T.unroll(num_vectors):
                row, col = where(pid, j, tid, vectors_per_row, row_magic, row_shift)
                if row < num_tokens and col < hidden:
                    for e in T.vectorized(bytes_per_vector):
                        data[j, e] = x[row, col // FORMATS[fmt] + e]
            for j in T.unroll(num_vectors):
                row, col = where(pid, j, tid, vectors_per_row, row_magic, row_shift)
                # The block of the vector: (col / 16) // (num_per_channels / 16), by magic number.
                block = T.Cast('int32', (T.Cast('int64', col // VECTOR_ELEMS) * block_magic) >> T.Cast('int64', block_shift))
                sf_row = row >> sf_row_shift
                sf[j] = T.float32(0)
                if row < num_tokens and col < hidden:
                    if packed:
                        if (block >> 2) < num_sf_words and sf_row * 4 < sf_row_bytes:
                            sf[j] = T.reinterpret(T.Cast('uint32', x_sf[block >> 2, sf_row * 4 + (block & 3)]) << T.uint32(23), T.float32)
                    elif block < num_sf_blocks and sf_row < num_sf_rows:
                        sf[j] = x_sf[sf_row, block]
            for j in T.unroll(num_vectors):
                row, col = where(pid, j, tid, vectors_per_row, row_magic, row_shift)
                if row < num_tokens and col < hidden:
                    for e in T.unroll(VECTOR_ELEMS):
                        if fp4:
                            code = (T.Cast('int32', data[j, e // 2]) >> (4 * (e % 2))) & 15
                            result[e] = T.Cast(out_dtype, e2m1_value(code) * sf[j])
                        else:
                            result[e] = T.Cast(out_dtype, T.Cast('float32', data[j, e]) * sf[j])
                    for e in T.vectorized(VECTOR_ELEMS):
                        out[row, col + e] = result[e]

    return KernelProgram(cast_back, alignment={'x': bytes_per_vector, 'x_sf': 1 if packed else 4, 'out': 16})


def prebuilt():
    for fmt in FORMATS:
        for out_dtype in OUT_DTYPES:
            for sf_format in SF_FORMATS:
                yield dict(fmt=fmt, out_dtype=out_dtype, sf_format=sf_format)


DECL = KernelDecl(
    name='quant.cast_back',
    params=(param('fmt', 'str', ''), param('out_dtype', 'str', ''), param('sf_format', 'str', 'sf')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    # Every access is masked explicitly against the buffer dims; tilelang's per-element guards would stop
    # the vectorisation, since it cannot prove that a vector never straddles the run-time hidden.
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
)
