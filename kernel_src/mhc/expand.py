"""mhc.expand_to_mhc_fwd and mhc.expand_to_mhc_bwd: a hidden state copied into mhc streams, and the gradient summed back.

    forward:  out[t, m, h] = x[t, h]                     for every stream m
    backward: x_grad[t, h] = bf16(g[0] + g[1] + ... + g[mhc - 1])   with g[m] = out_grad[t, m, h] in fp32, added in
                                                                     ascending m

Grid (tokens, row slices): a block of row_slices.threads threads owns one slice of one token's row, each thread VECTORS
16-byte vectors of it (of every stream in the backward), all loaded before any store. The token count is run-time;
mhc and hidden are the spec.
"""

import tilelang  # noqa: F401 - puts tilelang's bundled tvm on the path before `tvm` is imported
from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc.row_slices import VEC, check_mhc_hidden, load_streams, row_slices, stream_constants

VECTORS = 2  # 16-byte vectors of a row per thread
PASS_CONFIGS = {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True}


def build_fwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, VECTORS)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def expand_fwd(
        x: T.Tensor[(num_tokens, hidden), T.bfloat16],
        out: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
    ):
        with T.Kernel(num_tokens, rs.slices, threads=rs.threads) as (token, s):
            tid = T.get_thread_binding()
            values = T.alloc_local((rs.vectors, VEC), T.bfloat16)
            for j in T.unroll(rs.vectors):
                col = rs.column(s, tid, j)
                if not rs.ragged or col < hidden:
                    for v in T.vectorized(VEC):
                        values[j, v] = x[token, col + v]
            for j in T.unroll(rs.vectors):
                col = rs.column(s, tid, j)
                if not rs.ragged or col < hidden:
                    for m in T.unroll(mhc):
                        for v in T.vectorized(VEC):
                            out[token, m, col + v] = values[j, v]

    return KernelProgram(expand_fwd, alignment={'x': 16, 'out': 16})


def build_bwd(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    rs = row_slices(hidden, VECTORS)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def expand_bwd(
        out_grad: T.Tensor[(num_tokens, mhc, hidden), T.bfloat16],
        x_grad: T.Tensor[(num_tokens, hidden), T.bfloat16],
    ):
        with T.Kernel(num_tokens, rs.slices, threads=rs.threads) as (token, s):
            tid = T.get_thread_binding()
            grads = T.alloc_local((rs.vectors, mhc, VEC), T.bfloat16)
            acc = T.alloc_local((VEC,), T.float32)
            result = T.alloc_local((VEC,), T.bfloat16)
            load_streams(rs, grads, out_grad, token, s, tid, mhc)
            for j in T.unroll(rs.vectors):
                col = rs.column(s, tid, j)
                if not rs.ragged or col < hidden:
                    for v in T.unroll(VEC):
                        acc[v] = T.cast(grads[j, 0, v], T.float32)
                        for m in T.unroll(mhc - 1):
                            acc[v] = acc[v] + T.cast(grads[j, m + 1, v], T.float32)
                        result[v] = T.cast(acc[v], T.bfloat16)
                    for v in T.vectorized(VEC):
                        x_grad[token, col + v] = result[v]

    return KernelProgram(expand_bwd, alignment={'out_grad': 16, 'x_grad': 16})


def check(mhc: int, hidden: int) -> None:
    check_mhc_hidden(mhc, hidden)


def prebuilt():
    from kernel_src.models import UPSTREAM_MHC_EXPAND_MULTS, mhc_shapes

    shapes = set(mhc_shapes()) | {(m, h) for m in UPSTREAM_MHC_EXPAND_MULTS for _, h in mhc_shapes()}
    for mhc, hidden in sorted(shapes):
        yield dict(mhc=mhc, hidden=hidden)


PARAMS = (param('mhc', 'int', 'm'), param('hidden', 'int', 'h'))
FWD = KernelDecl('mhc.expand_to_mhc_fwd', PARAMS, build_fwd, prebuilt, check, PASS_CONFIGS, constants=stream_constants)
BWD = KernelDecl('mhc.expand_to_mhc_bwd', PARAMS, build_bwd, prebuilt, check, PASS_CONFIGS, constants=stream_constants)
