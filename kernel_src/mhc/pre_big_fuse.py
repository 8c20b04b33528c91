"""mhc.pre_big_fuse: the inference pre step after the norm's GEMM in one kernel, one CTA per token.

Bit for bit the composed path mhc.pre_norm_fn_fwd_norm -> mhc.pre_split_mixes_fwd -> mhc.sinkhorn_fwd ->
mhc.pre_apply_mix_fwd on the same split-K partials (the op runs the same GEMM, mhc.pre_norm_fn_fwd_mul, first):
every value is computed by the macro or expression helper the composed kernel uses, so the operation order, the
roundings and the fused multiply-adds are the same by construction.
  - warp 0, lane j < mhc3: mixes[j] = rms_mix(...) (kernel_src.mhc.norm_fn.norm), into shared memory.
  - after a barrier, warp 0 writes post_mix (lanes j < mhc: pre_split_mixes.post_mix), and its first mhc * mhc
    lanes form the comb matrix (pre_split_mixes.comb_mix), one element a lane, run sinkhorn.sinkhorn_normalize on
    it as mhc.sinkhorn_fwd's lanes do, and write comb_mix;
  - meanwhile warps 1 .. APPLY_WARPS each form the pre weights (pre_split_mixes.pre_mix, the same in every thread)
    and the layer input, column by column with pre_apply_mix.mix_streams: each thread UNROLL 16-byte vectors of
    every stream a step, consecutive threads on consecutive vectors. Their first step's loads are issued before the
    barrier, so they are in flight while warp 0 reduces the partials.
Every float (rms_eps, pre_eps, sinkhorn_eps, post_mult_value), sinkhorn_repeat, n_splits (the partials' leading dim)
and the token count are run-time; mhc and hidden are the spec.
"""

import tilelang  # noqa: F401  (before tvm: it sets up the tvm that tilelang ships)
from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc.norm_fn.common import MAX_MHC as NORM_MAX_MHC
from kernel_src.mhc.norm_fn.norm import rms_mix
from kernel_src.mhc.pre_apply_mix import mix_streams
from kernel_src.mhc.pre_split_mixes import comb_mix, post_mix, pre_mix
from kernel_src.mhc.row_slices import VEC
from kernel_src.mhc.sinkhorn import MAX_MHC as SINKHORN_MAX_MHC
from kernel_src.mhc.sinkhorn import Element, sinkhorn_normalize

WARP = 32
APPLY_WARPS = 4  # warps forming the layer input; warp 0 forms the mixes
APPLY_THREADS = WARP * APPLY_WARPS
UNROLL = 2  # 16-byte vectors of each stream per apply thread and step: mhc * 32 bytes of loads in flight


def check(mhc: int, hidden: int) -> None:
    if not 1 <= mhc <= min(NORM_MAX_MHC, SINKHORN_MAX_MHC) or mhc * (mhc + 2) > WARP:
        raise ValueError(f'mhc must be in [1, {min(NORM_MAX_MHC, SINKHORN_MAX_MHC)}], got {mhc}')
    if hidden <= 0 or hidden % VEC:
        raise ValueError(f'hidden must be a positive multiple of {VEC}, got {hidden}')


def _column(step, j, a):
    """First column of apply thread a's j-th vector of a step: consecutive threads on consecutive vectors."""
    return ((step * UNROLL + j) * APPLY_THREADS + a) * VEC


@T.macro
def _load_step(streams, residual, token, step, a, n, hidden, ragged):
    """streams[j, m, :] = the 16-byte vector of stream m at _column(step, j, a), for j < UNROLL."""
    for j in T.unroll(UNROLL):
        col = _column(step, j, a)
        if not ragged or col < hidden:
            for m in T.unroll(n):
                for v in T.vectorized(VEC):
                    streams[j, m, v] = residual[token, m, col + v]


def build(arch: Arch, mhc: int, hidden: int) -> KernelProgram:
    n = mhc
    mhc3 = n * (n + 2)
    step_columns = APPLY_THREADS * UNROLL * VEC
    steps = -(-hidden // step_columns)
    ragged = hidden % step_columns != 0
    num_tokens, n_splits = T.dynamic('num_tokens'), T.dynamic('n_splits')

    @T.prim_func
    def pre_big_fuse(
        partial_mul: T.Tensor[(n_splits, num_tokens, mhc3), T.float32],
        partial_sqrsum: T.Tensor[(n_splits, num_tokens), T.float32],
        scale: T.Tensor[(3,), T.float32],
        base: T.Tensor[(mhc3,), T.float32],
        residual: T.Tensor[(num_tokens, n, hidden), T.bfloat16],
        post: T.Tensor[(num_tokens, n), T.float32],
        comb: T.Tensor[(num_tokens, n * n), T.float32],
        layer_input: T.Tensor[(num_tokens, hidden), T.bfloat16],
        width: T.int32,
        rms_eps: T.float32,
        pre_eps: T.float32,
        sinkhorn_eps: T.float32,
        post_mult_value: T.float32,
        sinkhorn_repeat: T.int32,
    ):
        with T.Kernel(num_tokens, threads=WARP + APPLY_THREADS) as token:
            tid = T.get_thread_binding()
            a = tid - WARP  # the thread's index among the apply threads
            mixes = T.alloc_shared((mhc3,), T.float32)
            values = T.alloc_local((3,), T.float32)
            streams = T.alloc_local((UNROLL, n, VEC), T.bfloat16)
            # Copies of the scalars handed to macros: a macro renames a kernel parameter passed to it after its own
            # parameter, and rms_mix and sinkhorn_normalize both call theirs `eps`.
            norm_eps = T.alloc_var(T.float32)
            comb_eps = T.alloc_var(T.float32)
            repeat = T.alloc_var(T.int32)
            norm_eps = rms_eps
            comb_eps = sinkhorn_eps
            repeat = sinkhorn_repeat
            if tid < mhc3:
                rms_mix(partial_mul, partial_sqrsum, token, tid, n_splits, width, norm_eps, values)
                mixes[tid] = values[2]
            elif tid >= WARP:
                _load_step(streams, residual, token, 0, a, n, hidden, ragged)  # in flight while warp 0 reduces
            T.sync_threads()
            if tid < WARP:
                if tid < n:
                    post[token, tid] = post_mix(mixes[n + tid], scale[1], base[n + tid], post_mult_value)
                # Every lane of the warp runs the shuffles; the lanes past the first group repeat its elements.
                e = Element(tid, n)
                cm = T.alloc_local((1,), T.float32)
                cm[0] = 0
                if e.valid:
                    cm[0] = comb_mix(mixes[2 * n + e.lane], scale[2], base[2 * n + e.lane])
                sinkhorn_normalize(cm, e, repeat, comb_eps)
                if tid < n * n:
                    comb[token, tid] = cm[0]
            else:
                weights = T.alloc_local((n,), T.float32)
                acc = T.alloc_local((VEC,), T.float32)
                result = T.alloc_local((VEC,), T.bfloat16)
                for m in T.unroll(n):
                    weights[m] = pre_mix(mixes[m], scale[0], base[m], pre_eps)
                for s in T.serial(steps):
                    if s > 0:
                        _load_step(streams, residual, token, s, a, n, hidden, ragged)
                    for j in T.unroll(UNROLL):
                        col = _column(s, j, a)
                        if not ragged or col < hidden:
                            mix_streams(acc, weights, streams, j, n)
                            for v in T.unroll(VEC):
                                result[v] = T.cast(acc[v], T.bfloat16)
                            for v in T.vectorized(VEC):
                                layer_input[token, col + v] = result[v]

    return KernelProgram(pre_big_fuse, alignment={
        'partial_mul': 4, 'partial_sqrsum': 4, 'scale': 4, 'base': 4, 'residual': 16, 'post': 4, 'comb': 16, 'layer_input': 16})


def prebuilt():
    for mhc, hidden in models.mhc_shapes():
        yield dict(mhc=mhc, hidden=hidden)


DECL = KernelDecl(
    'mhc.pre_big_fuse', (param('mhc', 'int', 'm'), param('hidden', 'int', 'h')), build, prebuilt, check,
    {'tl.disable_warp_specialized': True, 'tl.enable_lower_ldgstg': True},
    constants={'threads': WARP + APPLY_THREADS},
)
