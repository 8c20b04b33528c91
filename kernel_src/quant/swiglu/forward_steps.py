"""The SwiGLU forward's step, piece by piece: look a step up, bring its vectors in (from x, or through the shared
memory stage of the bf16 kernels), compute act, its amax and its clamp counts, and store it cast to e4m3.

A thread computes one step at a time (16 elements of each half), and the scheduler hides the SwiGLU's serial chain
(exponential, division) with more warps rather than a software pipeline in registers. The row lookups of a step are
issued an iteration ahead of its loads (fp32, and the bf16 copy) so that the dependent x loads never wait for them.
"""

from tilelang import language as T

from kernel_src.bounds import device_trap
from kernel_src.quant.common import block_scale
from kernel_src.quant.swiglu.common import E4M3_MAX, clamp_gate, clamped_swiglu, clamped_swiglu_fast, track_division_range, warp_all
from kernel_src.quant.swiglu.layout import LANES_LOG2, flat_block, in_step, row_of_step, vector_col, vector_in_row
from kernel_src.quant.swiglu.silu_table import table_step
from kernel_src.quant.token_sf import store_token_sf


class StepLookup:
    """One-element local buffers of a looked-up step: its row, flat block, whether it exists, and its pos_to_expert
    and pos_to_token_topk entries, issued by look_up_step and read an iteration or two later."""

    def __init__(self, row, block, live, expert, index):
        self.row, self.block, self.live, self.expert, self.index = row, block, live, expert, index


class StagedStep:
    """The bf16 kernels' copy of the next step in shared memory (stage[slot, vector, thread]) and its row, block,
    liveness and weight."""

    def __init__(self, stage, row, block, live, weight):
        self.stage, self.row, self.block, self.live, self.weight = stage, row, block, live, weight


class Routing:
    """The optional row inputs: pos_to_token_topk into topk_weights (with_weight; num_weights entries), pos_to_expert
    (with_pos_to_expert). `indices_ok`: a one-element local buffer that read_weight clears on an index past
    topk_weights, for the kernel to assert after its loop; None where the loop has no register to spare for it."""

    def __init__(self, pos_to_token_topk, topk_weights, num_weights, pos_to_expert, with_weight, with_pos_to_expert, indices_ok):
        self.pos_to_token_topk, self.topk_weights, self.num_weights = pos_to_token_topk, topk_weights, num_weights
        self.pos_to_expert, self.with_weight, self.with_pos_to_expert = pos_to_expert, with_weight, with_pos_to_expert
        self.indices_ok = indices_ok


class Grid:
    """The persistent grid: this thread and CTA, the step count, and the rows (a flat block's row is
    (block * row_magic) >> row_shift, block // blocks_per_row without a division)."""

    def __init__(self, pid, tid, num_ctas, num_iters, num_rows, blocks_per_row, row_magic, row_shift, tpr_log2):
        self.pid, self.tid, self.num_ctas, self.num_iters, self.num_rows = pid, tid, num_ctas, num_iters, num_rows
        self.blocks_per_row, self.row_magic, self.row_shift, self.tpr_log2 = blocks_per_row, row_magic, row_shift, tpr_log2


def step_is_live(lookup, routing):
    """Whether a looked-up step is processed: its row exists and pos_to_expert does not skip it."""
    return T.Cast(T.int32, T.And(lookup.live[0] != 0, T.Or(routing.with_pos_to_expert == 0, lookup.expert[0] >= 0)))


@T.macro
def read_weight(routing, index, weight):
    """weight[0] = a row's weight from its pos_to_token_topk entry: 0 for a negative index and for one past
    topk_weights, which also fails the kernel (kernel_src/bounds.py has the rule): it clears routing.indices_ok, which
    the kernel asserts after its loop (an assert before the loop's shuffles would make ptxas compile them twice), or,
    where the loop has no register to spare for that (the bf16 kernels), traps here (trap_unless.cuh). The check
    comes where the weight is read, an iteration after the entry's load was issued, so that it never waits for it."""
    if routing.indices_ok is None:
        T.evaluate(device_trap(index < routing.num_weights))
    else:
        routing.indices_ok[0] = routing.indices_ok[0] and index < routing.num_weights
    weight[0] = T.if_then_else(T.And(index >= 0, index < routing.num_weights), routing.topk_weights[T.max(index, 0)], T.float32(0))


@T.macro
def look_up_step(layout, step, lookup, routing, grid):
    """Step `step`'s row (and flat: block) and its lookups. Steps past the last are not live, and their block index
    is not formed, so it never overflows."""
    if layout.per_row:
        lookup.row[0] = row_of_step(layout, T.min(step, grid.num_iters - 1), grid.pid, grid.tid, grid.num_ctas, grid.tpr_log2)
    else:
        blk = flat_block(layout, T.min(step, grid.num_iters - 1), grid.pid, grid.tid, grid.num_ctas)
        lookup.row[0] = T.Cast(T.int32, (T.Cast(T.int64, blk) * grid.row_magic) >> T.Cast(T.int64, grid.row_shift))
        lookup.block[0] = blk - lookup.row[0] * grid.blocks_per_row
    lookup.live[0] = T.Cast(T.int32, T.And(step < grid.num_iters, lookup.row[0] < grid.num_rows))
    if lookup.live[0] != 0:
        if routing.with_pos_to_expert != 0:
            lookup.expert[0] = routing.pos_to_expert[lookup.row[0]]
        if routing.with_weight != 0:
            lookup.index[0] = routing.pos_to_token_topk[lookup.row[0]]


@T.macro
def fill_past_row(layout, gate, up, j):
    """per_row: vector j, past the row's end, as gate 1 and up 0: inside the silu table's window and the fast
    division's range, so it sends no step to the exact path; the amax, the clamp recount and the stores skip it."""
    for e in T.unroll(layout.epv):
        gate[j, e] = T.Cast(layout.in_dtype, T.float32(1))
        up[j, e] = T.Cast(layout.in_dtype, T.float32(0))


@T.macro
def load_step(layout, x, gate, up, row, block, lane):
    """The flat kernel's vectors of a step: all gates, then all ups."""
    for j in T.unroll(layout.num_vectors):
        for e in T.vectorized(layout.epv):
            gate[j, e] = x[T.Cast(T.int64, row), vector_col(layout, j, block, lane, None) + e]
    for j in T.unroll(layout.num_vectors):
        for e in T.vectorized(layout.epv):
            up[j, e] = x[T.Cast(T.int64, row), layout.hidden + vector_col(layout, j, block, lane, None) + e]


@T.macro
def load_row_step(layout, x, gate, up, row, row_vectors):
    """per_row: load_step with the row as the block, vector by vector, and the filler past the row's end."""
    for j in T.unroll(layout.num_vectors):
        if vector_in_row(layout, j, row_vectors):
            for e in T.vectorized(layout.epv):
                gate[j, e] = x[T.Cast(T.int64, row), vector_col(layout, j, None, None, row_vectors) + e]
            for e in T.vectorized(layout.epv):
                up[j, e] = x[T.Cast(T.int64, row), layout.hidden + vector_col(layout, j, None, None, row_vectors) + e]
        else:
            fill_past_row(layout, gate, up, j)


@T.macro
def load_from_x(layout, x, gate, up, row, block, lane, row_vectors):
    """The lane's vectors of a step read from x: load_row_step per row, else load_step."""
    if layout.per_row:
        load_row_step(layout, x, gate, up, row, row_vectors)
    else:
        load_step(layout, x, gate, up, row, block, lane)


@T.macro
def stage_vector(layout, stage, x, slot, row, block, lane, row_vectors, tid, j):
    T.evaluate(T.call_extern('void', 'tk_stage16', T.address_of(stage[slot, j, tid, 0]),
                             T.address_of(x[T.Cast(T.int64, row), vector_col(layout, j, block, lane, row_vectors)])))
    T.evaluate(T.call_extern('void', 'tk_stage16', T.address_of(stage[slot, layout.num_vectors + j, tid, 0]),
                             T.address_of(x[T.Cast(T.int64, row), layout.hidden + vector_col(layout, j, block, lane, row_vectors)])))


@T.macro
def unstage_vector(layout, stage, gate, up, slot, tid, j):
    for e in T.vectorized(layout.epv):
        gate[j, e] = stage[slot, j, tid, e]
    for e in T.vectorized(layout.epv):
        up[j, e] = stage[slot, layout.num_vectors + j, tid, e]


@T.macro
def stage_step(layout, stage, x, slot, row, block, lane, row_vectors, tid):
    """Copies the lane's vectors of a step into the stage (swiglu_stage.cuh): gate j at stage[slot, j, tid], up j at
    stage[slot, num_vectors + j, tid], so a warp's copies and reads are 512 contiguous bytes (no bank conflicts);
    per_row, only the vectors inside the row."""
    for j in T.unroll(layout.num_vectors):
        if in_step(layout, j, row_vectors):
            stage_vector(layout, stage, x, slot, row, block, lane, row_vectors, tid, j)


@T.macro
def unstage_step(layout, stage, gate, up, slot, row_vectors, tid):
    """The step's vectors from the thread's own copy in the stage (per_row, the filler past the row's end)."""
    for j in T.unroll(layout.num_vectors):
        if in_step(layout, j, row_vectors):
            unstage_vector(layout, stage, gate, up, slot, tid, j)
        else:
            fill_past_row(layout, gate, up, j)


@T.macro
def stage_first_step(layout, x, staged, lookup, routing, grid, lane, row_vectors):
    """Looks step 0 up and copies it, before the silu table is built (which would otherwise leave the memory system
    idle); its row whether skipped or not, as its lookups have not arrived yet."""
    look_up_step(layout, 0, lookup, routing, grid)
    if lookup.live[0] != 0:
        stage_step(layout, staged.stage, x, 0, lookup.row[0], lookup.block[0], lane, row_vectors, grid.tid)
    T.evaluate(T.call_extern('void', 'tk_stage_commit'))


@T.macro
def next_loaded_step(layout, t, x, gate, up, step_weight, lookup, routing, grid, lane, row_vectors, row: T.Ref,
                     block: T.Ref, live: T.Ref, index: T.Ref):
    """fp32: iteration t loads step t - 1 (looked up during iteration t - 1) and looks step t up."""
    row = lookup.row[0]
    block = lookup.block[0]
    live = step_is_live(lookup, routing)
    index = lookup.index[0]
    step_weight[0] = T.float32(1)
    if live != 0:
        load_from_x(layout, x, gate, up, row, block, lane, row_vectors)
        if routing.with_weight != 0:
            read_weight(routing, index, step_weight)
    look_up_step(layout, t, lookup, routing, grid)


@T.macro
def next_staged_step(layout, t, x, gate, up, step_weight, staged, lookup, routing, grid, lane, row_vectors, row: T.Ref,
                     block: T.Ref, live: T.Ref, index: T.Ref):
    """bf16: the lookups run two steps ahead, the copy one. Iteration t looks step t + 1 up, copies step t (looked up
    during iteration t - 1, so that a skipped row is not read) and reads its weight, then takes step t - 1 from its
    copy, after this thread's own copies of it have landed."""
    row = staged.row[0]  # noqa: F841 (a T.Ref store, read by the caller)
    block = staged.block[0]  # noqa: F841
    live = staged.live[0]
    step_weight[0] = staged.weight[0]
    staged.row[0] = lookup.row[0]
    staged.block[0] = lookup.block[0]
    staged.live[0] = step_is_live(lookup, routing)
    index = lookup.index[0]
    look_up_step(layout, t + 1, lookup, routing, grid)
    staged.weight[0] = T.float32(1)
    if staged.live[0] != 0:
        if t > 0:  # (step 0 is copied before the table's build)
            stage_step(layout, staged.stage, x, t & 1, staged.row[0], staged.block[0], lane, row_vectors, grid.tid)
        if routing.with_weight != 0:
            read_weight(routing, index, staged.weight)
    if t > 0:
        T.evaluate(T.call_extern('void', 'tk_stage_commit'))
        T.evaluate(T.call_extern('void', 'tk_stage_wait_previous'))
    if live != 0:
        unstage_step(layout, staged.stage, gate, up, (t + 1) & 1, row_vectors, grid.tid)


@T.macro
def exact_swiglu(layout, gate, up, act, step_weight, clamp_c: T.Ref):
    """act of the step with IEEE division (for gates outside the fast paths' ranges: rare)."""
    for j in T.unroll(layout.num_vectors):
        for e in T.unroll(layout.epv):
            act[j, e] = clamped_swiglu(T.Cast(T.float32, gate[j, e]), T.Cast(T.float32, up[j, e]), clamp_c) * step_weight[0]


@T.macro
def words_swiglu(layout, gate, up, act, up_wide, gate_bits, silu_table, step_weight, count_clamp, clamp_c: T.Ref):
    """bf16: act of the step from the silu table when every gate lies in its window (a test on the gates' bits,
    tk_gate_bits_in_table), else exactly."""
    gate_bits[0] = T.uint32(0)
    gate_bits[1] = T.uint32(0xFFFFFFFF)
    # gate_bits[2]: the clamp-count reach (the signed 16-bit maximum of the gates and |up|s, from -0.0 in both
    # halves, the signed minimum), or without counters the largest |up| bits. Either at or below c (and c > 0)
    # makes the clamp of every up of the step an identity.
    gate_bits[2] = T.if_then_else(count_clamp != 0, T.uint32(0x80008000), T.uint32(0))
    for j in T.unroll(layout.num_vectors):
        T.evaluate(T.call_extern('void', 'tk_track_gate_bits_bf16x8', T.address_of(gate[j, 0]),
                                 T.address_of(gate_bits[0]), T.address_of(gate_bits[1])))
        if count_clamp != 0:
            T.evaluate(T.call_extern('void', 'tk_track_reach_bf16x8', T.address_of(gate[j, 0]),
                                     T.address_of(up[j, 0]), T.address_of(gate_bits[2])))
        else:
            T.evaluate(T.call_extern('void', 'tk_track_magnitude_bf16x8', T.address_of(up[j, 0]),
                                     T.address_of(gate_bits[2])))
    if warp_all('tk_gate_bits_in_table', gate_bits[0], gate_bits[1]):
        # silu(min(g, c)) of every gate from the table (the test keeps every offset inside it), then the exact
        # path's products, without the up clamp's two FMNMX an element where the step shows it is an identity.
        if warp_all('tk_up_clamp_is_identity', gate_bits[2], clamp_c):
            table_step(layout, gate, up, act, up_wide, silu_table, step_weight, clamp_c, False)
        else:
            table_step(layout, gate, up, act, up_wide, silu_table, step_weight, clamp_c, True)
    else:
        # A gate outside the window (zero, tiny, large, inf, NaN: rare).
        exact_swiglu(layout, gate, up, act, step_weight, clamp_c)


@T.macro
def float_swiglu(layout, x, gate, up, act, gate_wide, up_wide, reach, div_range, gate_clamped, step_weight, count_clamp,
                 lane, row_vectors, row: T.Ref, block: T.Ref, clamp_c: T.Ref):
    """fp32: act of the step with the branch-free division (tk_div_rn_fast), so that its 16 elements overlap, under
    one range test of the step's clamped gates; outside the range (a zero, tiny or large gate, inf, NaN: rare) the
    step again with IEEE division, from x read again (in cache) rather than loaded vectors kept live. Tracks the
    largest gate and |up| for the clamp counts (two FMNMX an element; fmaxf skips NaN, which no count includes)."""
    for j in T.unroll(layout.num_vectors):
        for e in T.vectorized(layout.epv):
            gate_wide[e] = T.Cast(T.float32, gate[j, e])
        for e in T.vectorized(layout.epv):
            up_wide[e] = T.Cast(T.float32, up[j, e])
        for e in T.unroll(layout.epv):
            l = gate_wide[e]
            r = up_wide[e]
            if count_clamp != 0:
                reach[0] = T.max(reach[0], l)
                reach[1] = T.max(reach[1], T.abs(r))
            gate_clamped[0] = clamp_gate(l, clamp_c)
            track_division_range(div_range, gate_clamped[0])
            act[j, e] = clamped_swiglu_fast(gate_clamped[0], r, clamp_c) * step_weight[0]
    fast_ok = T.call_extern('int32', 'tk_div_fast_in_range', div_range[0], div_range[1]) != 0
    if not fast_ok:
        load_from_x(layout, x, gate, up, row, block, lane, row_vectors)
        exact_swiglu(layout, gate, up, act, step_weight, clamp_c)


def max_tree(values):
    """The largest of `values` (float32 expressions) as a balanced tree of max: a dependency chain log2(n) long, not
    n, between the step's last product and the block's shuffles. max (fmaxf) skips NaN and is exact, so the order
    does not change the result: the largest non-NaN value, or NaN only if every value is NaN."""
    while len(values) > 1:
        values = [T.max(values[i], values[i + 1]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def step_abs_max(layout, act, row_vectors):
    """max |act| over the step as one max_tree; per_row without the filler past the row's end (its act is 0 for
    c >= 0, not for a negative c), as 0, which no |act| is below."""
    def vector_max(j):
        return max_tree([T.abs(act[j, e]) for e in range(layout.epv)])
    if not layout.per_row:
        return max_tree([vector_max(j) for j in range(layout.num_vectors)])
    return max_tree([T.if_then_else(vector_in_row(layout, j, row_vectors), vector_max(j), T.float32(0))
                     for j in range(layout.num_vectors)])


@T.macro
def count_vector(layout, gate, up, counts, clamp_c, clamp_pair, j):
    """The exact clamp counts of vector j (bf16 words: by pairs against clamp_pair, tk_count_clamped_bf16x8)."""
    if layout.words:
        T.evaluate(T.call_extern('void', 'tk_count_clamped_bf16x8', T.address_of(gate[j, 0]), T.address_of(up[j, 0]),
                                 clamp_pair, T.address_of(counts[0])))
    else:
        for e in T.unroll(layout.epv):
            l = T.Cast(T.float32, gate[j, e])
            r = T.Cast(T.float32, up[j, e])
            counts[0] = counts[0] + T.Cast(T.int32, l > clamp_c)
            counts[1] = counts[1] + T.Cast(T.int32, r > clamp_c)
            counts[2] = counts[2] + T.Cast(T.int32, r < -clamp_c)


# Only a step that reaches the clamp is counted exactly, from its vectors read again: keeping the loaded ones for
# this rare case would hold 32 registers through the element loop. Staged, from the thread's own slots of the stage,
# which the next step's copy overwrites only in the next iteration (from x, the recounting thread would wait for a
# load of its own, and per row its whole CTA with it at the amax's barrier).
@T.macro
def recount_staged(layout, t, staged, gate, up, counts, gate_bits, row_vectors, tid, clamp_c: T.Ref, clamp_pair: T.Ref):
    reach_exceeds = T.call_extern('int32', 'tk_reach_exceeds', gate_bits[2], clamp_c) != 0
    if reach_exceeds:
        unstage_step(layout, staged.stage, gate, up, (t + 1) & 1, row_vectors, tid)
        for j in T.unroll(layout.num_vectors):
            if in_step(layout, j, row_vectors):  # (not the filler past a row's end)
                count_vector(layout, gate, up, counts, clamp_c, clamp_pair, j)


@T.macro
def recount_loaded(layout, x, gate, up, counts, reach, lane, row_vectors, row: T.Ref, block: T.Ref, clamp_c: T.Ref):
    reach_exceeds = T.Or(reach[0] > clamp_c, reach[1] > clamp_c)
    if reach_exceeds:
        load_from_x(layout, x, gate, up, row, block, lane, row_vectors)
        for j in T.unroll(layout.num_vectors):
            if in_step(layout, j, row_vectors):  # (not the filler past a row's end)
                count_vector(layout, gate, up, counts, clamp_c, None, j)


@T.macro
def reduce_amax(layout, amax, row_partials, tid, tpr_log2, t):
    """The block's amax in every lane of it. Flat: a butterfly over the block's adjacent lanes (every lane takes
    part: a skipped or missing row is a whole number of blocks, all with amax 0). per_row: rows of a warp or more by
    warp reductions (swiglu_row_max.cuh), narrower rows by a butterfly over their lanes; uniform branches."""
    if layout.per_row:
        if tpr_log2 >= 5:
            amax[0] = T.call_extern('float32', 'tk_row_max_wide', T.address_of(row_partials[0]), amax[0], tid, tpr_log2, t & 1)
        else:
            for s in T.unroll(4):
                if s < tpr_log2:
                    amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
    else:
        for s in T.unroll(LANES_LOG2):
            amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))


@T.macro
def store_step(layout, out, out_sf, act, amax, sf, multiplier, quantized, packed, sf_floor, round_sf, blocks_per_row,
               num_sf_blocks, num_sf_words, lane, row_vectors, row: T.Ref, block: T.Ref):
    """The step's scale factor and its e4m3 codes: products first, then the casts as a vectorised loop (one F2FP,
    satfinite and round to nearest even as the scalar cast, converts a pair)."""
    block_scale(amax[0], sf_floor, E4M3_MAX, round_sf, packed, sf, multiplier, 0)
    if lane == 0:
        store_token_sf(out_sf, packed, T.Cast(T.int64, row), block, sf[0], block + 1 == blocks_per_row, num_sf_blocks,
                       num_sf_words)
    for j in T.unroll(layout.num_vectors):
        for e in T.unroll(layout.epv):
            act[j, e] = act[j, e] * multiplier[0]
        for e in T.vectorized(layout.epv):
            quantized[e] = T.Cast(T.float8_e4m3fn, act[j, e])
        if in_step(layout, j, row_vectors):
            for e in T.vectorized(layout.epv):
                out[T.Cast(T.int64, row), vector_col(layout, j, block, lane, row_vectors) + e] = quantized[e]


@T.macro
def count_into(layout, counts, clamped_count, red_counts, tid):
    """Adds the threads' int32 clamp counts to the int64 counters: warp sums, then one atomic per CTA and counter.
    Integer sums, so the result does not depend on the grid size."""
    for c in T.unroll(3):
        for s in T.unroll(5):
            counts[c] = counts[c] + T.shfl_xor(counts[c], 16 >> s)
    if tid % 32 == 0:
        for c in T.unroll(3):
            red_counts[tid // 32, c] = counts[c]
    T.sync_threads()
    if tid < 3:
        total = T.alloc_var(T.int64)
        total = T.int64(0)
        for w in T.unroll(layout.num_warps):
            total = total + T.Cast(T.int64, red_counts[w, tid])
        if total != 0:
            T.atomic_add(clamped_count[tid], total)
