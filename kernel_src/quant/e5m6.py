"""E5M6: quant.per_token_cast_to_e5m6 (behind per_token_cast(fmt='e5m6')) and quant.cast_back_e5m6 (behind
cast_back(x_special_fmt='e5m6')).

E5M6 is the top 12 bits of an IEEE half (1 sign, 5 exponent, 6 mantissa bits; bias 15, max 65024, smallest
subnormal 2^-20). Encoding a float32 v, bit for bit as upstream: h = the bits of half(v) rounded toward
zero, e = h >> 4, then e += 1 where (e & 1) + (bits(v) & 0x1FFFF) > 0x10000 (round half to even on the 17
float32 mantissa bits below the 6 kept ones), e &= 0xFFF. Eight codes h0..h7 make three little-endian
uint32 words: w0 = h0 << 20 | h1 << 8 | h2 >> 4, w1 = h2 << 28 | h3 << 16 | h4 << 4 | h5 >> 8,
w2 = h5 << 24 | h6 << 12 | h7. Decoding puts each code in the top 12 bits of a half.

The cast has one scale factor per row (num_per_channels == hidden, as upstream requires): amax over the
row, clamped = max(amax, 1e-4), sf = clamped / 65024, multiplier 65024 / clamped, or with round_sf (run
time) sf rounded up to a power of two and the multiplier its exact inverse; the data is e5m6(x * multiplier).
A CTA of 128 threads owns a row; thread t holds groups t, t + 128, ... of 8 channels (8 codes, 3 output
words) in registers, so a row is read once: at most 8 groups a thread (8192 channels). Adjacent lanes hold
adjacent groups, so each warp load (one or two 16-byte vectors a lane) is one contiguous span (lanes owning
32-channel chunks would make every instruction touch about twice the sectors); the packed words go through
shared memory and leave as 16-byte vectors (aligned) or words, adjacent across lanes. bf16 rows take
their amax on bf16 pairs, so the row stays packed (64 registers, 8 rows an SM). Wider rows (a run-time
branch) are read twice, once for the amax and once to encode, a group a thread and step.
The scale factor is float32 (one per token, any token stride: row-major and column-major layouts alike)
or a UE8M0 exponent in the low byte of an int32 word whose other bytes are zero (the packed layout, one
block per row).

The cast back dequantises out = float(half(code)) * sf (rounded once to the output dtype) with scale
factors of (1, n) blocks, n a multiple of 8, float32 in any strides or packed UE8M0; it walks the flat
sequence of 32-channel chunks of all rows (the row of a chunk found by a host-computed multiply-shift, as
quant.per_token_cast does), a lane decoding one 16-byte output vector (a group of 8 channels from its 3
words for bfloat16; half a group from 2 of its words for float32) and the 32 lanes of a warp 32 adjacent
vectors, so that every load and store instruction of a warp covers one contiguous span (lanes that each
owned a 32-channel chunk would make each instruction touch twice the sectors it filled).

`aligned` variants need a 16-byte aligned input pointer and row stride and hidden % 32 == 0. The cast's
moves 16 bytes per access; the other loads element by element and masks each group of 8 channels, so any
hidden divisible by 8 works, and stores 16-byte vectors as the aligned one does when hidden % 32 == 0 (a
run-time branch: `out` is always ours and 16-byte aligned), words otherwise. The cast back reads words one by one in both (a group's 12 bytes are only
4-byte aligned); its aligned variant just drops the column mask, a chunk never crossing a row end.
"""

import tilelang  # noqa: F401  (before tvm: it sets up the tvm that tilelang ships)
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.addressing import INDEX_LIMIT, magic_quotient
from kernel_src.quant.common import IN_DTYPES, SF_FORMATS, inverse_pow2, pow2, pow2_scale_exponent
from kernel_src.quant.token_sf import bf16_amax_into, cta_max, token_sf_tensor

NUM_THREADS = 128
CHUNK = 32  # channels per chunk: 4 groups of 8 codes, 12 words
OUT_DTYPES = ('bfloat16', 'float32')
GROUPS_PER_CHUNK = CHUNK // 8  # groups of 8 channels (3 packed words)
GROUPS_PER_THREAD = 8  # the cast: rows of up to 128 * 8 groups (8192 channels) in registers (32 or 64 of them)
ROW_CAPACITY = NUM_THREADS * 8 * GROUPS_PER_THREAD  # wider rows take the two-pass path
E5M6_MAX, AMAX_FLOOR = 65024.0, 1e-4
MIN_BLOCKS = {'bfloat16': 8, 'float32': 4}  # the cast: CTAs (rows) per SM the register allocation must allow
BACK_UNITS = 8  # the cast back: 16-byte output vectors a thread (24 or 16 words of loads in flight)


def check_cast(in_dtype: str, sf_format: str, aligned: bool) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')


def check_back(out_dtype: str, sf_format: str, aligned: bool) -> None:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f'out_dtype must be one of {OUT_DTYPES}, got {out_dtype!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')


def e5m6_code(v):
    """The 12-bit e5m6 code (uint32) of float32 v, as upstream's float_to_e5m6."""
    # One expression, so that the CUDA __half result never lands in a variable of tilelang's half type
    # (cutlass::half_t), which has no conversion from __half.
    half_bits = T.Cast(T.uint32, T.call_extern(T.uint16, '__half_as_ushort', T.call_extern(T.float16, '__float2half_rz', v)))
    code = half_bits >> T.uint32(4)
    below = T.reinterpret(v, T.uint32) & T.uint32(0x1FFFF)  # the float32 bits below the 6 kept mantissa bits
    # Round up where (code & 1) + below > 0x10000: that sum is at most 0x20000, so adding 0x7FFEFFFF sets
    # bit 31 exactly then; an add and a shift (folded into the final add) instead of a compare and a select.
    round_up = ((code & T.uint32(1)) + below + T.uint32(0x7FFEFFFF)) >> T.uint32(31)
    return (code + round_up) & T.uint32(0xFFF)


@T.macro
def pack_words(h, words, w0):
    """Words w0..w0+2 of `words` from the 8 codes in h[0..8)."""
    words[w0] = (h[0] << T.uint32(20)) | (h[1] << T.uint32(8)) | (h[2] >> T.uint32(4))
    words[w0 + 1] = (h[2] << T.uint32(28)) | (h[3] << T.uint32(16)) | (h[4] << T.uint32(4)) | (h[5] >> T.uint32(8))
    words[w0 + 2] = (h[5] << T.uint32(24)) | (h[6] << T.uint32(12)) | h[7]


@T.macro
def unpack_first_half(words, j, h):
    """h[0..4): the half-precision bit patterns (the code in bits 4..15) of codes 0..3 of a group, the top
    48 bits of its words 0 and 1 (words[j, 0..1])."""
    h[0] = (words[j, 0] >> T.uint32(16)) & T.uint32(0xFFF0)
    h[1] = (words[j, 0] >> T.uint32(4)) & T.uint32(0xFFF0)
    h[2] = ((words[j, 0] << T.uint32(8)) | (words[j, 1] >> T.uint32(24))) & T.uint32(0xFFF0)
    h[3] = (words[j, 1] >> T.uint32(12)) & T.uint32(0xFFF0)


@T.macro
def unpack_second_half(words, j, h):
    """h[4..8): the same for codes 4..7, the low 48 bits of words 1 and 2 (words[j, 1..2])."""
    h[4] = words[j, 1] & T.uint32(0xFFF0)
    h[5] = ((words[j, 1] << T.uint32(12)) | (words[j, 2] >> T.uint32(20))) & T.uint32(0xFFF0)
    h[6] = (words[j, 2] >> T.uint32(8)) & T.uint32(0xFFF0)
    h[7] = (words[j, 2] << T.uint32(4)) & T.uint32(0xFFF0)


def build_cast(arch: Arch, in_dtype: str, sf_format: str, aligned: bool) -> KernelProgram:
    epv = 16 // IN_DTYPES[in_dtype]  # channels per 16-byte vector
    groups = GROUPS_PER_THREAD
    packed = sf_format == 'ue8m0'
    num_warps = NUM_THREADS // 32

    num_tokens = T.dynamic('num_tokens')
    hidden = T.dynamic('hidden')
    row_stride = T.dynamic('row_stride')
    sf_stride = T.dynamic('sf_stride')
    sf_type = T.Tensor[(num_tokens,), T.int32] if packed else T.StridedTensor[(num_tokens,), (sf_stride,), T.float32]

    @T.macro
    def load_group(x, row, group, values, i):
        """values[i, :] = channels [group * 8, +8) of the row (16-byte vectors when aligned)."""
        if aligned:
            for v in T.unroll(8 // epv):
                for e in T.vectorized(epv):
                    values[i, v * epv + e] = x[row, group * 8 + v * epv + e]
        else:
            for e in T.unroll(8):
                values[i, e] = x[row, group * 8 + e]

    @T.macro
    def store_vectors(out, row, tid, staged):
        """The row's staged words to `out` in 16-byte vectors, adjacent across lanes (needs hidden % 32 == 0)."""
        for m in T.unroll(groups * 3 // 4):
            vector = m * NUM_THREADS + tid
            if vector * 4 < hidden // 8 * 3:
                for k in T.vectorized(4):
                    out[row, vector * 4 + k] = staged[vector * 4 + k]

    @T.macro
    def row_multiplier(amax, tid, row, red, round_sf, out_sf, multiplier):
        """multiplier[0] of the row from each thread's amax[0] (a butterfly, then the warps through shared
        memory); thread 0 stores the row's scale factor."""
        cta_max(amax, red, tid, num_warps)

        clamped = T.max(amax[0], T.float32(AMAX_FLOOR))
        if packed or round_sf != 0:  # UE8M0 holds powers of two only: the op requires round_sf
            exponent = pow2_scale_exponent(clamped, E5M6_MAX)
            multiplier[0] = inverse_pow2(exponent)
            if tid == 0:
                if packed:
                    out_sf[row] = T.Cast(T.int32, exponent)  # the exponent byte, the word's other bytes zero
                else:
                    out_sf[row] = pow2(exponent)
        else:
            multiplier[0] = T.float32(E5M6_MAX) / clamped
            if tid == 0:
                out_sf[row] = clamped / T.float32(E5M6_MAX)

    @T.macro
    def encode_group(values, i, multiplier, codes, words):
        """words[0..3) of the 8 values of values[i, :] times the multiplier."""
        for e in T.unroll(8):
            codes[e] = e5m6_code(T.Cast('float32', values[i, e]) * multiplier[0])
        pack_words(codes, words, 0)

    @T.prim_func
    def per_token_cast_to_e5m6(
        x: T.StridedTensor[(num_tokens, hidden), (row_stride, 1), in_dtype],
        out: T.Tensor[(num_tokens, hidden // 8 * 3), T.uint32],
        out_sf: sf_type,
        round_sf: T.int32,
    ):
        with T.Kernel(num_tokens, threads=NUM_THREADS) as row:
            # A CTA loads its row, then reduces and encodes with nothing in flight, so rows in flight per SM
            # are what hides the load latency: at most 64 registers (bf16: 8 rows an SM) or 128 (float32: 4).
            T.annotate_min_blocks_per_sm(MIN_BLOCKS[in_dtype])
            T.assume(hidden % 8 == 0)
            if aligned:
                T.assume(hidden % CHUNK == 0)
                T.assume(row_stride % epv == 0)
            tid = T.get_thread_binding()
            values = T.alloc_local((groups, 8), in_dtype)
            amax = T.alloc_local((1,), T.float32)
            multiplier = T.alloc_local((1,), T.float32)
            codes = T.alloc_local((8,), T.uint32)
            words = T.alloc_local((3,), T.uint32)
            red = T.alloc_shared((num_warps,), T.float32)
            staged = T.alloc_shared((groups * NUM_THREADS * 3,), T.uint32)

            if hidden <= ROW_CAPACITY:  # uniform over the CTA
                # Group i of the thread is channels [(i * 128 + tid) * 8, +8): a warp's lanes cover adjacent
                # groups, so each load (16 bytes a lane, or 2 bytes a lane per channel) and each store (12
                # bytes a lane, as three words) of a warp is one contiguous span.
                for i in T.unroll(groups):
                    group = i * NUM_THREADS + tid
                    if group * 8 < hidden:
                        load_group(x, row, group, values, i)
                    else:
                        for e in T.vectorized(8):
                            values[i, e] = T.cast(0, in_dtype)  # zeros cannot raise the amax

                amax[0] = T.float32(0)
                if in_dtype == 'bfloat16':
                    # On bf16 pairs: no float copy of the row stays live across the barrier, so the row fits
                    # in 64 registers.
                    bf16_amax_into(values, amax, groups, 4)
                else:
                    for i in T.unroll(groups):
                        for e in T.unroll(8):
                            amax[0] = T.max(amax[0], T.abs(T.Cast('float32', values[i, e])))
                row_multiplier(amax, tid, row, red, round_sf, out_sf, multiplier)

                # The words go through shared memory, so that the row is stored in 16-byte vectors (aligned:
                # a row is a multiple of 12 words) or words, adjacent across lanes: writing a group's 3 words
                # straight from its lane would make each store instruction touch 3 times the sectors it filled.
                for i in T.unroll(groups):
                    group = i * NUM_THREADS + tid
                    if group * 8 < hidden:
                        encode_group(values, i, multiplier, codes, words)
                        for k in T.unroll(3):
                            staged[group * 3 + k] = words[k]  # lanes 3 words apart: no bank conflicts
                T.sync_threads()
                if aligned:
                    store_vectors(out, row, tid, staged)
                elif hidden % CHUNK == 0:
                    # `out` is ours (contiguous, 16-byte aligned): whenever its rows are whole 16-byte vectors
                    # (hidden % 32 == 0, uniform) the unaligned input takes the aligned store, a quarter of
                    # the store instructions and their guards and addresses.
                    store_vectors(out, row, tid, staged)
                else:
                    for m in T.unroll(groups * 3):
                        word = m * NUM_THREADS + tid
                        if word < hidden // 8 * 3:
                            out[row, word] = staged[word]
            else:
                # Rows wider than the registers hold (upstream has no limit): the row is read twice, for
                # its amax and then to encode it (the second read mostly from L2), one group of 8 channels
                # a thread and step, and each group's 3 words are stored from its lane.
                amax[0] = T.float32(0)
                for step in T.serial(T.ceildiv(hidden // 8, NUM_THREADS)):
                    group = step * NUM_THREADS + tid
                    if group * 8 < hidden:
                        load_group(x, row, group, values, 0)
                        for e in T.unroll(8):
                            amax[0] = T.max(amax[0], T.abs(T.Cast('float32', values[0, e])))
                row_multiplier(amax, tid, row, red, round_sf, out_sf, multiplier)
                for step in T.serial(T.ceildiv(hidden // 8, NUM_THREADS)):
                    group = step * NUM_THREADS + tid
                    if group * 8 < hidden:
                        load_group(x, row, group, values, 0)
                        encode_group(values, 0, multiplier, codes, words)
                        for k in T.unroll(3):
                            out[row, group * 3 + k] = words[k]

    return KernelProgram(per_token_cast_to_e5m6, alignment={'x': 16 if aligned else IN_DTYPES[in_dtype], 'out': 16, 'out_sf': 4})


def build_back(arch: Arch, out_dtype: str, sf_format: str, aligned: bool) -> KernelProgram:
    packed = sf_format == 'ue8m0'
    # A lane decodes one 16-byte output vector: a whole group (bfloat16), or half a group (float32, the
    # two halves on adjacent lanes), so that the 16-byte stores of a warp are one contiguous 512 bytes.
    unit_channels = 16 // (2 if out_dtype == 'bfloat16' else 4)
    lanes_per_group = 8 // unit_channels
    units_per_chunk = GROUPS_PER_CHUNK * lanes_per_group
    unit_words = 3 if lanes_per_group == 1 else 2  # the words that hold a unit's codes
    units = BACK_UNITS
    cta_chunks = NUM_THREADS * units // units_per_chunk  # chunks of 32 channels a CTA

    num_tokens = T.dynamic('num_tokens')
    hidden = T.dynamic('hidden')
    sf_type = token_sf_tensor(packed, num_tokens, T.dynamic('num_sf_cols'), T.dynamic('num_sf_words'), T.dynamic('sf_word_stride'),
                              T.dynamic('sf_stride_t'), T.dynamic('sf_stride_k'))

    # Unit i of a thread is unit tid % units_per_chunk of flat chunk
    # v = pid * cta_chunks + i * (128 / units_per_chunk) + tid / units_per_chunk, so a warp's lanes cover
    # 32 adjacent units (one span of 512 bytes out, and of 384 or 192 bytes in, when no row ends among
    # them). The row of a chunk comes from a 32 x 32 -> 64-bit multiply and a shift (row_magic < 2^32 and
    # v < 2^31, which the op checks); chunks past the last row get a row of num_tokens or more, which the
    # masks treat as inactive. Row and group column are computed once into int32 registers.
    @T.macro
    def locate(pid, tid, rows, group_cols, chunks_per_row, row_magic, row_shift):
        for i in T.unroll(units):
            v = pid * cta_chunks + i * (NUM_THREADS // units_per_chunk) + tid // units_per_chunk
            rows[i] = magic_quotient(v, row_magic, row_shift)
            group_cols[i] = (v - rows[i] * chunks_per_row) * GROUPS_PER_CHUNK + tid % units_per_chunk // lanes_per_group

    # `out` comes first so that the launcher binds `hidden` from it and checks x's shape against it.
    @T.prim_func
    def cast_back_e5m6(
        out: T.Tensor[(num_tokens, hidden), out_dtype],
        x: T.Tensor[(num_tokens, hidden // 8 * 3), T.uint32],
        x_sf: sf_type,
        chunks_per_row: T.int32,
        row_magic: T.int64,
        row_shift: T.int32,
        block_magic: T.int64,
        block_shift: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens * chunks_per_row, cta_chunks), threads=NUM_THREADS) as pid:
            T.assume(hidden % 8 == 0)
            if aligned:
                T.assume(hidden % CHUNK == 0)
            tid = T.get_thread_binding()
            half = tid % lanes_per_group  # float32: which half of its group the lane decodes
            rows = T.alloc_local((units,), T.int32)
            group_cols = T.alloc_local((units,), T.int32)
            words = T.alloc_local((units, unit_words), T.uint32)
            scales = T.alloc_local((units,), T.float32)
            result = T.alloc_local((unit_channels,), out_dtype)
            halves = T.alloc_local((unit_channels,), T.uint32)

            locate(pid, tid, rows, group_cols, chunks_per_row, row_magic, row_shift)
            # Every load first (the unit's words and its scale factor), then the arithmetic.
            for i in T.unroll(units):
                # With hidden % 32 == 0 every group of a row's chunks is inside the row.
                if rows[i] < num_tokens and (aligned or group_cols[i] * 8 < hidden):
                    # Codes 0..3 of a group lie in words 0..1 (bits 31..8), codes 4..7 in words 1..2 (bits 15..0).
                    for k in T.unroll(unit_words):
                        words[i, k] = x[T.Cast('int64', rows[i]), group_cols[i] * 3 + half + k]
                    # The block of the group's channels (a block holds whole groups: n % 8 == 0), by the same
                    # unsigned 32 x 32 -> 64-bit multiply-shift (block_magic < 2^32, the column < 2^31).
                    block = magic_quotient(group_cols[i] * 8, block_magic, block_shift)
                    if packed:
                        scales[i] = T.reinterpret(T.Cast(T.uint32, x_sf[block >> 2, rows[i] * 4 + (block & 3)]) << T.uint32(23), T.float32)
                    else:
                        scales[i] = x_sf[rows[i], block]

            for i in T.unroll(units):
                if rows[i] < num_tokens and (aligned or group_cols[i] * 8 < hidden):
                    if lanes_per_group == 1:
                        unpack_first_half(words, i, halves)
                        unpack_second_half(words, i, halves)
                    else:
                        # Codes 4..7 sit in words 1..2 exactly 16 bits below where codes 0..3 sit in words
                        # 0..1: the second half's lane shifts its word pair left by 16 (a funnel shift) and
                        # decodes it as a first half.
                        shift = T.Cast(T.uint32, half * 16)
                        words[i, 0] = T.call_extern(T.uint32, '__funnelshift_l', words[i, 1], words[i, 0], shift)
                        words[i, 1] = words[i, 1] << shift
                        unpack_first_half(words, i, halves)
                    for e in T.unroll(unit_channels):
                        value = T.Cast('float32', T.reinterpret(T.Cast(T.uint16, halves[e]), T.float16))
                        result[e] = T.Cast(out_dtype, value * scales[i])
                    for e in T.vectorized(unit_channels):
                        out[T.Cast('int64', rows[i]), group_cols[i] * 8 + half * unit_channels + e] = result[e]

    return KernelProgram(cast_back_e5m6, alignment={'x': 16 if aligned else 4, 'x_sf': 1 if packed else 4, 'out': 16})


def prebuilt_cast():
    for in_dtype in IN_DTYPES:
        for sf_format in SF_FORMATS:
            for aligned in (True, False):
                yield dict(in_dtype=in_dtype, sf_format=sf_format, aligned=aligned)


def prebuilt_back():
    for out_dtype in OUT_DTYPES:
        for sf_format in SF_FORMATS:
            for aligned in (True, False):
                yield dict(out_dtype=out_dtype, sf_format=sf_format, aligned=aligned)


PASS_CONFIGS = {
    'tl.disable_warp_specialized': True,
    'tl.enable_lower_ldgstg': True,  # 16-byte stores from register arrays
    # Every access is masked explicitly; tilelang's own per-element guards would stop the vectorisation.
    'tl.disable_safe_memory_legalize': True,
}

CAST = KernelDecl(
    name='quant.per_token_cast_to_e5m6',
    params=(param('in_dtype', 'str', ''), param('sf_format', 'str', 'sf'), param('aligned', 'bool', 'al')),
    factory=build_cast,
    prebuilt=prebuilt_cast,
    check=check_cast,
    pass_configs=PASS_CONFIGS,
    constants={'chunk': CHUNK},  # the op picks the aligned variant for hidden % chunk == 0
)
CAST_BACK = KernelDecl(
    name='quant.cast_back_e5m6',
    params=(param('out_dtype', 'str', ''), param('sf_format', 'str', 'sf'), param('aligned', 'bool', 'al')),
    factory=build_back,
    prebuilt=prebuilt_back,
    check=check_back,
    pass_configs=PASS_CONFIGS,
    constants={'chunk': CHUNK, 'index_limit': INDEX_LIMIT},  # chunks_per_row counts chunks; index_limit bounds their count
)
