"""per_token_cast's per-row kernel (per_row=True, num_per_channels == hidden): a CTA of NUM_THREADS threads owns a row.

Thread t holds vectors j * NUM_THREADS + t (j < ROW_VECTORS[in_dtype]) of a chunk of the row, so that each warp load is
one contiguous span. A row of one chunk is read once and cast from registers; a wider one (bf16 rows over 8192
channels) is read twice, chunk by chunk, for its amax and then to cast. It takes the flat kernel's arguments (the op
passes one set of scalars); the 16-byte aligned variant only.
"""

import dataclasses

from tilelang import language as T

from kernel_src.decl import KernelProgram
from kernel_src.quant.addressing import unsigned_wide_mad
from kernel_src.quant.common import FORMATS, IN_DTYPES, MODE_PRECOMPUTED, MODE_SF_ONLY, block_scale, e2m1_vector_codes
from kernel_src.quant.per_token_cast.flat import NUM_THREADS, buffer_types
from kernel_src.quant.token_sf import bf16_amax_into, cta_max, store_token_sf

# 16-byte vectors a thread holds in registers (a chunk of NUM_THREADS x that many vectors of the row). A CTA loads its
# chunk, then reduces and casts with nothing in flight, so the rows resident per SM are what hides the load latency,
# and the registers a row needs decide how many fit. bf16: 8 vectors (rows of up to 8192 channels in one chunk; 7168
# fills 7 of them), 8 rows an SM; 16 vectors take 147 registers (3 rows an SM, far below copy bandwidth). float32: 16
# vectors (8192 channels, its limit), 4 rows an SM, already near copy bandwidth.
ROW_VECTORS = {'bfloat16': 8, 'float32': 16}
# Resident CTAs per SM asked of ptxas: the kernel is latency-bound, and every load of a CTA is issued at once.
ROW_MIN_BLOCKS = {'bfloat16': 8, 'float32': 5}


@dataclasses.dataclass(frozen=True)
class RowShape:
    """The per-row kernel's compile-time shape, which its macros read as plain Python attributes."""

    in_dtype: str
    fp4: bool

    epv = property(lambda self: 16 // IN_DTYPES[self.in_dtype])  # elements per vector
    num_vectors = property(lambda self: ROW_VECTORS[self.in_dtype])
    chunk_vectors = property(lambda self: NUM_THREADS * self.num_vectors)
    code_word = property(lambda self: f'uint{4 * self.epv}')  # e2m1: the codes of one vector


@T.macro
def load_chunk(r: RowShape, x_flat, row, chunk, tid, values, hidden, row_stride):
    """The thread's vectors of chunk `chunk` of the row; vectors past the row's end read as zeros, which cannot raise
    the amax."""
    for j in T.unroll(r.num_vectors):
        vec = chunk * r.chunk_vectors + j * NUM_THREADS + tid
        if vec * r.epv < hidden:
            for e in T.vectorized(r.epv):
                values[j, e] = x_flat[unsigned_wide_mad(row, row_stride // r.epv, vec) * r.epv + e]
        else:
            for e in T.vectorized(r.epv):
                values[j, e] = T.cast(0, r.in_dtype)


@T.macro
def chunk_amax(r: RowShape, values, amax):
    if r.in_dtype == 'bfloat16':
        bf16_amax_into(values, amax, r.num_vectors, r.epv // 2)
    else:
        for j in T.unroll(r.num_vectors):
            for e in T.unroll(r.epv):
                amax[0] = T.max(amax[0], T.abs(values[j, e]))


@T.macro
def cast_chunk(r: RowShape, out, out_flat, row, chunk, tid, values, multiplier, hidden):
    for j in T.unroll(r.num_vectors):
        vec = chunk * r.chunk_vectors + j * NUM_THREADS + tid
        if r.fp4:
            # The vector's codes as one word that the byte-vector store reads back whole (see the flat kernel's
            # cast_e2m1); a masked vector's codes are computed and dropped.
            codes = T.alloc_local((1,), r.code_word)
            codes[0] = e2m1_vector_codes([T.Cast('float32', values[j, e]) * multiplier[0] for e in range(r.epv)])
            code_bytes = T.view(codes, (r.epv // 2,), T.int8)
            if vec * r.epv < hidden:
                for e in T.vectorized(r.epv // 2):
                    out[row, vec * (r.epv // 2) + e] = code_bytes[e]
        elif vec * r.epv < hidden:
            # Vectorised: tilelang converts pairs (one F2FP per two elements).
            quantized = T.alloc_local((r.epv,), T.float8_e4m3fn)
            for e in T.vectorized(r.epv):
                quantized[e] = T.Cast(T.float8_e4m3fn, T.Cast('float32', values[j, e]) * multiplier[0])
            for e in T.vectorized(r.epv):
                out_flat[unsigned_wide_mad(row, hidden // r.epv, vec) * r.epv + e] = quantized[e]


def build_per_row(in_dtype: str, fmt: str, sf_format: str) -> KernelProgram:
    fp4 = fmt == 'e2m1'
    packed = sf_format == 'ue8m0'
    fmax, floor = FORMATS[fmt]
    r = RowShape(in_dtype, fp4)
    epv, num_vectors, num_warps = r.epv, r.num_vectors, NUM_THREADS // 32
    num_tokens, hidden, row_stride, num_sf_blocks, num_sf_words, out_type, out_dtype, sf_type = buffer_types(fp4, packed)

    @T.prim_func
    def per_token_cast(
        x: T.StridedTensor[(num_tokens, hidden), (row_stride, 1), in_dtype],
        out: T.Tensor[out_type, out_dtype],
        out_sf: sf_type,
        vectors_per_row: T.int32,
        row_magic: T.int64,
        row_shift: T.int32,
        npc_log2: T.int32,
        round_sf: T.int32,
        mode: T.int32,
    ):
        with T.Kernel(num_tokens, threads=NUM_THREADS) as row:
            T.annotate_min_blocks_per_sm(ROW_MIN_BLOCKS[in_dtype])
            T.assume(hidden % 16 == 0)
            T.assume(row_stride % epv == 0)
            tid = T.get_thread_binding()
            values = T.alloc_local((num_vectors, epv), in_dtype)
            amax = T.alloc_local((1,), T.float32)
            multiplier = T.alloc_local((1,), T.float32)
            sf = T.alloc_local((1,), T.float32)
            red = T.alloc_shared((num_warps,), T.float32)
            x_flat = T.Tensor(((num_tokens - 1) * row_stride + hidden,), in_dtype, x.data)
            out_flat = T.reshape(out, (num_tokens * out_type[1],))
            num_chunks = T.ceildiv(hidden // epv, r.chunk_vectors)  # uniform over the CTA

            # Load and reduce: the thread's maxima chunk by chunk, a warp butterfly, then across warps.
            amax[0] = T.float32(0)
            for chunk in T.serial(num_chunks):
                load_chunk(r, x_flat, row, chunk, tid, values, hidden, row_stride)
                chunk_amax(r, values, amax)
            cta_max(amax, red, tid, num_warps)
            # The row's scale factor (stored) and multiplier.
            if mode == MODE_PRECOMPUTED:
                if not packed:
                    if num_sf_blocks > 0:
                        multiplier[0] = T.float32(1) / out_sf[row, 0]
            else:
                block_scale(amax[0], T.float32(floor), fmax, round_sf, packed, sf, multiplier, 0)
                if tid == 0:
                    store_token_sf(out_sf, packed, row, 0, sf[0], True, num_sf_blocks, num_sf_words)
            # Cast and store, from registers for a row of one chunk.
            if mode != MODE_SF_ONLY:
                for chunk in T.serial(num_chunks):
                    if num_chunks > 1:
                        load_chunk(r, x_flat, row, chunk, tid, values, hidden, row_stride)
                    cast_chunk(r, out, out_flat, row, chunk, tid, values, multiplier, hidden)

    return KernelProgram(per_token_cast, alignment={'x': 16, 'out': 16, 'out_sf': 1 if packed else 4})
