"""quant.per_channel_cast_fused and quant.per_channel_cast_and_transpose: e4m3 with one scale factor per
channel and block of `num_per_tokens` tokens (blocks of (num_per_tokens, 1)).

Per block: amax = max |x| over its tokens, clamped = max(amax, 1e-4), sf = clamped / 448 and multiplier
448 / clamped (two IEEE divisions, as upstream), or with `round_sf` (a run-time argument) sf rounded up to a
power of two and the multiplier its exact inverse; out = e4m3_satfinite(x * multiplier).

The fused kernel also takes, at compile time, an e4m3 input with one float32 scale factor per token and
128 channels (x = float(q) * sf, rounded to float32 once, as upstream's kernel and reference do) and a
gather: output row r reads input row pos_to_token[r], or zeros where that is negative; an entry past the input's
rows fails a device assert and reads zeros too (kernel_src/bounds.py). The transposed kernel writes out[h, t]
(bf16 input, no gather), with 32 or 128 tokens per block.

Layout (Layout below): a CTA owns 128 tokens. In the fused kernel each thread loads a column of 8 tokens x one
16-byte vector and keeps it in registers; a warp is 16 lanes along the channels by 2 along the tokens, and the
CTA's 8 warps lie along the tokens (128 bf16, 64 fp32 or 256 e4m3 channels a CTA). So each load instruction reads
256 contiguous bytes of each of 2 rows and each store instruction writes whole 128-byte lines (bf16) of 2 rows:
against 4 lanes along the channels (64 bytes of 8 rows a load, one 32-byte sector of 8 rows a bf16 store) this is
faster for bf16, and for e4m3 with a gather (the sweep of benchmarks/tuning.py). The transposed kernel keeps 8
lanes along the tokens by 4 along the channels: its stores (8 tokens of e4m3 per lane and channel) then cover 64
contiguous bytes of each of 8 output rows, with no shared-memory transpose. The column amax is a thread's 8 tokens
(for bf16 in bf16 pairs, converted once), then a butterfly over the lanes along the tokens; those partial amaxes go
to shared memory, where one thread per (block, column) of the CTA joins them, computes the scale factor and
multiplier (the only divisions), stores the scale factor and shares the multiplier with the threads that hold the
column. The e4m3 casts convert pairs of values (one instruction per pair).

Token count, hidden size and every stride are run-time values; all accesses are masked against the
buffer dims (a whole 16-byte vector at a time: the op guarantees hidden is a multiple of the vector).
"""

from typing import NamedTuple

from tilelang import language as T

from kernel_src.cuda import prelude
from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.common import block_scale

NUM_THREADS = 256
TILE_M = 128  # tokens per CTA: one block of 128 or four of 32
WARPS = NUM_THREADS // 32


class Layout(NamedTuple):
    """How a CTA's 128 tokens x tile_k channels are dealt to its threads: each thread loads `rows` consecutive
    tokens of one `vec_bytes` vector; a warp is `lanes_k` lanes along the channels by 32 / lanes_k along the
    tokens, and the CTA `warps_k` warps along the channels by 8 / warps_k along the tokens."""
    rows: int
    lanes_k: int
    warps_k: int
    vec_bytes: int


# The transposed kernel's stores need 8 lanes along the tokens (8 tokens of e4m3 a lane: 64 contiguous bytes of
# each of 8 output rows a warp).
DEFAULT_LAYOUT = Layout(rows=8, lanes_k=4, warps_k=4, vec_bytes=16)
IN_DTYPES = {'bfloat16': 2, 'float32': 4, 'float8_e4m3fn': 1}
E4M3_MAX, AMAX_FLOOR = 448.0, 1e-4
IN_SF_BLOCK = 128  # channels per input scale factor (e4m3 input)
# CTAs per SM the register allocation must allow (256 threads: 3, 4 CTAs = at most 80, 64 registers a thread): a
# CTA has 32 KB of loads in flight (e4m3: 64 KB) and then none while it reduces and stores, so several must share an SM.
# With the scales computed once per (block, column) and shared through shared memory (no per-thread arrays of
# scales) and bf16 amaxes kept in bf16 pairs, bf16 and float32 fit 64 registers and e4m3 input 80, none
# spilling.
MIN_BLOCKS = {'bfloat16': 4, 'float32': 4, 'float8_e4m3fn': 3}
# The fused kernel's layout by input dtype (benchmarks/tuning.py sweeps it).
ROW_LINES_LAYOUT = Layout(rows=8, lanes_k=16, warps_k=1, vec_bytes=16)
LAYOUT = {'bfloat16': ROW_LINES_LAYOUT, 'float32': ROW_LINES_LAYOUT, 'float8_e4m3fn': ROW_LINES_LAYOUT}

# The e4m3 input is converted to float32 twice, for the amax and again for the cast. For SM100 nvcc keeps the
# first conversions (128 halves a thread) live until the cast instead, and would spill 400-550 bytes a thread at
# 80 registers (and 136-176 at 128); sm_90a recomputes them. tk_opaque_vector, an empty asm that claims to change a
# row's vector before its cast, makes the first conversions unusable there, at no instruction.
_OPAQUE_VECTOR_PRELUDE = prelude('opaque_vector.cuh')


def check(in_dtype: str, gather: bool, transpose: bool, num_per_tokens: int) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if num_per_tokens not in (32, 128):
        raise ValueError(f'num_per_tokens must be 32 or 128, got {num_per_tokens}')
    if transpose and (in_dtype != 'bfloat16' or gather):
        raise ValueError('the transposed kernel reads bfloat16 input without a gather')
    if not transpose and num_per_tokens != 128:
        raise ValueError('the fused kernel uses blocks of 128 tokens')


def build(arch: Arch, in_dtype: str, gather: bool, transpose: bool, num_per_tokens: int, min_blocks: int = 0, rows: int = 0,
          lanes_k: int = 0, warps_k: int = 0, vec_bytes: int = 0) -> KernelProgram:
    """min_blocks (0: MIN_BLOCKS) and the Layout fields (0: the shipped layout) are tuning knobs (benchmarks/tuning.py)."""
    # Evaluated here, not in the kernel body, where the eager builder would turn `or` into a TIR expression.
    ctas_per_sm = min_blocks or MIN_BLOCKS[in_dtype]
    shipped = DEFAULT_LAYOUT if transpose else LAYOUT[in_dtype]
    rows, lanes_k, warps_k, vec_bytes = (knob or default for knob, default in zip((rows, lanes_k, warps_k, vec_bytes), shipped))
    lanes_m, warps_m = 32 // lanes_k, WARPS // warps_k
    if rows * lanes_m * warps_m != TILE_M or (transpose and (rows, lanes_m) != (8, 8)):
        raise ValueError(f'layout {rows, lanes_k, warps_k, vec_bytes} does not deal {TILE_M} tokens a CTA as this kernel needs')
    epv = vec_bytes // IN_DTYPES[in_dtype]  # channels per vector
    tile_k = epv * lanes_k * warps_k
    dequant = in_dtype == 'float8_e4m3fn'
    group_tokens = min(num_per_tokens, rows * lanes_m)  # tokens the warp butterfly joins
    lane_steps = (group_tokens // rows).bit_length() - 1  # butterfly steps in a warp
    num_groups = TILE_M // group_tokens  # partial amaxes per column in a CTA
    groups_per_block = num_per_tokens // group_tokens
    blocks_per_tile = TILE_M // num_per_tokens  # scale-factor rows per CTA: 1 or 4
    scale_rounds = -(-blocks_per_tile * tile_k // NUM_THREADS)  # (block, column) scales per thread, rounded up

    num_tokens = T.dynamic('num_tokens')  # input rows
    num_tokens_out = T.dynamic('num_tokens_out') if gather else num_tokens
    hidden = T.dynamic('hidden')
    row_stride = T.dynamic('row_stride')
    num_sf_rows = T.dynamic('num_sf_rows')  # ceil(num_tokens_out / num_per_tokens)
    num_in_blocks = T.dynamic('num_in_blocks')
    in_sf_stride_t = T.dynamic('in_sf_stride_t')
    in_sf_stride_k = T.dynamic('in_sf_stride_k')

    # float32 conversions: vectorised for e4m3 (a pair converts in one instruction), one by one otherwise (one
    # instruction each for bf16; the paired bf16 conversion takes two per pair).
    conversion_loop = T.vectorized if dequant else T.unroll

    def dequantized(as_float, in_sf, i, e):
        """float32 value of channel e of the thread's row i, from its float32 conversion: float(q) * sf for e4m3
        input (one rounding)."""
        return as_float[e] * in_sf[i] if dequant else as_float[e]

    def block_amax(partials, block, column):
        """amax of a (block, column) of the CTA: the max of the block's partials (plain Python: one expression)."""
        result = partials[block * groups_per_block, column]
        for g in range(1, groups_per_block):
            result = T.max(result, partials[block * groups_per_block + g, column])
        return result

    # The casts and stores of a thread's rows (untransposed); `masked` (a Python bool) checks each row.
    @T.macro
    def cast_rows(out, values, in_sf, multiplier, as_float, scaled, row0, col, masked):
        quantized = T.alloc_local((epv,), T.float8_e4m3fn)
        for i in T.unroll(rows):
            if T.And(row0 + i < num_tokens_out, col < hidden) if masked else T.bool(True):
                if dequant:
                    T.evaluate(T.call_extern('void', 'tk_opaque_vector', T.address_of(values[i, 0])))
                for e in conversion_loop(epv):
                    as_float[e] = T.Cast(T.float32, values[i, e])
                for e in T.unroll(epv):
                    scaled[e] = dequantized(as_float, in_sf, i, e) * multiplier[e]
                for e in T.vectorized(epv):
                    quantized[e] = T.Cast(T.float8_e4m3fn, scaled[e])
                for e in T.vectorized(epv):
                    out[row0 + i, col + e] = quantized[e]

    @T.macro
    def body(x, x_sf, pos_to_token, out, out_sf, round_sf):
        with T.Kernel(T.ceildiv(hidden, tile_k), T.ceildiv(num_tokens_out, TILE_M), threads=NUM_THREADS,
                      prelude=_OPAQUE_VECTOR_PRELUDE) as (pid_k, pid_m):
            # Register cap for more CTAs (hence more loads in flight) per SM; see MIN_BLOCKS.
            T.annotate_min_blocks_per_sm(ctas_per_sm)
            T.assume(hidden % epv == 0)
            T.assume(row_stride % epv == 0)
            if transpose:
                T.assume(num_tokens % TILE_M == 0)
            tid = T.get_thread_binding()
            warp, lane = tid // 32, tid % 32
            rg = (warp // warps_k) * lanes_m + lane // lanes_k  # the thread's group of rows tokens in the tile
            # First token and first channel of the thread, as plain expressions so that tilelang can prove
            # the channel a multiple of the vector and emit 16-byte accesses.
            row0 = pid_m * TILE_M + rg * rows
            col = pid_k * tile_k + ((warp % warps_k) * lanes_k + lane % lanes_k) * epv

            values = T.alloc_local((rows, epv), in_dtype)
            src = T.alloc_local((rows,), T.int32)
            in_sf = T.alloc_local((rows,), T.float32)
            amax = T.alloc_local((epv,), T.float32)
            multiplier = T.alloc_local((epv,), T.float32)
            sf = T.alloc_local((1,), T.float32)
            as_float = T.alloc_local((epv,), T.float32)
            scaled = T.alloc_local((max(epv, rows),), T.float32)

            # Loads: all of the thread's rows before any arithmetic, so they are in flight together. Without a
            # gather, a CTA whose tile lies inside x (all but the last row and column tiles) loads and stores
            # with no masks: under the per-row checks each load sat in a branch of its own with its address
            # redone, the first issued at SASS instruction 86 and the last at 155 (upstream's: 15 to 30).
            interior = T.alloc_var(T.bool)
            interior = T.bool(False)
            if not gather:
                interior = T.And((pid_m + 1) * TILE_M <= num_tokens_out, pid_k * tile_k + tile_k <= hidden)
            if interior:
                for i in T.unroll(rows):
                    for e in T.vectorized(epv):
                        values[i, e] = x[row0 + i, col + e]
                    if dequant:
                        in_sf[i] = x_sf[row0 + i, col // IN_SF_BLOCK]
            else:
                for i in T.unroll(rows):
                    src[i] = -1
                    if row0 + i < num_tokens_out and col < hidden:
                        if gather:
                            src[i] = pos_to_token[row0 + i]
                        else:
                            src[i] = row0 + i
                if gather:  # after all the loads, so that they are in flight together
                    in_range = T.alloc_var(T.bool)
                    in_range = True
                    for i in T.unroll(rows):
                        in_range = in_range and src[i] < num_tokens
                    device_assert(in_range)
                    for i in T.unroll(rows):
                        src[i] = T.if_then_else(src[i] < num_tokens, src[i], -1)
                for i in T.unroll(rows):
                    if src[i] >= 0:
                        for e in T.vectorized(epv):
                            values[i, e] = x[src[i], col + e]
                        if dequant:
                            in_sf[i] = x_sf[src[i], col // IN_SF_BLOCK]
                    else:
                        # Rows past the end and gathered rows of index -1 are zeros (they cannot raise an amax).
                        for e in T.vectorized(epv):
                            values[i, e] = T.cast(0, in_dtype)
                        if dequant:
                            in_sf[i] = T.float32(0)

            if in_dtype == 'bfloat16':
                # The thread's amax in bf16 pairs (|x| and __hmax2: one instruction each per pair, against a
                # conversion and a max per value in float32), converted once. Exact: the max of bf16 values
                # is one of them. From 0, as in float32: __hmax2, like fmaxf, returns the other input for a
                # NaN, so NaN inputs never reach the amax.
                amax_pairs = T.alloc_local((epv,), T.bfloat16)
                for e in T.vectorized(epv):
                    amax_pairs[e] = T.cast(0, T.bfloat16)
                for i in T.unroll(rows):
                    for e in T.vectorized(epv):
                        amax_pairs[e] = T.max(amax_pairs[e], T.abs(values[i, e]))
                for e in T.unroll(epv):
                    amax[e] = T.Cast(T.float32, amax_pairs[e])
            else:
                for e in T.unroll(epv):
                    amax[e] = T.float32(0)
                for i in T.unroll(rows):
                    for e in conversion_loop(epv):
                        as_float[e] = T.Cast(T.float32, values[i, e])
                    for e in T.unroll(epv):
                        amax[e] = T.max(amax[e], T.abs(dequantized(as_float, in_sf, i, e)))
            # Lanes along the tokens are the lane bits above those along the channels (xor lanes_k, 2 lanes_k, ...).
            for e in T.unroll(epv):
                for s in T.unroll(lane_steps):
                    amax[e] = T.max(amax[e], T.shfl_xor(amax[e], lanes_k << s))
            # The scales: each warp row's partial amax per column goes to shared memory (from the first thread
            # of each group of tokens the butterfly joined), then one thread per (block, column) computes the
            # block's scale factor and multiplier, stores the scale factor (consecutive threads, consecutive
            # columns) and shares the multiplier. Two divisions per block and column in the CTA rather than in
            # each thread that holds the column, and no per-thread arrays of scales to keep live.
            # tilelang may place `multipliers` over `partials` (it does for bf16 and float32). Safe while a CTA
            # has one block (128 tokens) or one partial per block (32): multipliers[b, c] then overlaps only
            # partials[b, c], a partial of the same (block, column), whose thread reads it before writing.
            partials = T.alloc_shared((num_groups, tile_k), T.float32)
            multipliers = T.alloc_shared((blocks_per_tile, tile_k), T.float32)
            col_in_tile = ((warp % warps_k) * lanes_k + lane % lanes_k) * epv
            if (rg * rows) % group_tokens == 0:
                for e in T.vectorized(epv):
                    partials[rg * rows // group_tokens, col_in_tile + e] = amax[e]
            T.sync_threads()
            for r in T.unroll(scale_rounds):
                item = r * NUM_THREADS + tid
                if item < blocks_per_tile * tile_k:
                    block = item // tile_k
                    column = item % tile_k
                    # multiplier[0] is scratch here: each thread reloads its own multipliers below.
                    block_scale(block_amax(partials, block, column), T.float32(AMAX_FLOOR), E4M3_MAX, round_sf, False, sf,
                                multiplier, 0)
                    sf_row = pid_m * blocks_per_tile + block
                    if sf_row < num_sf_rows and pid_k * tile_k + column < hidden:
                        out_sf[sf_row, pid_k * tile_k + column] = sf[0]
                    multipliers[block, column] = multiplier[0]
            T.sync_threads()
            for e in T.vectorized(epv):
                multiplier[e] = multipliers[rg * rows // num_per_tokens, col_in_tile + e]

            # Products in float32 (unrolled), then the e4m3 casts as a vectorised loop, which lowers to one
            # two-value conversion (F2FP ... PACK_AB) per pair instead of one per value.
            if transpose:
                quantized_t = T.alloc_local((epv, rows), T.float8_e4m3fn)
                for e in T.unroll(epv):
                    for i in T.unroll(rows):  # bf16 input only: a conversion is one instruction anyway
                        scaled[i] = T.Cast(T.float32, values[i, e]) * multiplier[e]
                    for i in T.vectorized(rows):
                        quantized_t[e, i] = T.Cast(T.float8_e4m3fn, scaled[i])
                if row0 < num_tokens and col < hidden:
                    for e in T.unroll(epv):
                        for i in T.vectorized(rows):
                            out[col + e, row0 + i] = quantized_t[e, i]
            else:
                if interior:
                    cast_rows(out, values, in_sf, multiplier, as_float, scaled, row0, col, False)
                else:
                    cast_rows(out, values, in_sf, multiplier, as_float, scaled, row0, col, True)

    x_type = T.StridedTensor[(num_tokens, hidden), (row_stride, 1), in_dtype]
    x_sf_type = T.StridedTensor[(num_tokens, num_in_blocks), (in_sf_stride_t, in_sf_stride_k), T.float32]
    out_type = T.Tensor[(hidden, num_tokens), T.float8_e4m3fn] if transpose else T.Tensor[(num_tokens_out, hidden), T.float8_e4m3fn]
    out_sf_type = T.Tensor[(num_sf_rows, hidden), T.float32]

    if dequant and gather:
        @T.prim_func
        def per_channel_cast(x: x_type, x_sf: x_sf_type, pos_to_token: T.Tensor[(num_tokens_out,), T.int32], out: out_type,
                             out_sf: out_sf_type, round_sf: T.int32):
            body(x, x_sf, pos_to_token, out, out_sf, round_sf)
    elif dequant:
        @T.prim_func
        def per_channel_cast(x: x_type, x_sf: x_sf_type, out: out_type, out_sf: out_sf_type, round_sf: T.int32):
            body(x, x_sf, None, out, out_sf, round_sf)
    elif gather:
        @T.prim_func
        def per_channel_cast(x: x_type, pos_to_token: T.Tensor[(num_tokens_out,), T.int32], out: out_type, out_sf: out_sf_type,
                             round_sf: T.int32):
            body(x, None, pos_to_token, out, out_sf, round_sf)
    else:
        @T.prim_func
        def per_channel_cast(x: x_type, out: out_type, out_sf: out_sf_type, round_sf: T.int32):
            body(x, None, None, out, out_sf, round_sf)

    alignment = {'x': 16, 'out': 16 if not transpose else 8, 'out_sf': 16}
    if dequant:
        alignment['x_sf'] = 4
    if gather:
        alignment['pos_to_token'] = 4
    return KernelProgram(per_channel_cast, alignment=alignment)


PASS_CONFIGS = {
    'tl.disable_warp_specialized': True,
    'tl.enable_lower_ldgstg': True,  # 16-byte stores from register arrays
    # Every access is masked explicitly (whole vectors against the buffer dims); tilelang's own
    # per-element guards would stop the vectorisation.
    'tl.disable_safe_memory_legalize': True,
}


def prebuilt_fused():
    for in_dtype in IN_DTYPES:
        for gather in (False, True):
            yield dict(in_dtype=in_dtype, gather=gather, transpose=False, num_per_tokens=128)


def prebuilt_transpose():
    for num_per_tokens in (32, 128):
        yield dict(in_dtype='bfloat16', gather=False, transpose=True, num_per_tokens=num_per_tokens)


PARAMS = (
    param('in_dtype', 'str', ''),
    param('gather', 'bool', 'gather'),
    param('transpose', 'bool', 'tr'),
    param('num_per_tokens', 'int', 'npt'),
)

CONSTANTS = {'tile_m': TILE_M}  # the grid's y is ceil(tokens / tile_m), which the op keeps within 65535
FUSED = KernelDecl(name='quant.per_channel_cast_fused', params=PARAMS, factory=build, prebuilt=prebuilt_fused, check=check,
                   pass_configs=PASS_CONFIGS, constants=CONSTANTS)
TRANSPOSE = KernelDecl(name='quant.per_channel_cast_and_transpose', params=PARAMS, factory=build, prebuilt=prebuilt_transpose,
                       check=check, pass_configs=PASS_CONFIGS, constants=CONSTANTS)
