"""Histograms of expert (or group) indices: moe.group_count and moe.aux_fi.

Each block of a grid-stride loop counts its tokens into a shared-memory histogram, then adds it to the
global one with integer atomics, so the counts do not depend on the number of blocks or their order.
aux_fi needs the whole count before it can divide, without a second launch or a fence-and-ticket
round trip: each block adds `(1 << 32) + its count` to a 64-bit slot per expert and gets the slot's
previous value back. The block whose add comes last on that slot sees `num_blocks - 1` arrivals in
the high half and every other block's count in the low half, and writes
f_e = count_e * E / (T * num_aux_topk) itself, one rounding per expert. A grid of one block (up to
rows_per_block tokens: decode) has the whole count alone and writes its outputs with plain stores, so the
op zeroes nothing for it (group_count's output comes from torch.empty, aux_fi's slots go unused).
(Upstream adds per-block fractions with float atomics, so its result depends on the block order; this
one does not.) Negative indices are padding and skipped; an index past the last bin fails a device
trap and is not counted (kernel_src/bounds.py). The top-k, the number
of experts (up to MAX_BINS) and the block count are run-time arguments: one binary serves every model
and every GPU size.
"""

from tilelang import language as T
from tvm import tirx  # after tilelang, which puts its bundled tvm on the path

from kernel_src.bounds import TRAP_PRELUDE, all_below, all_of, below, counted, device_trap
from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.moe.common import INDEX_DTYPE_PARAMS, check_index_dtype, index_dtype_specs

THREADS = 128
MAX_BINS = 1024
UNROLLED = 16  # indices per row loaded together; covers the top-k of every model in kernel_src/models.py


@T.macro
def _count_in_shared(indices, local, in_range, num_bins, num_tokens, num_topk, num_blocks, pid):
    """Grid-stride histogram of indices[:, :num_topk] into this block's shared `local` (num_bins used);
    in_range[0] turns False at an index past the last bin.

    A block takes THREADS rows a step and reads their THREADS * num_topk indices in row-major order:
    element j * THREADS + tid goes to thread tid, so a warp's load covers 32 consecutive indices (2-3
    cache lines, where one row per lane touched 16-32 and fetched each sector up to 4 times). Each
    thread still loads num_topk indices, the first
    UNROLLED together (predicated), the rest in a loop. Its (row, k) advances by divmod(THREADS, num_topk)
    per element, with one carry, so there is no division per index."""
    tid = T.get_thread_binding()
    loaded = T.alloc_local((UNROLLED,), indices.dtype)
    row = T.alloc_var(T.int32)
    k = T.alloc_var(T.int32)
    # Divisions once, in registers (as expressions nvcc would redo them at every unrolled step).
    rows_per_pass = T.alloc_var(T.int32)
    ks_per_pass = T.alloc_var(T.int32)
    row_in_step = T.alloc_var(T.int32)
    first_k = T.alloc_var(T.int32)
    rows_per_pass = T.truncdiv(THREADS, T.max(num_topk, 1))  # aux_fi may get [T, 0]: then nothing is loaded
    ks_per_pass = THREADS - rows_per_pass * num_topk
    row_in_step = T.truncdiv(tid, T.max(num_topk, 1))
    first_k = tid - row_in_step * num_topk
    for i in T.serial(T.ceildiv(num_bins, THREADS)):
        if i * THREADS + tid < num_bins:
            local[i * THREADS + tid] = 0
    T.sync_threads()
    for step in T.serial(T.ceildiv(num_tokens, num_blocks * THREADS)):
        row = (step * num_blocks + pid) * THREADS + row_in_step
        k = first_k
        for j in T.unroll(UNROLLED):
            loaded[j] = T.Cast(indices.dtype, -1)
            if j < num_topk:  # uniform: a small top-k skips the rest of the unrolled steps
                loaded[j] = T.if_then_else(row < num_tokens, indices[row, k], T.Cast(indices.dtype, -1))
                row = row + rows_per_pass + T.if_then_else(k + ks_per_pass >= num_topk, 1, 0)
                k = T.if_then_else(k + ks_per_pass >= num_topk, k + ks_per_pass - num_topk, k + ks_per_pass)
        # Checked once all the loads are issued (a compare next to its load would wait for it there), each in the
        # index's own width: one compare for the trap, one unsigned compare for the mask.
        in_range[0] = all_of(in_range[0], all_below(loaded, UNROLLED, num_bins))
        for j in T.unroll(UNROLLED):
            if counted(loaded[j], num_bins):
                T.atomic_add(local[T.Cast('int32', loaded[j])], 1)
        for j in T.serial(T.max(num_topk - UNROLLED, 0)):
            index = T.if_then_else(row < num_tokens, indices[row, k], T.Cast(indices.dtype, -1))
            in_range[0] = all_of(in_range[0], below(index, num_bins))
            if counted(index, num_bins):
                T.atomic_add(local[T.Cast('int32', index)], 1)
            row = row + rows_per_pass + T.if_then_else(k + ks_per_pass >= num_topk, 1, 0)
            k = T.if_then_else(k + ks_per_pass >= num_topk, k + ks_per_pass - num_topk, k + ks_per_pass)
    T.sync_threads()


def _wait_for_the_kernel_before():
    """cudaGridDependencySynchronize: wait for the kernel before this one on the stream to finish.

    The kernels are launched with programmatic stream serialization (PDL; the manifest records it from
    this call), so they may start while the kernel before them is still finishing. A grid of several blocks
    follows the op's torch.zeros of the global counts: it counts its indices meanwhile and only the global
    atomics wait. The indices are safe to read before the wait: the zero fill was launched without PDL, so
    whatever wrote the indices had completed before it started, and this kernel cannot start before every
    block of the fill has run. A grid of one block follows no fill, so it waits before it reads anything."""
    return T.call_intrin('void', tirx.op.Op.get('tl.pdl_sync'))


def build_group_count(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk = T.dynamic('num_tokens'), T.dynamic('num_topk')
    row_stride, num_groups = T.dynamic('row_stride'), T.dynamic('num_bins')

    @T.prim_func
    def group_count(
        group_idx: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        out: T.Tensor[(num_groups,), T.int32],
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS, prelude=TRAP_PRELUDE) as pid:
            tid = T.get_thread_binding()
            local = T.alloc_shared((MAX_BINS,), T.int32)
            in_range = T.alloc_local((1,), T.bool)
            in_range[0] = True
            if num_blocks == 1:
                _wait_for_the_kernel_before()
            _count_in_shared(group_idx, local, in_range, num_groups, num_tokens, num_topk, num_blocks, pid)
            if num_blocks == 1:
                for i in T.serial(T.ceildiv(num_groups, THREADS)):
                    b = i * THREADS + tid
                    if b < num_groups:
                        out[b] = local[b]  # the whole count: `out` is not zeroed
            else:
                _wait_for_the_kernel_before()
                for i in T.serial(T.ceildiv(num_groups, THREADS)):
                    b = i * THREADS + tid
                    if b < num_groups and local[b] > 0:
                        T.atomic_add(out[b], local[b])  # `out` zeroed by the op
            device_trap(in_range[0])  # last, after the stores

    return KernelProgram(group_count, alignment={'group_idx': 4, 'out': 4})


def _global_fetch_add(buffer, index, value):
    """CUDA's 64-bit atomicAdd on a global int64 slot, returning the old value as uint64: one ATOMG.
    tilelang's atomic_add(return_prev=True) does not compile for int64 (its cuda::atomic_ref binds the
    slot as unsigned long long), and through atomic_ref it would be a generic ATOM with a shared/local
    fallback branch on its result."""
    pointer = T.call_extern('handle', '(unsigned long long *)', T.address_of(buffer[index]))
    return T.call_extern('uint64', 'atomicAdd', pointer, value)


ARRIVAL = 1 << 32  # one block's arrival in an aux_fi slot; the low half holds the count (< 2**32)


def build_aux_fi(arch: Arch, index_dtype: str) -> KernelProgram:
    num_tokens, num_topk = T.dynamic('num_tokens'), T.dynamic('num_topk')
    row_stride, num_experts = T.dynamic('row_stride'), T.dynamic('num_bins')

    @T.prim_func
    def aux_fi(
        topk_idx: T.StridedTensor[(num_tokens, num_topk), (row_stride, 1), index_dtype],
        slots: T.Tensor[(num_experts,), T.int64],  # per expert: blocks arrived << 32 | count
        out: T.Tensor[(num_experts,), T.float32],
        num_aux_topk: T.int32,
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=THREADS, prelude=TRAP_PRELUDE) as pid:
            tid = T.get_thread_binding()
            local = T.alloc_shared((MAX_BINS,), T.int32)
            in_range = T.alloc_local((1,), T.bool)
            in_range[0] = True
            if num_blocks == 1:
                _wait_for_the_kernel_before()
            _count_in_shared(topk_idx, local, in_range, num_experts, num_tokens, num_topk, num_blocks, pid)
            # The integer products are exact; each float conversion and the division round once.
            total = T.Cast('float32', T.Cast('int64', num_tokens) * num_aux_topk)
            if num_blocks == 1:
                for i in T.unroll(MAX_BINS // THREADS):
                    e = i * THREADS + tid
                    if e < num_experts:
                        out[e] = T.Cast('float32', T.Cast('int64', local[e]) * num_experts) / total  # slots unused
            else:
                _wait_for_the_kernel_before()
                # A thread's slot atomics are all issued before any result is used: one round trip.
                before = T.alloc_local((MAX_BINS // THREADS,), T.uint64)
                for i in T.unroll(MAX_BINS // THREADS):
                    if i * THREADS + tid < num_experts:
                        # Every block arrives at every slot, with a count of 0 too: the arrivals tell the last.
                        before[i] = _global_fetch_add(slots, i * THREADS + tid, T.Cast('uint64', local[i * THREADS + tid]) + T.uint64(ARRIVAL))
                for i in T.unroll(MAX_BINS // THREADS):
                    e = i * THREADS + tid
                    if e < num_experts and before[i] // T.uint64(ARRIVAL) == T.Cast('uint64', num_blocks - 1):
                        count = T.Cast('int64', before[i] % T.uint64(ARRIVAL)) + T.Cast('int64', local[e])
                        out[e] = T.Cast('float32', count * num_experts) / total
            device_trap(in_range[0])  # last, after the stores

    return KernelProgram(aux_fi, alignment={'topk_idx': 4, 'slots': 8, 'out': 4})


PASS_CONFIGS = {
    'tl.disable_warp_specialized': True,
    # Every index load is already guarded by row < num_tokens (k < num_topk by construction); tilelang's
    # own guard would add compares and a branch around each of them.
    'tl.disable_safe_memory_legalize': True,
}

# rows_per_block: the rows a block counts a step, which the op sizes the grid-stride grid by; max_bins: the
# histogram's bins in shared memory, the most groups (experts) the op may pass.
CONSTANTS = {'rows_per_block': THREADS, 'max_bins': MAX_BINS}
GROUP_COUNT = KernelDecl('moe.group_count', INDEX_DTYPE_PARAMS, build_group_count, index_dtype_specs, check_index_dtype, PASS_CONFIGS,
                         constants=CONSTANTS)
AUX_FI = KernelDecl('moe.aux_fi', INDEX_DTYPE_PARAMS, build_aux_fi, index_dtype_specs, check_index_dtype, PASS_CONFIGS, constants=CONSTANTS)
