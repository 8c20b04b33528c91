"""moe.get_fused_mapping: the expert-major "fused" layout of a routing, in one cooperative kernel.

Expert e owns the positions [start_e, start_e + align(count_e, alignment)) of the fused buffer, experts
in index order; a (token, k) pair routed to e gets a position in e's segment, padding positions get -1
in pos_to_expert / pos_to_token / pos_to_token_topk, and a pair with a negative index gets -1 in
token_topk_to_pos.

Within a segment the pairs are placed in ascending flat order i = t * num_topk + k (a stable counting
sort), so every output is a function of topk_idx alone: it does not depend on the block count, the GPU
or the run. (Upstream's order depends on its SM count; its tests check structure only, which this
layout satisfies too.)

Each warp of the grid owns one contiguous, 32-aligned chunk of the flat pairs, in block-major order.
  1. Every block counts its warps' pairs per expert into per-warp shared histograms; each block's totals
     go to the `block_counts` scratch (one row per block), then the grid syncs.
  2. Every block reads all rows of `block_counts` (ROWS_IN_FLIGHT rows in flight per thread, unconditional
     loads): an expert's total and the count of the blocks before it. A block-wide scan of the aligned
     totals gives the segment starts; block 0 writes expert_start / expert_end / num_tokens_per_expert.
     Each warp's base in each segment is start + earlier blocks + earlier warps of this block. The grid
     writes -1 to the positions no pair will take (each segment's padding, and the buffer past the last
     segment), one warp per expert; upstream fills the whole buffer with -1 first, three times the stores.
  3. Each warp walks its chunk in order, 32 pairs at a time: __match_any_sync groups the lanes with
     the same expert, a lane's rank in its group is the popcount of the lower lanes in it, and the
     group's highest lane moves the warp's base past the group.

The number of experts (up to MAX_EXPERTS), the top-k, the alignment and the block count are run-time
arguments; the only specialisation is the index dtype.

Co-residency: the kernel uses THREADS threads and about 41 KB of shared memory per block, so at
least one block fits on every SM of sm_90 / sm_100 (228 KB of shared
memory and 2048 threads per SM). The op therefore launches at most one block per SM; the loader
checks the occupancy query too and refuses a grid that cannot be co-resident.
"""

from tilelang import language as T

from kernel_src.bounds import device_assert, index_as_int32
from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.moe.common import INDEX_DTYPE_PARAMS, check_index_dtype, index_dtype_specs

THREADS = 256
WARPS = THREADS // 32
MAX_EXPERTS = 1024
SLOTS = MAX_EXPERTS // THREADS  # experts per thread in the per-expert phases
ROWS_IN_FLIGHT = 32  # rows of block_counts each thread has loading at once in phase 2 (one L2 round trip per 32 blocks)
BATCH = 8  # rounds of 32 pairs a warp loads at once in phases 1 and 3


def _pair_expert(topk_idx, i, t, valid, num_tokens, num_topk, num_experts):
    """The expert of flat pair i (token t) as int32 in [-1, num_experts], or -1 where not `valid`; the load is
    predicated."""
    return T.if_then_else(valid, index_as_int32(topk_idx[T.min(t, num_tokens - 1), T.max(i - t * num_topk, 0)], num_experts), -1)


def build(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk = T.dynamic('num_tokens'), T.dynamic('num_topk')
    row_stride = T.dynamic('row_stride')
    num_expanded = T.dynamic('num_expanded_tokens')
    num_experts = T.dynamic('num_experts')
    num_blocks = T.dynamic('num_blocks')

    @T.macro
    def load_batch(topk_idx, experts, first, r, lane, chunk, numel):
        """experts[u]: the expert of the lane's pair in round r * BATCH + u of its warp's chunk (-1 past the
        chunk or the pairs). All BATCH loads are issued before any is used, so they are in flight together."""
        pair = T.alloc_var(T.int32)  # variables, not expressions: the index arithmetic stays 32-bit
        token = T.alloc_var(T.int32)
        for u in T.unroll(BATCH):
            pair = first + (r * BATCH + u) * 32 + lane
            token = T.truncdiv(pair, num_topk)
            experts[u] = _pair_expert(topk_idx, pair, token, T.And(pair < numel, (r * BATCH + u) * 32 < chunk), num_tokens, num_topk, num_experts)

    @T.prim_func
    def get_fused_mapping(
        topk_idx: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        pos_to_expert: T.Tensor[(num_expanded,), T.int32],
        pos_to_token: T.Tensor[(num_expanded,), T.int32],
        pos_to_token_topk: T.Tensor[(num_expanded,), T.int32],
        token_topk_to_pos: T.Tensor[(num_tokens, num_topk), T.int32],
        expert_start: T.Tensor[(num_experts,), T.int32],
        expert_end: T.Tensor[(num_experts,), T.int32],
        num_tokens_per_expert: T.Tensor[(num_experts,), T.int32],
        block_counts: T.Tensor[(num_blocks, num_experts), T.int32],  # scratch, one row per block: sets the grid
        alignment: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS) as bid:
            tid = T.get_thread_binding()
            warp = tid // 32
            lane = tid % 32
            # warp_hist[w, e]: first the count of warp w's pairs routed to e, then warp w's next position in e.
            warp_hist = T.alloc_shared((WARPS, MAX_EXPERTS), T.int32)
            seg = T.alloc_shared((MAX_EXPERTS,), T.int32)  # aligned counts, then segment starts
            padding_from = T.alloc_shared((MAX_EXPERTS,), T.int32)  # start + count: the first padding position
            warp_sums = T.alloc_shared((WARPS,), T.int32)
            total = T.alloc_local((SLOTS,), T.int32)
            before = T.alloc_local((SLOTS,), T.int32)
            aligned = T.alloc_local((SLOTS,), T.int32)
            mine = T.alloc_local((SLOTS,), T.int32)
            rows = T.alloc_local((ROWS_IN_FLIGHT,), T.int32)
            experts = T.alloc_local((BATCH,), T.int32)
            numel = T.alloc_var(T.int32)
            numel = num_tokens * num_topk
            # Chunks are whole multiples of 32 pairs, so every lane of a warp runs the same iterations
            # (__match_any_sync needs all 32) and lanes past the end just carry expert -1.
            # (truncdiv: every operand is non-negative, and it spares the floor-division sign fix-ups.)
            chunk = T.alloc_var(T.int32)
            chunk = T.truncdiv(T.truncdiv(numel + num_blocks * WARPS - 1, num_blocks * WARPS) + 31, 32) * 32
            first = T.alloc_var(T.int32)
            first = (bid * WARPS + warp) * chunk
            i = T.alloc_var(T.int32)
            t = T.alloc_var(T.int32)
            e = T.alloc_var(T.int32)

            for j in T.serial(T.truncdiv(num_experts + 31, 32)):
                if j * 32 + lane < num_experts:
                    warp_hist[warp, j * 32 + lane] = 0
            T.sync_warp()

            # 1. Per-warp histograms, then the block's totals. A warp loads BATCH rounds of its pairs at
            # once (BATCH loads in flight per lane, not one round trip per 32 pairs), then counts them.
            for r in T.serial(T.truncdiv(T.truncdiv(chunk, 32) + BATCH - 1, BATCH)):
                load_batch(topk_idx, experts, first, r, lane, chunk, numel)
                for u in T.unroll(BATCH):
                    device_assert(experts[u] < num_experts)
                    if experts[u] >= 0 and experts[u] < num_experts:
                        T.atomic_add(warp_hist[warp, experts[u]], 1)
            T.sync_threads()
            for s in T.unroll(SLOTS):
                e = s * THREADS + tid
                if e < num_experts:
                    acc = T.alloc_var(T.int32)
                    acc = 0
                    for w in T.unroll(WARPS):
                        acc = acc + warp_hist[w, e]
                    block_counts[bid, e] = acc
            T.sync_grid()

            # 2. Totals and the counts of earlier blocks, then the segment starts. Every block reads every
            # row: the loads are unconditional (clamped indices, masked values), so ROWS_IN_FLIGHT of them
            # are outstanding at once instead of one round trip to L2 per row.
            for s in T.unroll(SLOTS):
                total[s] = 0
                before[s] = 0
                if s * THREADS < num_experts:  # uniform across the block
                    for b0 in T.serial(T.truncdiv(num_blocks + ROWS_IN_FLIGHT - 1, ROWS_IN_FLIGHT)):
                        for u in T.unroll(ROWS_IN_FLIGHT):
                            rows[u] = block_counts[T.min(b0 * ROWS_IN_FLIGHT + u, num_blocks - 1), T.min(s * THREADS + tid, num_experts - 1)]
                        for u in T.unroll(ROWS_IN_FLIGHT):
                            c = T.if_then_else(b0 * ROWS_IN_FLIGHT + u < num_blocks, rows[u], 0)
                            total[s] = total[s] + c
                            before[s] = before[s] + T.if_then_else(b0 * ROWS_IN_FLIGHT + u < bid, c, 0)
            for s in T.unroll(SLOTS):
                e = s * THREADS + tid
                aligned[s] = T.truncdiv(total[s] + alignment - 1, alignment) * alignment
                seg[e] = T.if_then_else(e < num_experts, aligned[s], 0)
            T.sync_threads()
            # Exclusive scan of seg: thread t owns seg[SLOTS*t : SLOTS*t + SLOTS].
            run = T.alloc_var(T.int32)
            run = 0
            for s in T.unroll(SLOTS):
                mine[s] = run
                run = run + seg[tid * SLOTS + s]
            inclusive = T.alloc_var(T.int32)
            inclusive = run
            for d in T.unroll(5):
                up = T.shfl_up(inclusive, 1 << d)
                if lane >= (1 << d):
                    inclusive = inclusive + up
            if lane == 31:
                warp_sums[warp] = inclusive
            T.sync_threads()
            offset = T.alloc_var(T.int32)
            offset = inclusive - run
            used = T.alloc_var(T.int32)  # positions the segments take, padding included
            used = 0
            for w in T.unroll(WARPS):
                offset = offset + T.if_then_else(w < warp, warp_sums[w], 0)
                used = used + warp_sums[w]
            if bid == 0 and tid == 0:
                device_assert(used <= num_expanded)  # num_expanded_tokens too small for this routing
            T.sync_threads()  # everyone has read seg before it is overwritten
            for s in T.unroll(SLOTS):
                seg[tid * SLOTS + s] = offset + mine[s]
            T.sync_threads()
            for s in T.unroll(SLOTS):
                e = s * THREADS + tid
                if e < num_experts:
                    start = seg[e]
                    padding_from[e] = start + total[s]
                    if bid == 0:
                        expert_start[e] = start
                        expert_end[e] = start + aligned[s]
                        num_tokens_per_expert[e] = aligned[s]
                    base = T.alloc_var(T.int32)
                    base = start + before[s]
                    for w in T.unroll(WARPS):
                        c = warp_hist[w, e]
                        warp_hist[w, e] = base
                        base = base + c
            T.sync_threads()

            # -1 at the positions no pair takes: each segment's padding (one warp of the grid per expert)
            # and the buffer past the last segment. Placement never writes these, so there is no race.
            for k in T.serial(T.truncdiv(num_experts + num_blocks * WARPS - 1 - (bid * WARPS + warp), num_blocks * WARPS)):
                x = bid * WARPS + warp + k * num_blocks * WARPS
                padding_end = T.if_then_else(x + 1 < num_experts, seg[T.min(x + 1, num_experts - 1)], used)
                for p in T.serial(padding_from[x] + lane, T.min(padding_end, num_expanded), 32):
                    pos_to_expert[p] = -1
                    pos_to_token[p] = -1
                    pos_to_token_topk[p] = -1
            for k in T.serial(T.truncdiv(T.max(num_expanded - used + num_blocks * THREADS - 1 - (bid * THREADS + tid), 0), num_blocks * THREADS)):
                p = used + bid * THREADS + tid + k * num_blocks * THREADS
                pos_to_expert[p] = -1
                pos_to_token[p] = -1
                pos_to_token_topk[p] = -1

            # 3. Placement, in flat order within each warp's chunk, BATCH rounds loaded at a time.
            for r in T.serial(T.truncdiv(T.truncdiv(chunk, 32) + BATCH - 1, BATCH)):
                load_batch(topk_idx, experts, first, r, lane, chunk, numel)
                for u in T.unroll(BATCH):
                    i = first + (r * BATCH + u) * 32 + lane
                    t = T.truncdiv(i, num_topk)
                    e = T.if_then_else(experts[u] < num_experts, experts[u], -1)  # a bad index was reported in phase 1
                    group = T.call_extern('uint32', '__match_any_sync', T.uint32(0xFFFFFFFF), e)
                    rank = T.popcount(group & ((T.uint32(1) << T.Cast('uint32', lane)) - T.uint32(1)))
                    pos = T.alloc_var(T.int32)
                    pos = -1
                    if e >= 0:
                        pos = warp_hist[warp, e] + T.Cast('int32', rank)
                    T.sync_warp()  # every lane of the group has read the base before the last one moves it
                    if e >= 0:
                        if (group >> T.Cast('uint32', lane)) == T.uint32(1):
                            warp_hist[warp, e] = pos + 1
                        if pos < num_expanded:  # else the assert above has fired
                            pos_to_expert[pos] = e
                            pos_to_token[pos] = t
                            pos_to_token_topk[pos] = i
                        else:
                            pos = -1
                    if i < numel and (r * BATCH + u) * 32 < chunk:
                        token_topk_to_pos[t, i - t * num_topk] = pos
                    T.sync_warp()

    return KernelProgram(get_fused_mapping, alignment={
        'topk_idx': 4, 'pos_to_expert': 4, 'pos_to_token': 4, 'pos_to_token_topk': 4, 'token_topk_to_pos': 4,
        'expert_start': 4, 'expert_end': 4, 'num_tokens_per_expert': 4, 'block_counts': 4})


DECL = KernelDecl(
    'moe.get_fused_mapping', INDEX_DTYPE_PARAMS, build, index_dtype_specs, check_index_dtype,
    # The barriers are placed by hand: tilelang's automatic ones would land inside per-expert branches.
    {'tl.disable_warp_specialized': True, 'tl.disable_thread_storage_sync': True},
    constants={'max_experts': MAX_EXPERTS},  # the per-expert arrays in shared memory
)
