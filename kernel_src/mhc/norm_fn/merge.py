"""mhc.fn_normw_merge_fwd and mhc.fn_normw_merge_bwd: fn (mhc3, width) times an RMS-norm weight normw (width,).

Forward: out[r, c] = fn[r, c] * normw[c]; a thread takes VEC columns of one row (grid: column blocks x rows).
Backward: fn_grad[r, c] += g[r, c] * normw[c] and normw_grad[c] += sum_r g[r, c] * fn[r, c], both accumulated
into the given buffers. A CTA takes BWD_COLUMNS_PER_BLOCK columns; ROW_GROUPS threads share each VEC of them, thread
group k taking rows k, k + ROW_GROUPS, ... in order, its part of the sum kept in a register from 0. The parts meet in
shared memory, and group 0 adds them in group order and adds that once to normw_grad. The order depends on the row
count alone, so the result does not depend on the grid. (One thread a column, with every row on it, leaves a width of
4 * 7168 with 7168 threads, each a chain of all the rows' loads; eight groups of three rows give 57344 threads in
224 CTAs.) The width is a run-time dim (a multiple of VEC);
one binary per mhc.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.mhc.norm_fn.common import MHC_PARAMS, check_mhc, mhc_specs, mix_count

VEC = 4  # float32 columns per thread: one 16-byte access
THREADS = 128
COLUMNS_PER_BLOCK = VEC * THREADS
BWD_COLUMN_THREADS = 32  # threads across a backward CTA's columns: 224 CTAs at a width of 4 * 7168, every SM busy
ROW_GROUPS = 8  # threads down a backward CTA's rows, per VEC columns: 3 rows each at mhc 4
BWD_COLUMNS_PER_BLOCK = VEC * BWD_COLUMN_THREADS


def build_fwd(arch: Arch, mhc: int) -> KernelProgram:
    rows = mix_count(mhc)
    width = T.dynamic('width')

    @T.prim_func
    def fn_normw_merge_fwd(
        fn: T.Tensor[(rows, width), T.float32],
        normw: T.Tensor[(width,), T.float32],
        out_fn: T.Tensor[(rows, width), T.float32],
    ):
        with T.Kernel(T.ceildiv(width, COLUMNS_PER_BLOCK), rows, threads=THREADS) as (pid, row):
            T.assume(width % VEC == 0)
            col = pid * COLUMNS_PER_BLOCK + T.get_thread_binding() * VEC
            if col < width:
                for v in T.vectorized(VEC):
                    out_fn[row, col + v] = fn[row, col + v] * normw[col + v]

    return KernelProgram(fn_normw_merge_fwd, alignment={'fn': 16, 'normw': 16, 'out_fn': 16})


def build_bwd(arch: Arch, mhc: int) -> KernelProgram:
    rows = mix_count(mhc)
    width = T.dynamic('width')

    @T.prim_func
    def fn_normw_merge_bwd(
        fn: T.Tensor[(rows, width), T.float32],
        normw: T.Tensor[(width,), T.float32],
        out_fn_grad: T.Tensor[(rows, width), T.float32],
        fn_grad: T.Tensor[(rows, width), T.float32],
        normw_grad: T.Tensor[(width,), T.float32],
    ):
        with T.Kernel(T.ceildiv(width, BWD_COLUMNS_PER_BLOCK), threads=BWD_COLUMN_THREADS * ROW_GROUPS) as pid:
            T.assume(width % VEC == 0)
            tid = T.get_thread_binding()
            group = tid // BWD_COLUMN_THREADS
            col = pid * BWD_COLUMNS_PER_BLOCK + (tid % BWD_COLUMN_THREADS) * VEC
            weight = T.alloc_local((VEC,), T.float32)
            total = T.alloc_local((VEC,), T.float32)
            grad = T.alloc_local((VEC,), T.float32)
            parts = T.alloc_shared((ROW_GROUPS, BWD_COLUMN_THREADS, VEC), T.float32)
            if col < width:
                for v in T.vectorized(VEC):
                    weight[v] = normw[col + v]
                for v in T.vectorized(VEC):
                    total[v] = T.float32(0)
                for i in T.unroll(-(-rows // ROW_GROUPS)):
                    if i * ROW_GROUPS + group < rows:
                        for v in T.vectorized(VEC):
                            grad[v] = out_fn_grad[i * ROW_GROUPS + group, col + v]
                        for v in T.vectorized(VEC):
                            fn_grad[i * ROW_GROUPS + group, col + v] = fn_grad[i * ROW_GROUPS + group, col + v] + grad[v] * weight[v]
                        for v in T.vectorized(VEC):
                            total[v] = total[v] + grad[v] * fn[i * ROW_GROUPS + group, col + v]
                for v in T.vectorized(VEC):
                    parts[group, tid % BWD_COLUMN_THREADS, v] = total[v]
            T.sync_threads()
            if group == 0 and col < width:
                for k in T.unroll(1, ROW_GROUPS):
                    for v in T.unroll(VEC):
                        total[v] = total[v] + parts[k, tid, v]
                for v in T.vectorized(VEC):
                    normw_grad[col + v] = normw_grad[col + v] + total[v]

    return KernelProgram(fn_normw_merge_bwd, alignment={'fn': 16, 'normw': 16, 'out_fn_grad': 16, 'fn_grad': 16, 'normw_grad': 16})


PASS_CONFIGS = {'tl.disable_warp_specialized': True}
CONSTANTS = {'column_multiple': VEC}  # the width must be a multiple of it (the op checks COLUMN_MULTIPLE, the same 4)
MERGE_FWD = KernelDecl('mhc.fn_normw_merge_fwd', MHC_PARAMS, build_fwd, mhc_specs, check_mhc, PASS_CONFIGS, constants=CONSTANTS)
MERGE_BWD = KernelDecl('mhc.fn_normw_merge_bwd', MHC_PARAMS, build_bwd, mhc_specs, check_mhc, PASS_CONFIGS, constants=CONSTANTS)
