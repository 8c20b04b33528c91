"""mhc.pre_norm_fn_fwd_mul and mhc.pre_norm_fn_bwd_mul: the TF32 GEMMs of the pre-norm.

Forward (split-K): x (T, width) bf16 times fn (mhc3, width) float32, already rounded to TF32 by the op. A CTA of
FWD_THREADS takes FWD_TOKENS tokens and split s of the n_splits (a run-time grid dim, the leading dim of the
partial buffers): the K blocks of FWD_STEP columns from floor(s * blocks / n_splits) to floor((s + 1) * blocks /
n_splits), so every split has its share and one with none writes zeros. Each step copies x's and fn's tiles to
shared memory (cp.async, one step ahead), converts x's to float32 registers in the MMA's A layout, adds the squares
to per-thread sums and runs m16n8k8 TF32 mma.sync against fn's tile of mhc3 rows, padded to whole 8-row MMA tiles
with zeros when mhc3 is not a multiple of 8 (mhc = 4 has 24 rows and no padding; a padded tile is filled by plain
loads, outside the cp.async pipeline). The CTA writes its (FWD_TOKENS, mhc3) products and the FWD_TOKENS sums of
squares to partial[s]. A bf16 value is exact in TF32, so only fn is rounded. Each warp owns 16 tokens and all the
product columns (GemmWarpPolicy.FullRow), so a CTA reads fn's tile once per FWD_TOKENS tokens. WGMMA is off, as upstream has it: with the accumulators in
registers, T.gemm then lowers to m16n8k8 mma.sync on both targets (HMMA.1688.F32.TF32 in the sm_90a and sm_100f
SASS alike).

Backward: one CTA per BWD_STEP columns of width loops over all tokens, BWD_TOKENS at a time, in order: with g
the products' gradient (T, MIX_COLUMNS), TF32-rounded and zero-padded by mhc.pre_norm_fn_bwd_norm, it adds
g @ fn + 2 * x * sqrsum_grad into x_grad (bf16, read, accumulated in float32 and written back) and accumulates
fn_grad = g^T @ x in registers, written once at the end. Every output element has one CTA and a fixed order
of additions, so both gradients are independent of the SM count.
"""

import tilelang
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.mhc.norm_fn.common import GEMM_PARAMS, MIX_COLUMNS, check_width, gemm_specs, mix_count

FWD_TOKENS = 64  # a warp per 16 tokens, each with all MIX_COLUMNS columns: fn's tile is read once per 64 tokens
FWD_STEP = 256  # columns of width per K step
FWD_THREADS = 128
BWD_TOKENS = 64
BWD_STEP = 128  # columns of width per CTA
BWD_THREADS = 256
# Two CTAs an SM (at most 128 registers a thread): the 4 * 7168 / BWD_STEP = 224 CTAs of the widest model run in one
# wave on 132 SMs and up, each SM with two CTAs' loads in flight.
BWD_CTAS_PER_SM = 2


def build_fwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    mhc3, width = mix_count(mhc), mhc * hidden
    columns = -(-mhc3 // 8) * 8  # product columns: whole 8-wide MMA tiles
    blocks = width // FWD_STEP
    num_tokens, n_splits = T.dynamic('num_tokens'), T.dynamic('n_splits')

    @T.prim_func
    def pre_norm_fn_fwd_mul(
        x: T.Tensor[(num_tokens, width), T.bfloat16],
        fn: T.Tensor[(mhc3, width), T.float32],
        partial_mul: T.Tensor[(n_splits, num_tokens, mhc3), T.float32],
        partial_sqrsum: T.Tensor[(n_splits, num_tokens), T.float32],
    ):
        with T.Kernel(T.ceildiv(num_tokens, FWD_TOKENS), n_splits, threads=FWD_THREADS) as (pid_t, pid_s):
            first = T.truncdiv(pid_s * blocks, n_splits)
            count = T.truncdiv((pid_s + 1) * blocks, n_splits) - first
            row0 = pid_t * FWD_TOKENS
            products = T.alloc_fragment((FWD_TOKENS, columns), T.float32)
            squares = T.alloc_fragment((FWD_TOKENS, 4), T.float32)
            T.clear(products)
            T.clear(squares)
            for step in T.Pipelined(count, num_stages=1):
                x_shared = T.alloc_shared((FWD_TOKENS, FWD_STEP), T.bfloat16)
                fn_shared = T.alloc_shared((columns, FWD_STEP), T.float32)
                x_local = T.alloc_fragment((FWD_TOKENS, FWD_STEP), T.float32)
                T.annotate_layout({x_shared: tilelang.layout.make_swizzled_layout(x_shared)})
                col0 = (first + step) * FWD_STEP
                T.copy(x[row0, col0], x_shared)
                if columns == mhc3:
                    T.copy(fn[0, col0], fn_shared)
                else:
                    for i, j in T.Parallel(columns, FWD_STEP):
                        fn_shared[i, j] = T.if_then_else(i < mhc3, fn[i, col0 + j], T.float32(0))
                T.copy(x_shared, x_local)
                for k in T.serial(FWD_STEP // 4):
                    for i, j in T.Parallel(FWD_TOKENS, 4):
                        squares[i, j] += x_local[i, k * 4 + j] * x_local[i, k * 4 + j]
                T.gemm(x_local, fn_shared, products, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
            row_squares = T.alloc_fragment((FWD_TOKENS,), T.float32)
            T.reduce_sum(squares, row_squares)
            for i in T.Parallel(FWD_TOKENS):
                if row0 + i < num_tokens:
                    partial_sqrsum[pid_s, row0 + i] = row_squares[i]
            for i, j in T.Parallel(FWD_TOKENS, columns):
                if j < mhc3 and row0 + i < num_tokens:
                    partial_mul[pid_s, row0 + i, j] = products[i, j]

    return KernelProgram(pre_norm_fn_fwd_mul, alignment={'x': 16, 'fn': 16, 'partial_mul': 8, 'partial_sqrsum': 4})


def build_bwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    mhc3, width = mix_count(mhc), mhc * hidden
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def pre_norm_fn_bwd_mul(
        mul_grad: T.Tensor[(num_tokens, MIX_COLUMNS), T.float32],
        sqrsum_grad: T.Tensor[(num_tokens,), T.float32],
        x: T.Tensor[(num_tokens, width), T.bfloat16],
        fn: T.Tensor[(mhc3, width), T.float32],
        x_grad: T.Tensor[(num_tokens, width), T.bfloat16],
        fn_grad: T.Tensor[(mhc3, width), T.float32],
    ):
        with T.Kernel(width // BWD_STEP, threads=BWD_THREADS) as pid:
            T.annotate_min_blocks_per_sm(BWD_CTAS_PER_SM)
            col0 = pid * BWD_STEP
            fn_shared = T.alloc_shared((MIX_COLUMNS, BWD_STEP), T.float32)
            for i, j in T.Parallel(MIX_COLUMNS, BWD_STEP):
                fn_shared[i, j] = T.if_then_else(i < mhc3, fn[i, col0 + j], T.float32(0))
            fn_grad_local = T.alloc_fragment((MIX_COLUMNS, BWD_STEP), T.float32)
            T.clear(fn_grad_local)
            for step in T.serial(T.ceildiv(num_tokens, BWD_TOKENS)):
                row0 = step * BWD_TOKENS
                x_shared = T.alloc_shared((BWD_TOKENS, BWD_STEP), T.float32)
                grad_shared = T.alloc_shared((BWD_TOKENS, MIX_COLUMNS), T.float32)
                x_grad_local = T.alloc_fragment((BWD_TOKENS, BWD_STEP), T.float32)
                square_grad = T.alloc_fragment((BWD_TOKENS,), T.float32)
                T.copy(x[row0, col0], x_shared)
                T.copy(mul_grad[row0, 0], grad_shared)
                T.copy(x_grad[row0, col0], x_grad_local)
                T.copy(sqrsum_grad[row0], square_grad)
                T.gemm(grad_shared, x_shared, fn_grad_local, transpose_A=True)
                T.gemm(grad_shared, fn_shared, x_grad_local)
                for i, j in T.Parallel(BWD_TOKENS, BWD_STEP):
                    x_grad_local[i, j] += 2 * x_shared[i, j] * square_grad[i]
                T.copy(x_grad_local, x_grad[row0, col0])
            for i, j in T.Parallel(MIX_COLUMNS, BWD_STEP):
                if i < mhc3:
                    fn_grad[i, col0 + j] = fn_grad_local[i, j]

    return KernelProgram(pre_norm_fn_bwd_mul, alignment={'mul_grad': 16, 'sqrsum_grad': 4, 'x': 16, 'fn': 16, 'x_grad': 16, 'fn_grad': 16})


def check_fwd(mhc: int, hidden: int) -> None:
    check_width(mhc, hidden, FWD_STEP)


def check_bwd(mhc: int, hidden: int) -> None:
    check_width(mhc, hidden, BWD_STEP)


PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.disable_wgmma': True}
# k_step: the columns of a GEMM step; the splits share out mhc * hidden / k_step steps (the tests find the empty ones by it).
FWD_MUL = KernelDecl('mhc.pre_norm_fn_fwd_mul', GEMM_PARAMS, build_fwd, gemm_specs, check_fwd, PASS_CONFIGS, constants={'k_step': FWD_STEP})
BWD_MUL = KernelDecl('mhc.pre_norm_fn_bwd_mul', GEMM_PARAMS, build_bwd, gemm_specs, check_bwd, PASS_CONFIGS)
