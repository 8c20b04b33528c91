"""mhc.post_fwd and mhc.post_bwd: the next residual from a layer's output and the mixed streams.

Forward, per column h of a token (fp32; `fma` is one rounding, __fmaf_rn; products are __fmul_rn, never contracted):

    out[o, h] = post[o] * x[h]
    out[o, h] = fma(comb[i, o], residual[i, h], out[o, h])   for i = 0 .. mhc - 1, ascending
    result[o, h] = bf16(out[o, h])

`post_streams` below is that sum; mhc.multilayer_recompute calls it too, so the two agree bit for bit.

Backward, with g[o] = d_o[o, h] in fp32:
    d_residual[i, h] = bf16(sum over o of comb[i, o] * g[o])     (a product, then fma for o ascending)
    d_x[h]           = bf16(sum over o of post[o] * g[o])        (the same)
    d_comb[i, o]     = sum over h of residual[i, h] * g[o]       (each thread: fma over its columns, ascending;
    d_post[o]        = sum over h of x[h] * g[o]                  then row_slices.block_sum: fixed by the block size)

Forward grid (tokens, row slices): a block of row_slices.threads threads owns one slice of one token's row, each thread
`fwd_vectors(mhc)` 16-byte vectors of x and of every stream, all loaded before any arithmetic. The kernel waits for
the previous kernel on the stream (programmatic dependent launch) before its first load, so its launch overlaps that
kernel's tail. Backward grid (tokens,): a block walks a token's whole row, one vector per thread a step. The token
count is run-time; mhc and hidden are the spec. The backward keeps mhc * (mhc + 1) partial sums per thread, which
bounds it to mhc <= BWD_MAX_MHC.
"""

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc.row_slices import VEC, block_sum, check_mhc_hidden, load_row, mix_vector, row_slices, stream_constants

BWD_MAX_MHC = 4
PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True}


def fwd_vectors(mhc: int) -> int:
    """16-byte vectors per thread of the forward kernel: two (mhc * 32 + 16 bytes of loads in flight) while the
    per-thread state stays in registers."""
    return 2 if mhc <= 4 else 1


@T.macro
def post_streams(out, post_w, comb_w, layer_out, streams, j, mhc):
    """out[o, 0:VEC] (float32) = the forward sum of the module docstring for vector j: `layer_out` (j, VEC) and
    `streams` (j, mhc, VEC) hold bf16 values (in bf16 or float32 local arrays), `comb_w` is comb flattened row-major."""
    for o in T.unroll(mhc):
        for v in T.unroll(VEC):
            out[o, v] = T.ieee_mul(post_w[o], T.cast(layer_out[j, v], T.float32))
            for i in T.unroll(mhc):
                out[o, v] = T.ieee_fmaf(comb_w[i * mhc + o], T.cast(streams[j, i, v], T.float32), out[o, v])


def build_fwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, fwd_vectors(mhc))
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def post_fwd(
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        post_mix: T.Tensor[(num_tokens, mhc), T.float32],
        comb_mix: T.Tensor[(num_tokens, mhc * mhc), T.float32],
        out: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
    ):
        with T.Kernel(num_tokens, rs.slices, threads=rs.threads) as (token, s):
            tid = T.get_thread_binding()
            post_w = T.alloc_local((mhc,), T.float32)
            comb_w = T.alloc_local((mhc * mhc,), T.float32)
            layer_out = T.alloc_local((rs.vectors, VEC), T.bfloat16)
            streams = T.alloc_local((rs.vectors, mhc, VEC), T.bfloat16)
            acc = T.alloc_local((mhc, VEC), T.float32)
            result = T.alloc_local((mhc, VEC), T.bfloat16)
            T.pdl_sync()
            for j in T.unroll(rs.vectors):
                col = rs.column(s, tid, j)
                if not rs.ragged or col < hidden:
                    for v in T.vectorized(VEC):
                        layer_out[j, v] = x[token, col + v]
                    for i in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            streams[j, i, v] = residual[token, i, col + v]
            load_row(post_w, post_mix, token, mhc, mix_vector(mhc))
            load_row(comb_w, comb_mix, token, mhc * mhc, mix_vector(mhc))
            for j in T.unroll(rs.vectors):
                col = rs.column(s, tid, j)
                if not rs.ragged or col < hidden:
                    post_streams(acc, post_w, comb_w, layer_out, streams, j, mhc)
                    for o in T.unroll(mhc):
                        for v in T.unroll(VEC):
                            result[o, v] = T.cast(acc[o, v], T.bfloat16)
                        for v in T.vectorized(VEC):
                            out[token, o, col + v] = result[o, v]

    mix_align = 4 * mix_vector(mhc)
    return KernelProgram(post_fwd, alignment={'x': 16, 'residual': 16, 'post_mix': mix_align, 'comb_mix': mix_align, 'out': 16})


def build_bwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, 1)
    warps = rs.threads // 32
    sums = mhc * mhc + mhc  # d_comb row-major, then d_post
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def post_bwd(
        d_o: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        post_mix: T.Tensor[(num_tokens, mhc), T.float32],
        comb_mix: T.Tensor[(num_tokens, mhc * mhc), T.float32],
        d_x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        d_residual: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        d_post: T.Tensor[(num_tokens, mhc), T.float32],
        d_comb: T.Tensor[(num_tokens, mhc * mhc), T.float32],
    ):
        with T.Kernel(num_tokens, threads=rs.threads) as token:
            tid = T.get_thread_binding()
            post_w = T.alloc_local((mhc,), T.float32)
            comb_w = T.alloc_local((mhc * mhc,), T.float32)
            partial = T.alloc_local((sums,), T.float32)
            g = T.alloc_local((mhc, VEC), T.bfloat16)
            res = T.alloc_local((mhc, VEC), T.bfloat16)
            xs = T.alloc_local((VEC,), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            d_res = T.alloc_local((mhc, VEC), T.bfloat16)
            dx = T.alloc_local((VEC,), T.bfloat16)
            scratch = T.alloc_shared((warps, sums), T.float32)
            load_row(post_w, post_mix, token, mhc, mix_vector(mhc))
            load_row(comb_w, comb_mix, token, mhc * mhc, mix_vector(mhc))
            for k in T.unroll(sums):
                partial[k] = T.float32(0)
            for s in T.serial(rs.slices):
                col = rs.column(s, tid, 0)
                if not rs.ragged or col < hidden:
                    for o in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            g[o, v] = d_o[token, o, col + v]
                    for i in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            res[i, v] = residual[token, i, col + v]
                    for v in T.vectorized(VEC):
                        xs[v] = x[token, col + v]
                    for i in T.unroll(mhc):
                        for v in T.unroll(VEC):
                            acc[v] = T.ieee_mul(comb_w[i * mhc], T.cast(g[0, v], T.float32))
                            for o in T.unroll(mhc - 1):
                                acc[v] = T.ieee_fmaf(comb_w[i * mhc + o + 1], T.cast(g[o + 1, v], T.float32), acc[v])
                            d_res[i, v] = T.cast(acc[v], T.bfloat16)
                    for v in T.unroll(VEC):
                        acc[v] = T.ieee_mul(post_w[0], T.cast(g[0, v], T.float32))
                        for o in T.unroll(mhc - 1):
                            acc[v] = T.ieee_fmaf(post_w[o + 1], T.cast(g[o + 1, v], T.float32), acc[v])
                        dx[v] = T.cast(acc[v], T.bfloat16)
                    for i in T.unroll(mhc):
                        for o in T.unroll(mhc):
                            for v in T.unroll(VEC):
                                partial[i * mhc + o] = T.ieee_fmaf(T.cast(res[i, v], T.float32), T.cast(g[o, v], T.float32), partial[i * mhc + o])
                    for o in T.unroll(mhc):
                        for v in T.unroll(VEC):
                            partial[mhc * mhc + o] = T.ieee_fmaf(T.cast(xs[v], T.float32), T.cast(g[o, v], T.float32), partial[mhc * mhc + o])
                    for i in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            d_residual[token, i, col + v] = d_res[i, v]
                    for v in T.vectorized(VEC):
                        d_x[token, col + v] = dx[v]
            block_sum(partial, sums, scratch, warps)
            for k in T.unroll(-(-sums // rs.threads)):
                i = k * rs.threads + tid
                if i < mhc * mhc:
                    d_comb[token, i] = scratch[0, i]
                elif i < sums:
                    d_post[token, i - mhc * mhc] = scratch[0, i]

    mix_align = 4 * mix_vector(mhc)
    return KernelProgram(post_bwd, alignment={
        'd_o': 16, 'x': 16, 'residual': 16, 'post_mix': mix_align, 'comb_mix': mix_align,
        'd_x': 16, 'd_residual': 16, 'd_post': 4, 'd_comb': 4})


def check_fwd(mhc: int, hidden: int) -> None:
    check_mhc_hidden(mhc, hidden)


def check_bwd(mhc: int, hidden: int) -> None:
    check_mhc_hidden(mhc, hidden)
    if mhc > BWD_MAX_MHC:
        raise ValueError(f'mhc.post_bwd keeps mhc * (mhc + 1) sums per thread and builds for mhc <= {BWD_MAX_MHC}, got {mhc}')


def prebuilt():
    from kernel_src.models import mhc_shapes

    for mhc, hidden in mhc_shapes():
        yield dict(mhc=mhc, hidden=hidden)


PARAMS = (param('mhc', 'int', 'm'), param('hidden', 'int', 'h'))
FWD = KernelDecl('mhc.post_fwd', PARAMS, build_fwd, prebuilt, check_fwd, PASS_CONFIGS, constants=stream_constants)
BWD = KernelDecl('mhc.post_bwd', PARAMS, build_bwd, prebuilt, check_bwd, PASS_CONFIGS, constants=stream_constants)
