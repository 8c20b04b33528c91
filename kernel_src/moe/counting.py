"""Histograms of expert (or group) indices: moe.group_count and moe.aux_fi.

Each block of a grid-stride loop counts its tokens into a shared-memory histogram, then adds it to the
global one with integer atomics, so the counts do not depend on the number of blocks or their order.
In aux_fi the block that finishes last (a ticket counter after the counts) turns the counts into
f_e = count_e * E / (T * num_aux_topk), one rounding per expert, so the op is one launch. (Upstream
adds per-block fractions with float atomics, so its result depends on the block order; this one does
not.) Indices of -1 are padding and skipped; an index past the last
expert fails a device assert. The top-k, the number of experts (up to MAX_BINS) and the block count are
run-time arguments: one binary serves every model and every GPU size.
"""

from tilelang import language as T
from tvm import tirx  # after tilelang, which puts its bundled tvm on the path

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.moe.common import INDEX_DTYPE_PARAMS, check_index_dtype, index_dtype_specs

THREADS = 128
MAX_BINS = 1024
UNROLLED = 16  # indices per row loaded together; covers the top-k of every model in kernel_src/models.py


@T.macro
def _count_into(indices, counts, num_bins, num_tokens, num_topk, num_blocks, pid):
    """Grid-stride histogram of indices[:, :num_topk] into the global int32 `counts` (zeroed by the op).
    A thread's first UNROLLED indices of a row are loaded together (predicated), the rest in a loop."""
    tid = T.get_thread_binding()
    local = T.alloc_shared((MAX_BINS,), T.int32)
    row_indices = T.alloc_local((UNROLLED,), T.int32)
    for i in T.serial(T.ceildiv(num_bins, THREADS)):
        if i * THREADS + tid < num_bins:
            local[i * THREADS + tid] = 0
    T.sync_threads()
    for step in T.serial(T.ceildiv(num_tokens, num_blocks * THREADS)):
        row = (step * num_blocks + pid) * THREADS + tid
        if row < num_tokens:
            for k in T.unroll(UNROLLED):
                row_indices[k] = T.if_then_else(k < num_topk, T.Cast('int32', indices[row, T.min(k, num_topk - 1)]), -1)
            for k in T.unroll(UNROLLED):
                T.call_intrin('void', tirx.op.Op.get('tl.device_assert'), row_indices[k] < num_bins)
                if row_indices[k] >= 0 and row_indices[k] < num_bins:
                    T.atomic_add(local[row_indices[k]], 1)
            for k in T.serial(T.max(num_topk - UNROLLED, 0)):
                index = T.Cast('int32', indices[row, UNROLLED + k])
                T.call_intrin('void', tirx.op.Op.get('tl.device_assert'), index < num_bins)
                if index >= 0 and index < num_bins:
                    T.atomic_add(local[index], 1)
    T.sync_threads()
    for i in T.serial(T.ceildiv(num_bins, THREADS)):
        b = i * THREADS + tid
        if b < num_bins and local[b] > 0:
            T.atomic_add(counts[b], local[b])


def build_group_count(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk = T.dynamic('num_tokens'), T.dynamic('num_topk')
    row_stride, num_groups = T.dynamic('row_stride'), T.dynamic('num_bins')

    @T.prim_func
    def group_count(
        group_idx: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        out: T.Tensor[(num_groups,), T.int32],
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS) as pid:
            _count_into(group_idx, out, num_groups, num_tokens, num_topk, num_blocks, pid)

    return KernelProgram(group_count, alignment={'group_idx': 4, 'out': 4})


def build_aux_fi(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk = T.dynamic('num_tokens'), T.dynamic('num_topk')
    row_stride, num_experts = T.dynamic('row_stride'), T.dynamic('num_bins')
    num_slots = T.dynamic('num_slots')  # num_experts counts, then the ticket of finished blocks

    @T.prim_func
    def aux_fi(
        topk_idx: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        counts: T.Tensor[(num_slots,), T.int32],
        out: T.Tensor[(num_experts,), T.float32],
        num_aux_topk: T.int32,
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS) as pid:
            tid = T.get_thread_binding()
            last = T.alloc_shared((1,), T.int32)
            _count_into(topk_idx, counts, num_experts, num_tokens, num_topk, num_blocks, pid)
            # The block that finishes last turns the counts into fractions: a fence makes this block's
            # count atomics visible before its ticket, and the last ticket sees every block's.
            T.call_extern('void', '__threadfence')
            T.sync_threads()
            if tid == 0:
                last[0] = T.if_then_else(T.atomic_add(counts[num_experts], 1, return_prev=True) == num_blocks - 1, 1, 0)
            T.sync_threads()
            if last[0] == 1:
                T.call_extern('void', '__threadfence')
                for i in T.serial(T.ceildiv(num_experts, THREADS)):
                    e = i * THREADS + tid
                    if e < num_experts:
                        # Read through the atomic unit (L2): this block's L1 may not have seen other blocks' adds.
                        count = T.atomic_add(counts[e], 0, return_prev=True)
                        # The integer product is exact; each float conversion and the division round once.
                        out[e] = T.Cast('float32', T.Cast('int64', count) * num_experts) / T.Cast('float32', T.Cast('int64', num_tokens) * num_aux_topk)

    return KernelProgram(aux_fi, alignment={'topk_idx': 4, 'counts': 4, 'out': 4})


PASS_CONFIGS = {'tl.disable_warp_specialized': True}

GROUP_COUNT = KernelDecl('moe.group_count', INDEX_DTYPE_PARAMS, build_group_count, index_dtype_specs, check_index_dtype, PASS_CONFIGS)
AUX_FI = KernelDecl('moe.aux_fi', INDEX_DTYPE_PARAMS, build_aux_fi, index_dtype_specs, check_index_dtype, PASS_CONFIGS)
