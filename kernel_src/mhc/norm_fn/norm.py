"""mhc.pre_norm_fn_fwd_norm and mhc.pre_norm_fn_bwd_norm: the per-token RMS step of the pre-norm, a warp per token.

Forward: lane j < mhc3 of a token's warp adds the GEMM's partial products of column j and the partial sums of
squares over the splits, in split order (`rms_mix`, which mhc.pre_big_fuse repeats bit for bit), and writes
out_mul, sqrsum and mixes = out_mul * rsqrt(sqrsum / width + eps).

Backward, with rms = rsqrt(sqrsum / width + eps) and g the mixes' gradient: lane j writes the products'
gradient g_j * rms, rounded to TF32 as the backward GEMM consumes it, in a row of MIX_COLUMNS (zeros past
mhc3); the lanes add g_j * out_mul_j with a butterfly of shuffles, and lane 0 writes the sum of squares'
gradient -(sum) * rms / (sqrsum + eps * width) / 2.

Each token's values come from its own warp in a fixed order, so nothing depends on the grid. eps and width
(= mhc * hidden) are run-time arguments: one binary per mhc serves every hidden size and eps.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.mhc.norm_fn.common import MHC_PARAMS, MIX_COLUMNS, check_mhc, mhc_specs, mix_count, round_to_tf32

TOKENS_PER_BLOCK = 4  # a warp each
WARP = 32


@T.macro
def rms_mix(partial_mul, partial_sqrsum, token, column, n_splits, width, eps, out):
    """out[0] = the product of `column`, out[1] = the sum of squares, out[2] = the mix, for one token.

    Operation order, which a kernel that must match this one bit for bit repeats by calling this macro:
      mul    = ((0 + partial_mul[0, token, column]) + partial_mul[1, token, column]) + ...   (split order)
      sqrsum = ((0 + partial_sqrsum[0, token]) + partial_sqrsum[1, token]) + ...
      rms    = rsqrt(sqrsum / float32(width) + eps)   (an IEEE division, then an add: no FMA; rsqrtf)
      mix    = mul * rms
    """
    mul = T.alloc_var(T.float32)
    sqrsum = T.alloc_var(T.float32)
    mul = T.float32(0)
    sqrsum = T.float32(0)
    for s in T.serial(n_splits):
        mul = mul + partial_mul[s, token, column]
        sqrsum = sqrsum + partial_sqrsum[s, token]
    out[0] = mul
    out[1] = sqrsum
    out[2] = mul * T.rsqrt(sqrsum / T.Cast(T.float32, width) + eps)


def build_fwd(arch: Arch, mhc: int) -> KernelProgram:
    mhc3 = mix_count(mhc)
    num_tokens, n_splits = T.dynamic('num_tokens'), T.dynamic('n_splits')

    @T.prim_func
    def pre_norm_fn_fwd_norm(
        partial_mul: T.Tensor[(n_splits, num_tokens, mhc3), T.float32],
        partial_sqrsum: T.Tensor[(n_splits, num_tokens), T.float32],
        out_mul: T.Tensor[(num_tokens, mhc3), T.float32],
        sqrsum: T.Tensor[(num_tokens,), T.float32],
        mixes: T.Tensor[(num_tokens, mhc3), T.float32],
        width: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TOKENS_PER_BLOCK), threads=TOKENS_PER_BLOCK * WARP) as pid:
            tid = T.get_thread_binding()
            token = pid * TOKENS_PER_BLOCK + tid // WARP
            lane = tid % WARP
            values = T.alloc_local((3,), T.float32)
            if token < num_tokens and lane < mhc3:
                rms_mix(partial_mul, partial_sqrsum, token, lane, n_splits, width, eps, values)
                out_mul[token, lane] = values[0]
                mixes[token, lane] = values[2]
                if lane == 0:
                    sqrsum[token] = values[1]

    return KernelProgram(pre_norm_fn_fwd_norm, alignment={'partial_mul': 4, 'partial_sqrsum': 4, 'out_mul': 4, 'sqrsum': 4, 'mixes': 4})


def build_bwd(arch: Arch, mhc: int) -> KernelProgram:
    mhc3 = mix_count(mhc)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def pre_norm_fn_bwd_norm(
        out_grad: T.Tensor[(num_tokens, mhc3), T.float32],
        out_mul: T.Tensor[(num_tokens, mhc3), T.float32],
        sqrsum: T.Tensor[(num_tokens,), T.float32],
        mul_grad: T.Tensor[(num_tokens, MIX_COLUMNS), T.float32],
        sqrsum_grad: T.Tensor[(num_tokens,), T.float32],
        width: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, TOKENS_PER_BLOCK), threads=TOKENS_PER_BLOCK * WARP) as pid:
            tid = T.get_thread_binding()
            token = pid * TOKENS_PER_BLOCK + tid // WARP
            lane = tid % WARP
            if token < num_tokens:
                total = T.alloc_var(T.float32)
                grad = T.alloc_var(T.float32)
                square_sum = T.alloc_var(T.float32)
                rms = T.alloc_var(T.float32)
                square_sum = sqrsum[token]
                rms = T.rsqrt(square_sum / T.Cast(T.float32, width) + eps)
                grad = T.float32(0)
                total = T.float32(0)
                if lane < mhc3:
                    grad = out_grad[token, lane]
                    total = grad * out_mul[token, lane]
                    mul_grad[token, lane] = round_to_tf32(grad * rms)
                else:
                    mul_grad[token, lane] = T.float32(0)
                for s in T.unroll(5):
                    total = total + T.shfl_xor(total, 16 >> s)
                if lane == 0:
                    sqrsum_grad[token] = total * rms / (square_sum + eps * T.Cast(T.float32, width)) / T.float32(-2)

    return KernelProgram(pre_norm_fn_bwd_norm, alignment={'out_grad': 4, 'out_mul': 4, 'sqrsum': 4, 'mul_grad': 16, 'sqrsum_grad': 4})


PASS_CONFIGS = {'tl.disable_warp_specialized': True}
CONSTANTS = {'mix_columns': MIX_COLUMNS}  # the columns of the backward's padded product gradient, which the op allocates
FWD_NORM = KernelDecl('mhc.pre_norm_fn_fwd_norm', MHC_PARAMS, build_fwd, mhc_specs, check_mhc, PASS_CONFIGS, constants=CONSTANTS)
BWD_NORM = KernelDecl('mhc.pre_norm_fn_bwd_norm', MHC_PARAMS, build_bwd, mhc_specs, check_mhc, PASS_CONFIGS, constants=CONSTANTS)
