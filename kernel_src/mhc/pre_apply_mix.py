"""mhc.pre_apply_mix_fwd and mhc.pre_apply_mix_bwd: the layer input as a weighted sum of the mHC streams.

Arithmetic, per column h of a token (fp32; `fma` is one rounding, __fmaf_rn, and nothing else is contracted):

    acc = mix[0] * x[0, h]                          (a plain product, __fmul_rn)
    acc = fma(mix[m], x[m, h], acc)   for m = 1 .. mhc - 1, ascending
    out[h] = bf16(acc)                              (round to nearest even)

`mix_streams` below is that sum, and every kernel that forms a layer input (mhc.multilayer_recompute here,
mhc.pre_big_fuse) calls it, so that they agree with this one bit for bit.

Backward, with og = o_grad[h] in fp32:
    x_grad[m, h] = bf16(fma(mix[m], og, x_grad[m, h]))        (accumulated into the given bf16 buffer)
    mix_grad[m]  = sum over h of og * x[m, h]                 (each thread: fma over its columns in ascending order;
                                                               then row_slices.block_sum: fixed by the block size)

Forward grid (tokens, row slices): a block of row_slices.threads threads owns one slice of one token's row, each
thread FWD_VECTORS 16-byte vectors of every stream, all loaded before any arithmetic. Backward grid (tokens,): one
block walks a token's whole row (one vector per thread a step), since mix_grad sums over it. The token count is
run-time; mhc and hidden are the spec.
"""

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc.row_slices import VEC, block_sum, check_mhc_hidden, load_row, load_streams, mix_vector, row_slices, stream_constants

FWD_VECTORS = 2  # 16-byte vectors of each stream per thread in the forward kernel: mhc * 32 bytes of loads in flight
PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True}


@T.macro
def mix_streams(acc, weights, streams, j, mhc):
    """acc[0:VEC] = sum over m of weights[m] * streams[j, m, 0:VEC] in the order of the module docstring. `streams`
    holds bf16 values (a bf16 or a float32 local array): the sum is the same either way."""
    for v in T.unroll(VEC):
        acc[v] = T.ieee_mul(weights[0], T.cast(streams[j, 0, v], T.float32))
        for m in T.unroll(mhc - 1):
            acc[v] = T.ieee_fmaf(weights[m + 1], T.cast(streams[j, m + 1, v], T.float32), acc[v])


def build_fwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, FWD_VECTORS)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def pre_apply_mix_fwd(
        x: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        mix: T.Tensor[(num_tokens, mhc), T.float32],
        out: T.Tensor[(num_tokens, hidden), T.bfloat16],
    ):
        with T.Kernel(num_tokens, rs.slices, threads=rs.threads) as (token, s):
            tid = T.get_thread_binding()
            weights = T.alloc_local((mhc,), T.float32)
            streams = T.alloc_local((rs.vectors, mhc, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            result = T.alloc_local((VEC,), T.bfloat16)
            load_streams(rs, streams, x, token, s, tid, mhc)
            load_row(weights, mix, token, mhc, mix_vector(mhc))
            for j in T.unroll(rs.vectors):
                col = rs.column(s, tid, j)
                if not rs.ragged or col < hidden:
                    mix_streams(acc, weights, streams, j, mhc)
                    for v in T.unroll(VEC):
                        result[v] = T.cast(acc[v], T.bfloat16)
                    for v in T.vectorized(VEC):
                        out[token, col + v] = result[v]

    return KernelProgram(pre_apply_mix_fwd, alignment={'x': 16, 'mix': 4 * mix_vector(mhc), 'out': 16})


def build_bwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, 1)
    warps = rs.threads // 32
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def pre_apply_mix_bwd(
        o_grad: T.Tensor[(num_tokens, hidden), T.bfloat16],
        x: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        mix: T.Tensor[(num_tokens, mhc), T.float32],
        x_grad: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        mix_grad: T.Tensor[(num_tokens, mhc), T.float32],
    ):
        with T.Kernel(num_tokens, threads=rs.threads) as token:
            tid = T.get_thread_binding()
            weights = T.alloc_local((mhc,), T.float32)
            partial = T.alloc_local((mhc,), T.float32)
            og = T.alloc_local((VEC,), T.bfloat16)
            xs = T.alloc_local((mhc, VEC), T.bfloat16)
            xg = T.alloc_local((mhc, VEC), T.bfloat16)
            scratch = T.alloc_shared((warps, mhc), T.float32)
            load_row(weights, mix, token, mhc, mix_vector(mhc))
            for m in T.unroll(mhc):
                partial[m] = T.float32(0)
            for s in T.serial(rs.slices):
                col = rs.column(s, tid, 0)
                if not rs.ragged or col < hidden:
                    for v in T.vectorized(VEC):
                        og[v] = o_grad[token, col + v]
                    for m in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            xs[m, v] = x[token, m, col + v]
                        for v in T.vectorized(VEC):
                            xg[m, v] = x_grad[token, m, col + v]
                    for m in T.unroll(mhc):
                        for v in T.unroll(VEC):
                            g = T.cast(og[v], T.float32)
                            partial[m] = T.ieee_fmaf(g, T.cast(xs[m, v], T.float32), partial[m])
                            xg[m, v] = T.cast(T.ieee_fmaf(weights[m], g, T.cast(xg[m, v], T.float32)), T.bfloat16)
                    for m in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            x_grad[token, m, col + v] = xg[m, v]
            block_sum(partial, mhc, scratch, warps)
            if tid < mhc:
                mix_grad[token, tid] = scratch[0, tid]

    return KernelProgram(pre_apply_mix_bwd, alignment={'o_grad': 16, 'x': 16, 'mix': 4 * mix_vector(mhc), 'x_grad': 16, 'mix_grad': 4})


def check(mhc: int, hidden: int) -> None:
    check_mhc_hidden(mhc, hidden)


def prebuilt():
    from kernel_src.models import UPSTREAM_MHC_APPLY_MIX_HIDDEN_SIZES, mhc_shapes

    shapes = set(mhc_shapes()) | {(4, h) for h in UPSTREAM_MHC_APPLY_MIX_HIDDEN_SIZES}
    for mhc, hidden in sorted(shapes):
        yield dict(mhc=mhc, hidden=hidden)


PARAMS = (param('mhc', 'int', 'm'), param('hidden', 'int', 'h'))
FWD = KernelDecl('mhc.pre_apply_mix_fwd', PARAMS, build_fwd, prebuilt, check, PASS_CONFIGS, constants=stream_constants)
BWD = KernelDecl('mhc.pre_apply_mix_bwd', PARAMS, build_bwd, prebuilt, check, PASS_CONFIGS, constants=stream_constants)
