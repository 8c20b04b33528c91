"""SwiGLU forward + per-token cast to e4m3: quant.swiglu_forward_and_per_token_cast.

v = act * w (w = topk_weights[pos_to_token_topk[row]], 0 for a negative index, 1 without weights; an index past
topk_weights fails the kernel, see forward_steps.read_weight), cast in blocks of (1, 128), or one block per row
(per_row). Rows with pos_to_expert < 0 are neither read nor written. Clamp counts are summed per thread in int32, per
CTA through shared memory, and added to the int64 counters with one atomic per CTA and counter.

A persistent grid-stride loop deals the steps out (layout.py); each iteration brings one step in, computes it and
stores it (forward_steps.py). The fp32 kernels load a step from x with its lookups issued an iteration ahead; the
bf16 kernels (the silu table, silu_table.py) copy the next step into shared memory while they compute one, with the
lookups two iterations ahead.
"""

from tilelang import language as T

from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.common import IN_DTYPES, SF_FORMATS
from kernel_src.quant.swiglu.common import PASS_CONFIGS, clamp_or_inf, swiglu_prelude
from kernel_src.quant.swiglu.forward_steps import (
    Grid,
    Routing,
    StagedStep,
    StepLookup,
    count_into,
    float_swiglu,
    next_loaded_step,
    next_staged_step,
    recount_loaded,
    recount_staged,
    reduce_amax,
    stage_first_step,
    step_abs_max,
    store_step,
    words_swiglu,
)
from kernel_src.quant.swiglu.layout import (
    BLOCK,
    FWD_ELEMENTS,
    FWD_MIN_BLOCKS,
    FWD_MIN_BLOCKS_BY_FAMILY,
    FWD_THREADS,
    LANES,
    ROW_THREADS,
    FormedRowVectors,
    ForwardLayout,
)
from kernel_src.quant.swiglu.silu_table import TABLE_DEFINES, TABLE_ENTRIES_PER_THREAD, TABLE_THREADS, TABLE_WORDS, build_silu_table
from kernel_src.quant.token_sf import token_sf_tensor


def check_forward(in_dtype: str, sf_format: str, per_row: bool, row_threads: int) -> None:
    if in_dtype not in IN_DTYPES:
        raise ValueError(f'in_dtype must be one of {sorted(IN_DTYPES)}, got {in_dtype!r}')
    if sf_format not in SF_FORMATS:
        raise ValueError(f'sf_format must be one of {SF_FORMATS}, got {sf_format!r}')
    if per_row and sf_format != 'f32':
        raise ValueError('per_row (one scale factor per row) stores row-major float32 scale factors only')
    allowed = ROW_THREADS[in_dtype] if per_row else (0,)
    if row_threads not in allowed:
        raise ValueError(f'row_threads must be one of {allowed} for {in_dtype} with per_row={per_row}, got {row_threads}')


def forward_prelude(layout: ForwardLayout) -> str:
    """The kernel's CUDA helpers: the division and the index check, and for bf16 the word tests, the silu table and the stage; per_row
    the row amax."""
    headers = ['swiglu_div.cuh', 'trap_unless.cuh']
    defines = {}
    if layout.words:
        headers += ['swiglu_words.cuh', 'swiglu_silu_table.cuh']
        defines.update(TABLE_DEFINES)
    if layout.per_row:
        headers.append('swiglu_row_max.cuh')
        defines['TK_NUM_WARPS'] = layout.num_warps
    if layout.words:
        headers.append('swiglu_stage.cuh')
    return swiglu_prelude(*headers, **defines)


def build_forward(arch: Arch, in_dtype: str, sf_format: str, per_row: bool, row_threads: int) -> KernelProgram:
    """row_threads: the per_row kernel's CTA size (0 for the flat kernel, whose CTA size is fixed)."""
    packed = sf_format == 'ue8m0'
    words = in_dtype == 'bfloat16'
    # The bf16 flat kernel runs one CTA of TABLE_THREADS an SM (the table is built once a CTA), with the same
    # 64-register budget and 8 warps a scheduler as 4 CTAs of 256.
    threads = row_threads if per_row else TABLE_THREADS if words else FWD_THREADS
    min_blocks = max(1, FWD_MIN_BLOCKS_BY_FAMILY.get((arch.family, in_dtype), FWD_MIN_BLOCKS[in_dtype]) * FWD_THREADS // threads)
    num_rows = T.dynamic('num_rows')
    width = T.dynamic('width')
    hidden = T.dynamic('hidden')
    layout = ForwardLayout(in_dtype, per_row, threads, hidden)
    assert layout.blocks_per_step % layout.deal_blocks == 0 and (not words or threads == TABLE_THREADS)
    epv, num_vectors, num_warps = layout.epv, layout.num_vectors, layout.num_warps
    num_p2t = T.dynamic('num_p2t')
    num_weights = T.dynamic('num_weights')
    num_p2e = T.dynamic('num_p2e')
    num_sf_blocks, num_sf_words = T.dynamic('num_sf_blocks'), T.dynamic('num_sf_words')
    sf_type = token_sf_tensor(packed, num_rows, num_sf_blocks, num_sf_words, T.dynamic('sf_word_stride'),
                              T.dynamic('sf_stride_t'), T.dynamic('sf_stride_k'))

    @T.prim_func
    def swiglu_forward(
        x: T.Tensor[(num_rows, width), in_dtype],
        out: T.Tensor[(num_rows, hidden), T.float8_e4m3fn],
        out_sf: sf_type,
        pos_to_token_topk: T.Tensor[(num_p2t,), T.int32],
        topk_weights: T.Tensor[(num_weights,), T.float32],
        pos_to_expert: T.Tensor[(num_p2e,), T.int32],
        clamped_count: T.Tensor[(3,), T.int64],
        num_ctas: T.int32,
        num_iters: T.int32,
        blocks_per_row: T.int32,
        row_magic: T.int64,
        row_shift: T.int32,
        with_weight: T.int32,
        with_pos_to_expert: T.int32,
        use_clamp: T.int32,
        count_clamp: T.int32,
        round_sf: T.int32,
        tpr_log2: T.int32,
        clamp_value: T.float32,
        sf_floor: T.float32,
    ):
        with T.Kernel(num_ctas, threads=threads, prelude=forward_prelude(layout)) as pid:
            T.annotate_min_blocks_per_sm(min_blocks)
            T.assume(hidden % BLOCK == 0)
            T.assume(width % 64 == 0)
            tid = T.get_thread_binding()
            gate = T.alloc_local((num_vectors, epv), in_dtype)
            up = T.alloc_local((num_vectors, epv), in_dtype)
            act = T.alloc_local((num_vectors, epv), T.float32)
            amax = T.alloc_local((num_vectors,), T.float32)
            multiplier = T.alloc_local((num_vectors,), T.float32)
            sf = T.alloc_local((num_vectors,), T.float32)
            counts = T.alloc_local((3,), T.int32)
            red_counts = T.alloc_shared((num_warps, 3), T.int32)
            row_partials = None
            if per_row:
                row_partials = T.alloc_shared((2 * num_warps,), T.float32)  # swiglu_row_max.cuh: a warp's partial by step parity
            for c in T.unroll(3):
                counts[c] = 0
            next_row = T.alloc_local((1,), T.int32)
            next_block = T.alloc_local((1,), T.int32)
            next_live = T.alloc_local((1,), T.int32)
            next_expert = T.alloc_local((1,), T.int32)
            next_index = T.alloc_local((1,), T.int32)
            step_weight = T.alloc_local((1,), T.float32)
            reach = T.alloc_local((2,), T.float32)  # fp32: the largest gate and |up| of the step, for the clamp counts
            div_range = T.alloc_local((2,), T.float32)  # fp32: the largest and smallest |clamped gate| of the step
            # bf16: the largest and smallest gate magnitude bits and the clamp-count reach, as 16x2 words.
            gate_bits = T.alloc_local((3,), T.uint32)
            gate_clamped = T.alloc_local((1,), T.float32)
            # One vector of each half widened to float32.
            gate_wide = T.alloc_local((epv,), T.float32)
            up_wide = T.alloc_local((epv,), T.float32)
            quantized = T.alloc_local((epv,), T.float8_e4m3fn)
            clamp_c = T.alloc_var(T.float32)
            clamp_c = clamp_or_inf(use_clamp, clamp_value)
            clamp_pair = None  # bf16: the clamp rounded down to bf16, in both halves (the fp32 kernels count by element)
            if words:
                clamp_pair = T.alloc_var(T.uint32)
                clamp_pair = T.call_extern('uint32', 'tk_bf16x2_clamp_pair', clamp_c)
            if per_row:
                lane = tid & ((1 << tpr_log2) - 1)
            else:
                lane = tid & (LANES - 1)
            # per_row: vector j of this lane (j * 2^tpr_log2 + lane, in vectors of the row), the same every step. The
            # staged kernel keeps them in registers; the fp32 kernels form them at each use, which suits their
            # register budgets.
            if words and per_row:
                row_vectors = T.alloc_local((num_vectors,), T.int32)
                for j in T.unroll(num_vectors):
                    row_vectors[j] = (j << tpr_log2) + lane
            else:
                row_vectors = FormedRowVectors(lane, tpr_log2)
            next_row[0] = 0
            next_block[0] = 0
            next_live[0] = 0
            next_expert[0] = 0
            next_index[0] = 0
            lookup = StepLookup(next_row, next_block, next_live, next_expert, next_index)
            indices_ok = None if words else T.alloc_local((1,), T.bool)
            if not words:
                indices_ok[0] = True
            routing = Routing(pos_to_token_topk, topk_weights, num_weights, pos_to_expert, with_weight, with_pos_to_expert, indices_ok)
            grid = Grid(pid, tid, num_ctas, num_iters, num_rows, blocks_per_row, row_magic, row_shift, tpr_log2)
            if words:
                # Two slots of the step's vectors for each thread, 128 KB beside the 42 KB table.
                stage = T.alloc_shared((2, 2 * num_vectors, threads, epv), in_dtype)
                staged_row = T.alloc_local((1,), T.int32)
                staged_block = T.alloc_local((1,), T.int32)
                staged_live = T.alloc_local((1,), T.int32)
                staged_weight = T.alloc_local((1,), T.float32)
                staged_row[0] = 0
                staged_block[0] = 0
                staged_live[0] = 0
                staged_weight[0] = T.float32(1)
                staged = StagedStep(stage, staged_row, staged_block, staged_live, staged_weight)
                stage_first_step(layout, x, staged, lookup, routing, grid, lane, row_vectors)
                # The silu table, built before the loop (inside it, tilelang would put a barrier before the table
                # stores of every iteration).
                silu_table = T.alloc_shared((TABLE_WORDS,), T.float32)
                table_gates = T.alloc_local((TABLE_ENTRIES_PER_THREAD,), T.float32)
                table_silu = T.alloc_local((TABLE_ENTRIES_PER_THREAD,), T.float32)
                div_range_build = T.alloc_local((2,), T.float32)
                build_silu_table(silu_table, table_gates, table_silu, div_range_build, clamp_c, tid)
                T.sync_threads()
            row = T.alloc_var(T.int32)
            block = T.alloc_var(T.int32)
            live = T.alloc_var(T.int32)
            index = T.alloc_var(T.int32)
            for t in T.serial(num_iters + 1):
                # Load step t - 1: its row, block (carried rather than the column: block * 128 + lane * epv keeps
                # the vector alignment visible to tilelang, which then emits 16-byte accesses), whether it is
                # processed, its weight and its vectors.
                if words:
                    next_staged_step(layout, t, x, gate, up, step_weight, staged, lookup, routing, grid, lane, row_vectors, row,
                                     block, live, index)
                else:
                    next_loaded_step(layout, t, x, gate, up, step_weight, lookup, routing, grid, lane, row_vectors, row, block,
                                     live, index)
                # Compute its act, amax and clamp counts.
                amax[0] = T.float32(0)
                if live != 0:
                    reach[0] = T.float32(float('-inf'))
                    reach[1] = T.float32(0)
                    div_range[0] = T.float32(0)
                    div_range[1] = T.float32(float('inf'))
                    if words:
                        words_swiglu(layout, gate, up, act, up_wide, gate_bits, silu_table, step_weight, count_clamp, clamp_c)
                    else:
                        float_swiglu(layout, x, gate, up, act, gate_wide, up_wide, reach, div_range, gate_clamped, step_weight,
                                     count_clamp, lane, row_vectors, row, block, clamp_c)
                    amax[0] = T.max(amax[0], step_abs_max(layout, act, row_vectors))
                    if count_clamp != 0:
                        if words:
                            recount_staged(layout, t, staged, gate, up, counts, gate_bits, row_vectors, tid, clamp_c, clamp_pair)
                        else:
                            recount_loaded(layout, x, gate, up, counts, reach, lane, row_vectors, row, block, clamp_c)
                reduce_amax(layout, amax, row_partials, tid, tpr_log2, t)
                # Store its scale factor and e4m3 codes.
                if live != 0:
                    store_step(layout, out, out_sf, act, amax, sf, multiplier, quantized, packed, sf_floor, round_sf, blocks_per_row,
                               num_sf_blocks, num_sf_words, lane, row_vectors, row, block)
            if count_clamp != 0:
                count_into(layout, counts, clamped_count, red_counts, tid)
            if not words:
                device_assert(indices_ok[0])

    alignment = {'x': 16, 'out': 16, 'out_sf': 1 if packed else 4, 'pos_to_token_topk': 4, 'topk_weights': 4, 'pos_to_expert': 4,
                 'clamped_count': 8}
    return KernelProgram(swiglu_forward, alignment=alignment)


def prebuilt_forward():
    for in_dtype in IN_DTYPES:
        for sf_format in SF_FORMATS:
            yield {'in_dtype': in_dtype, 'sf_format': sf_format, 'per_row': False, 'row_threads': 0}
        for row_threads in ROW_THREADS[in_dtype]:
            yield {'in_dtype': in_dtype, 'sf_format': 'f32', 'per_row': True, 'row_threads': row_threads}


FORWARD = KernelDecl(
    name='quant.swiglu_forward_and_per_token_cast',
    params=(param('in_dtype', 'str', ''), param('sf_format', 'str', 'sf'), param('per_row', 'bool', 'row'),
            param('row_threads', 'int', 'rt')),
    factory=build_forward,
    prebuilt=prebuilt_forward,
    check=check_forward,
    pass_configs=PASS_CONFIGS,
    # thread_elements: the elements of each half a thread takes a step, which the op derives the steps and a per-row
    # spec's widest row (row_threads of them) from; index_limit: the flat kernel's block indices, over every step of
    # every CTA, are int32.
    constants={'thread_elements': FWD_ELEMENTS, 'index_limit': 2**31},
)
