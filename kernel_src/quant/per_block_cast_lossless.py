"""quant.per_block_cast_lossless: e2m1 data with power-of-two scale factors on small (in_block_m, in_block_k)
blocks, re-encoded exactly as e4m3 with power-of-two scale factors on larger (block_m, block_k) blocks.

With e_in the biased exponent of an input scale factor (the UE8M0 byte, or bits >> 23 of a float32) and
out_exp = max(e_in over the input blocks of an output block that hold real elements) - 6, saturating at 0:
the output scale factor is 2^(out_exp - 127) (float32 bits out_exp << 23, or the UE8M0 byte out_exp), and
each element is e4m3(float(q) * 2^(e_in - out_exp)). For e_in - out_exp in [-5, 6] that product is exact:
the e2m1 magnitudes 0.5..6 scaled by 2^-5..2^6 lie in [2^-6, 384], which e4m3 holds exactly, so the
dequantised output equals the dequantised input bit for bit. A device assert checks e_in + 5 >= out_exp
(the input's exponents span at most 11 octaves per output block), as upstream.

Compile time: the output block shape and both scale-factor storages (float32 in any strides, or packed
UE8M0 bytes). Run time: the token count, the hidden size (a multiple of 16), the input row stride and the
input block shape (powers of two, in_block_k >= 16, dividing the output block).

Layout: as quant.per_block_cast (`TileShape`), with 16 elements (8 input bytes, 16 output bytes) per vector;
for output blocks of one row each of a thread's rows is its own block and only lanes combine.
"""

from tilelang import language as T

from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.nibbles import CODE_MAGNITUDES, table_bytes_of_codes, table_word
from kernel_src.quant.per_block_cast import NUM_THREADS, NUM_WARPS, SF_FORMATS, TileShape, block_max, store_sf

VECTOR_ELEMS = 16  # logical elements per vector: 8 bytes of e2m1 pairs in, 16 bytes of e4m3 out
BLOCK_MS = (1, 32, 128)
BLOCK_KS = (32, 128)
PREBUILT_BLOCKS = ((1, 128), (32, 32), (128, 128))  # upstream's test set (input blocks (1, 32))
EXPONENT_SHIFT = 6  # out_exp = max e_in - 6: e2m1's largest exponent (2^2) to e4m3's (2^8)
MAX_SPAN = 5  # e_in + 5 >= out_exp: e2m1's smallest value 2^-1 to e4m3's smallest normal 2^-6

# The re-encoding without float arithmetic. For d = e_in - out_exp in [-5, 6], e2m1 magnitude code m (0..7, the
# values 0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^d is the e4m3 normal whose byte is (m << 2) + K with K = (d + 6) << 3
# for m >= 2 (m's exponent bits become the e4m3 exponent less the bias offset, its mantissa bit the top
# mantissa bit), K for m = 1 (0.5 * 2^d: exponent d + 6, mantissa 0) and 0 for m = 0; every byte is at most
# 124 (384, e4m3's 0x7C), so bit 7 is free for the sign. Those eight bytes are the table of
# kernel_src.quant.nibbles: eight elements take twelve integer instructions, where decoding each to float32,
# scaling and converting takes about twelve each.
E4M3_TABLE_LOW = table_word((0, 0, 8, 12))  # the bytes less K for m = 0..3 (m = 0 and m = 1 fixed up)
E4M3_TABLE_HIGH = table_word((16, 20, 24, 28))  # m = 4..7


def check(block_m: int, block_k: int, in_sf_format: str, sf_format: str) -> None:
    if block_m not in BLOCK_MS or block_k not in BLOCK_KS:
        raise ValueError(f'block_m must be in {BLOCK_MS} and block_k in {BLOCK_KS}, got ({block_m}, {block_k})')
    for name, value in (('in_sf_format', in_sf_format), ('sf_format', sf_format)):
        if value not in SF_FORMATS:
            raise ValueError(f'{name} must be one of {SF_FORMATS}, got {value!r}')


def build(arch: Arch, block_m: int, block_k: int, in_sf_format: str, sf_format: str) -> KernelProgram:
    in_packed = in_sf_format == 'ue8m0'
    packed = sf_format == 'ue8m0'
    tile = TileShape.for_block(block_m, block_k // VECTOR_ELEMS)
    cols = tile.lanes * VECTOR_ELEMS

    num_tokens = T.dynamic('num_tokens')
    packed_hidden = T.dynamic('packed_hidden')
    hidden = packed_hidden * 2  # the data binds the dims
    row_stride = T.dynamic('row_stride')
    if in_packed:
        in_sf_type = T.StridedTensor[(T.dynamic('num_in_sf_words'), T.dynamic('num_in_sf_bytes')), (T.dynamic('in_sf_word_stride'), 1), T.uint8]
    else:
        in_sf_type = T.StridedTensor[(T.dynamic('num_in_sf_rows'), T.dynamic('num_in_sf_blocks')),
                                     (T.dynamic('in_sf_stride_m'), T.dynamic('in_sf_stride_k')), T.float32]
    if packed:
        sf_type = T.StridedTensor[(T.dynamic('num_sf_words'), T.dynamic('num_sf_bytes')), (T.dynamic('sf_word_stride'), 1), T.uint8]
    else:
        sf_type = T.StridedTensor[(T.dynamic('num_sf_rows'), T.dynamic('num_sf_blocks')),
                                  (T.dynamic('sf_stride_m'), T.dynamic('sf_stride_k')), T.float32]

    @T.prim_func
    def per_block_cast_lossless(
        x: T.StridedTensor[(num_tokens, packed_hidden), (row_stride, 1), T.int8],
        x_sf: in_sf_type,
        out: T.Tensor[(num_tokens, hidden), T.float8_e4m3fn],
        out_sf: sf_type,
        in_block_m_log2: T.int32,
        in_block_k_log2: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, tile.rows), T.ceildiv(hidden, cols), threads=NUM_THREADS) as (bx, by):
            T.assume(packed_hidden % (VECTOR_ELEMS // 2) == 0)
            T.assume(row_stride % (VECTOR_ELEMS // 2) == 0)
            tid = T.get_thread_binding()
            data = T.alloc_local((tile.vectors, VECTOR_ELEMS // 2), T.int8)
            in_sf_raw = T.alloc_local((tile.vectors,), T.uint32)  # the UE8M0 byte or the float32 bits, 0 past the edges
            in_exp = T.alloc_local((tile.vectors,), T.float32)  # e_in of each vector's input block
            out_exp = T.alloc_local((tile.vectors,), T.float32)
            red = T.alloc_shared((NUM_WARPS, tile.blocks_per_row), T.float32)
            col = by * cols + tile.lane_col(tid) * VECTOR_ELEMS
            block = col // block_k

            # All loads first (data, then the scale factors), so that they are in flight together.
            for j in T.unroll(tile.vectors):
                row = bx * tile.rows + tile.row(tid, j)
                if row < num_tokens and col < hidden:
                    for e in T.vectorized(VECTOR_ELEMS // 2):
                        data[j, e] = x[row, col // 2 + e]
            # The scale factors: each load unconditional, at its index clamped into the buffer, and its value
            # dropped (e_in = 0) where the vector or its scale factor is outside. A load under the mask becomes a
            # branch whose conversion nvcc sinks in with it, so that each load waits for the one before (four or
            # eight round trips in series, the data loads issued after them).
            if x_sf.shape[0] > 0 and x_sf.shape[1] > 0:
                for j in T.unroll(tile.vectors):
                    row = bx * tile.rows + tile.row(tid, j)
                    sf_row = row >> in_block_m_log2
                    sf_block = col >> in_block_k_log2
                    if in_packed:
                        in_sf_raw[j] = T.Cast('uint32', x_sf[T.min(sf_block >> 2, x_sf.shape[0] - 1),
                                                             T.min(sf_row * 4 + (sf_block & 3), x_sf.shape[1] - 1)])
                    else:
                        in_sf_raw[j] = T.reinterpret(x_sf[T.min(sf_row, x_sf.shape[0] - 1), T.min(sf_block, x_sf.shape[1] - 1)],
                                                     T.uint32)
            else:
                for j in T.unroll(tile.vectors):
                    in_sf_raw[j] = T.uint32(0)
            for j in T.unroll(tile.vectors):
                row = bx * tile.rows + tile.row(tid, j)
                sf_row = row >> in_block_m_log2
                sf_block = col >> in_block_k_log2
                if in_packed:
                    sf_inside = (sf_block >> 2) < x_sf.shape[0] and sf_row * 4 + 3 < x_sf.shape[1]
                    exponent = in_sf_raw[j]
                else:
                    sf_inside = sf_row < x_sf.shape[0] and sf_block < x_sf.shape[1]
                    exponent = in_sf_raw[j] >> T.uint32(23)
                in_exp[j] = T.Cast('float32', T.if_then_else(row < num_tokens and col < hidden and sf_inside, exponent, T.uint32(0)))

            # out_exp = max e_in over the output block (exponents are small integers: exact in float32).
            if block_m == 1:
                for j in T.unroll(tile.vectors):
                    out_exp[j] = in_exp[j]
                    block_max(tile, out_exp, j, red, tid)
            else:
                out_exp[0] = in_exp[0]
                for j in T.unroll(1, tile.vectors):
                    out_exp[0] = T.max(out_exp[0], in_exp[j])
                block_max(tile, out_exp, 0, red, tid)
                for j in T.unroll(1, tile.vectors):
                    out_exp[j] = out_exp[0]
            for j in T.unroll(tile.vectors):
                out_exp[j] = T.max(out_exp[j] - T.float32(EXPONENT_SHIFT), T.float32(0))

            # The span check, once per thread before any store: the smallest e_in + MAX_SPAN - out_exp over the
            # thread's real vectors (exact: small integers). One assert per vector put a call and two
            # convergence barriers between consecutive stores.
            slack = T.alloc_local((1,), T.float32)
            slack[0] = T.float32(0)
            for j in T.unroll(tile.vectors):
                row = bx * tile.rows + tile.row(tid, j)
                slack[0] = T.min(slack[0], T.if_then_else(row < num_tokens and col < hidden,
                                                          in_exp[j] + T.float32(MAX_SPAN) - out_exp[j], T.float32(0)))
            device_assert(slack[0] >= T.float32(0))

            words = T.view(data, (tile.vectors, VECTOR_ELEMS // 8), T.uint32)
            encoded = T.alloc_local((VECTOR_ELEMS // 4,), T.uint32)
            encoded_bytes = T.view(encoded, (VECTOR_ELEMS,), T.float8_e4m3fn)
            for j in T.unroll(tile.vectors):
                row = bx * tile.rows + tile.row(tid, j)
                # Computed outside the store's condition, so that the store takes the words whole (see
                # per_token_cast); a masked vector's bytes are computed and dropped.
                # K = (d + 6) << 3: 0.5 * 2^d has the e4m3 exponent field d - 1 + 7.
                k = T.Cast('uint32', T.Cast('int32', in_exp[j] - out_exp[j]) + 6) << T.uint32(3)
                table_low = k * T.uint32(0x01010100) + T.uint32(E4M3_TABLE_LOW)
                table_high = k * T.uint32(0x01010101) + T.uint32(E4M3_TABLE_HIGH)
                for w in T.unroll(VECTOR_ELEMS // 8):
                    magnitudes = words[j, w] & T.uint32(CODE_MAGNITUDES)
                    for half in T.unroll(2):
                        encoded[2 * w + half] = table_bytes_of_codes(words[j, w], magnitudes, table_low, table_high, half)
                if row < num_tokens and col < hidden:
                    for e in T.vectorized(VECTOR_ELEMS):
                        out[row, col + e] = encoded_bytes[e]

            # One thread per output block stores its scale factor: the first lane of the block, in the first
            # row of the block.
            for j in T.unroll(tile.vectors if block_m == 1 else 1):
                row = bx * tile.rows + tile.row(tid, j)
                first_row = (tid % 32 < tile.lanes) if block_m == 1 else (tid < tile.lanes)
                if first_row and tid % tile.lanes_per_block == 0 and row < num_tokens and col < hidden:
                    sf = T.reinterpret(T.Cast('uint32', out_exp[j]) << T.uint32(23), T.float32)
                    store_sf(out_sf, packed, row // block_m, block, sf, col + block_k >= hidden)

    return KernelProgram(per_block_cast_lossless, alignment={'x': VECTOR_ELEMS // 2, 'x_sf': 1 if in_packed else 4, 'out': 16,
                                                             'out_sf': 1 if packed else 4})


def constants(arch: Arch, block_m: int, block_k: int, in_sf_format: str, sf_format: str) -> dict[str, int]:
    """cta_columns: the columns of a CTA's tile (`cols` in build); the grid's y is ceil(hidden / cta_columns), which
    the op keeps within 65535."""
    return {'cta_columns': TileShape.for_block(block_m, block_k // VECTOR_ELEMS).lanes * VECTOR_ELEMS}


def prebuilt():
    for block_m, block_k in PREBUILT_BLOCKS:
        for in_sf_format in SF_FORMATS:
            for sf_format in SF_FORMATS:
                yield dict(block_m=block_m, block_k=block_k, in_sf_format=in_sf_format, sf_format=sf_format)


DECL = KernelDecl(
    name='quant.per_block_cast_lossless',
    params=(param('block_m', 'int', 'bm'), param('block_k', 'int', 'bk'), param('in_sf_format', 'str', 'in'), param('sf_format', 'str', 'sf')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    # Every access is masked explicitly against the buffer dims (see quant.per_block_cast).
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
    constants=constants,
)
