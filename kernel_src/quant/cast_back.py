"""quant.cast_back: e4m3 or e2m1 data with one scale factor per (num_per_tokens, num_per_channels) block, back
to bf16 or fp32: out = float(q) * sf, rounded once to the output dtype.

The data format, the scale-factor storage (float32 in any strides, or packed UE8M0 bytes) and the output
dtype are compile time; the hidden size, the block width (any multiple of 16), the block height (a power
of two: the scale-factor row of a token is token >> sf_row_shift) and the scale-factor strides are
run-time arguments. The work unit is one 16-byte output vector (8 bf16 or 4 fp32 elements; 8 or 4 bytes
of e4m3, 4 or 2 of e2m1): the units of all rows form one flat sequence (data and output are contiguous)
and thread t of CTA b holds units b * slots + i * 128 + t, so a warp's stores are 512 contiguous bytes and
every slot is busy whatever the hidden size. Rows and blocks come from the units' 16-element vector indices
by host-computed multiply-shift magic numbers (see tile_kernels_aot.quant); only the last CTA masks units
past the last row. e2m1 codes are rewritten as the e4m3 bytes of the same values (a byte permutation for
the magnitudes, a multiply for the signs) and converted as e4m3 data.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import INDEX_LIMIT, magic_quotient
from kernel_src.quant.common import SF_FORMATS
from kernel_src.quant.nibbles import byte_perm

NUM_THREADS = 128
NUM_UNITS = 8  # 16-byte output vectors a thread
# CTAs per SM the register allocation must allow. bf16 output takes 80 registers unbounded (6 CTAs, 48 KB of
# loads in flight per SM); 64 give 8 CTAs. fp32 output takes 52 unbounded.
MIN_BLOCKS = {'bfloat16': 8, 'float32': 8}
# (units a thread, CTAs per SM) where the tuning sweep (benchmarks/tuning.py) finds a faster choice than the
# defaults: e4m3 to bf16 with packed UE8M0, 16 units at 80 registers, 6 CTAs (96 KB of loads in flight per SM,
# against 64 KB).
TUNED = {('e4m3', 'bfloat16'): (16, 6)}
VECTOR_ELEMS = 16  # the host's vectors_per_row counts vectors of 16 logical elements
FORMATS = {'e4m3': 1, 'e2m1': 2}  # logical elements per byte
OUT_DTYPES = ('bfloat16', 'float32')
OUT_BYTES = {'bfloat16': 2, 'float32': 4}


# e2m1 codes as the e4m3 bytes of the same values (tests/cpu/test_e2m1_as_e4m3.py replays this on every input):
# the e4m3 bytes of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7) as two little-endian words; the
# byte-permutation selector that moves a quad's two code bytes 16 bits apart (plus QUAD_STEP per quad); the
# sign bits of the four codes there; the multiplier that carries them to bit 7 of each byte.
E2M1_MAGNITUDES_AS_E4M3 = (0x3C383000, 0x4C484440)
SIGN_SPREAD_SELECTOR, SIGN_SPREAD_QUAD_STEP = 0x4140, 0x202
SPREAD_SIGN_BITS = 0x00880088
SIGN_CARRY_MULTIPLIER = 0x110  # x * 0x110 = (x << 4) + (x << 8)
E4M3_SIGN_BITS = 0x80808080


def e2m1_quad_as_e4m3(codes, quad):
    """uint32 of the e4m3 bytes of e2m1 codes 4 * quad .. 4 * quad + 3 of the uint32 `codes` (code k in nibble k,
    sign in the nibble's bit 3), code 4 * quad + n in byte n. Six instructions for four codes: a byte
    permutation looks the magnitudes up (__byte_perm reads the low 3 bits of each selector nibble: nvcc masks
    them, one LOP3); another moves the quad's two code bytes 16 bits apart, so that one multiply by 0x110 (a
    shift by 4 plus a shift by 8) carries each code's sign bit (bits 3, 7, 19, 23 there) to bit 7 of its byte
    (7, 15, 23, 31), no carry from the other partial products reaching those bits; a mask and an or finish
    (one LOP3)."""
    magnitudes = byte_perm(T.uint32(E2M1_MAGNITUDES_AS_E4M3[0]), T.uint32(E2M1_MAGNITUDES_AS_E4M3[1]), codes >> T.Cast('uint32', 16 * quad))
    spread = byte_perm(codes, T.uint32(0), T.Cast('uint32', SIGN_SPREAD_SELECTOR + SIGN_SPREAD_QUAD_STEP * quad))
    signs = ((spread & T.uint32(SPREAD_SIGN_BITS)) * T.uint32(SIGN_CARRY_MULTIPLIER)) & T.uint32(E4M3_SIGN_BITS)
    return signs | magnitudes


def check(fmt: str, out_dtype: str, sf_format: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f'fmt must be one of {sorted(FORMATS)}, got {fmt!r}')
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f'out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')


def build(arch: Arch, fmt: str, out_dtype: str, sf_format: str, num_threads: int = NUM_THREADS, num_units: int = 0,
          min_blocks: int = 0) -> KernelProgram:
    """num_threads, num_units and min_blocks (0: TUNED, else NUM_UNITS and MIN_BLOCKS) are tuning knobs
    (benchmarks/tuning.py)."""
    # Evaluated here, not in the kernel body, where the eager builder would turn `or` into a TIR expression.
    tuned_units, tuned_ctas = TUNED.get((fmt, out_dtype), (NUM_UNITS, MIN_BLOCKS[out_dtype]))
    num_units = num_units or tuned_units
    ctas_per_sm = min_blocks or tuned_ctas
    fp4 = fmt == 'e2m1'
    packed = sf_format == 'ue8m0'
    unit_elems = 16 // OUT_BYTES[out_dtype]  # logical elements of one 16-byte output vector: 8 or 4
    unit_bytes = unit_elems // FORMATS[fmt]  # their input bytes: 8 or 4 (e4m3), 4 or 2 (e2m1)
    units_per_vector = VECTOR_ELEMS // unit_elems  # 2 or 4, a power of two
    units_per_vector_log2 = units_per_vector.bit_length() - 1
    slots = num_threads * num_units

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

    # Unit i of thread t of CTA b is flat unit u = b * slots + i * 128 + t of the sequence of all rows' 16-byte output
    # vectors, so the 32 lanes of a warp store 32 adjacent units: one contiguous 512 bytes a store instruction, every
    # sector written whole. (A lane that owned 16 elements would store 32 or 64 bytes, so that each warp store touches
    # twice the sectors it fills and the L2 becomes the limit.) Per unit, once, in int32 registers (the op keeps
    # num_tokens * hidden + 2^16 below 2^31): the row, by an unsigned 32 x 32 -> 64-bit multiply-shift of the unit's
    # 16-element vector index (the host's magic numbers, exact below 2^31); the column in units; the scale-factor block
    # of the column's vector. Units past the last row get a row of num_tokens or more, which the masks skip.
    @T.macro
    def number_units(pid, tid, units):
        for i in T.unroll(num_units):
            units[i] = pid * slots + i * num_threads + tid

    @T.macro
    def locate(units, rows, blocks, vectors_per_row, row_magic, row_shift, block_magic, block_shift):
        for i in T.unroll(num_units):
            vector = units[i] >> units_per_vector_log2
            rows[i] = magic_quotient(vector, row_magic, row_shift)
            blocks[i] = magic_quotient(vector - rows[i] * vectors_per_row, block_magic, block_shift)

    # The loads, then the arithmetic and the stores, of a thread's units; `masked` (a Python bool) skips units
    # past the last row. The scale factors need no mask of their own: the op checks their shape, so a unit
    # inside the tensor has its scale factor inside x_sf. (The run-time scalars keep their kernel names
    # here, which the lowered entry point takes.)
    @T.macro
    def load_data(x_flat, units, rows, data, num_tokens, masked):
        for i in T.unroll(num_units):
            if rows[i] < num_tokens if masked else T.bool(True):
                for e in T.vectorized(unit_bytes):
                    data[i, e] = x_flat[units[i] * unit_bytes + e]

    @T.macro
    def dequantize(x_sf, out_flat, units, rows, blocks, data, sf, result, num_tokens, sf_row_shift, masked):
        # The scale factors are loaded after the data (all loads in flight together), then the arithmetic.
        for i in T.unroll(num_units):
            if rows[i] < num_tokens if masked else T.bool(True):
                block = blocks[i]
                sf_row = rows[i] >> sf_row_shift
                if packed:
                    sf[i] = T.reinterpret(T.Cast('uint32', x_sf[block >> 2, sf_row * 4 + (block & 3)]) << T.uint32(23), T.float32)
                else:
                    sf[i] = x_sf[sf_row, block]
        for i in T.unroll(num_units):
            if rows[i] < num_tokens if masked else T.bool(True):
                if fp4:
                    # Each e2m1 value is also an e4m3 value: rewrite the unit's codes as e4m3 bytes, four per
                    # word, and convert them as e4m3 data (the same float32 values, so the same products and
                    # roundings as decoding the codes to float32 directly).
                    code_words = T.view(data, (num_units,), T.uint32 if unit_bytes == 4 else T.uint16)
                    e4m3_words = T.alloc_local((unit_elems // 4,), T.uint32)
                    e4m3_bytes = T.view(e4m3_words, (unit_elems,), T.float8_e4m3fn)
                    codes = T.Cast('uint32', code_words[i])
                    for h in T.unroll(unit_elems // 4):
                        e4m3_words[h] = e2m1_quad_as_e4m3(codes, h)
                    for e in T.vectorized(unit_elems):
                        result[e] = T.Cast(out_dtype, T.Cast('float32', e4m3_bytes[e]) * sf[i])
                else:
                    # Vectorised, so that tilelang converts pairs (one fp8x2 -> half2 unpack per two elements,
                    # one f32x2 -> bf16x2 pack) instead of element by element.
                    for e in T.vectorized(unit_elems):
                        result[e] = T.Cast(out_dtype, T.Cast('float32', data[i, e]) * sf[i])
                for e in T.vectorized(unit_elems):
                    out_flat[units[i] * unit_elems + e] = result[e]

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
        with T.Kernel(T.ceildiv(num_tokens * vectors_per_row * units_per_vector, slots), threads=num_threads) as pid:
            if fp4:
                T.assume(packed_hidden % (VECTOR_ELEMS // 2) == 0)
            else:
                T.assume(hidden % VECTOR_ELEMS == 0)
            T.annotate_min_blocks_per_sm(ctas_per_sm)
            tid = T.get_thread_binding()
            x_flat = T.reshape(x, (num_tokens * (packed_hidden if fp4 else hidden),))
            out_flat = T.reshape(out, (num_tokens * hidden,))
            rows = T.alloc_local((num_units,), T.int32)
            units = T.alloc_local((num_units,), T.int32)
            blocks = T.alloc_local((num_units,), T.int32)
            data = T.alloc_local((num_units, unit_bytes), T.int8 if fp4 else T.float8_e4m3fn)
            sf = T.alloc_local((num_units,), T.float32)
            result = T.alloc_local((unit_elems,), out_dtype)
            number_units(pid, tid, units)
            # Every CTA but the last has all its units inside the tensor: it runs the same code with no masks,
            # so neither its loads nor its stores sit behind per-unit branches. It issues its data loads
            # first, from the unit numbers alone, and only then works out rows and blocks (two multiply-shifts
            # a unit) while they are in flight: with the rows first, each warp would issue some 80 instructions
            # before its first data load, a stretch in which the CTA's slot on the SM has nothing in flight
            # (upstream's kernel, one row per CTA, issues its loads after a few instructions).
            if (pid + 1) * slots <= num_tokens * vectors_per_row * units_per_vector:
                load_data(x_flat, units, rows, data, num_tokens, False)
                locate(units, rows, blocks, vectors_per_row, row_magic, row_shift, block_magic, block_shift)
                dequantize(x_sf, out_flat, units, rows, blocks, data, sf, result, num_tokens, sf_row_shift, False)
            else:
                locate(units, rows, blocks, vectors_per_row, row_magic, row_shift, block_magic, block_shift)
                load_data(x_flat, units, rows, data, num_tokens, True)
                dequantize(x_sf, out_flat, units, rows, blocks, data, sf, result, num_tokens, sf_row_shift, True)

    return KernelProgram(cast_back, alignment={'x': 16 // FORMATS[fmt], 'x_sf': 1 if packed else 4, 'out': 16})


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
    # The last CTA masks its units explicitly (and the op checks the scale factors' shape); tilelang's
    # per-element guards would stop the vectorisation, since it cannot prove that a unit never straddles
    # the run-time hidden.
    pass_configs={'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True, 'tl.disable_safe_memory_legalize': True},
    # vectors_per_row and the block divisor count vectors of vector_elements; index_limit bounds the elements.
    constants={'vector_elements': VECTOR_ELEMS, 'index_limit': INDEX_LIMIT},
)
