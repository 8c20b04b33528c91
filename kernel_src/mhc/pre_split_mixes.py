"""mhc.pre_split_mixes_fwd and mhc.pre_split_mixes_bwd: the pre step's mixes (T, n (n + 2)) split into three.

Forward, n = mhc, per token t (columns j of the pre and post groups, j * n + k of the comb group):
    pre[t, j]  = sigmoid(mixes[t, j] * scale[0] + base[j]) + pre_eps
    post[t, j] = sigmoid(mixes[t, n + j] * scale[1] + base[n + j]) * post_mult_value
    comb[t, j * n + k] = mixes[t, 2n + j * n + k] * scale[2] + base[2n + j * n + k]
written once, in the expression helpers below, which mhc.pre_big_fuse uses too. Each `mix * scale + base` is
one explicit fma (__fmaf_rn), so no kernel depends on what nvcc contracts; sigmoid(z) is 1 / (1 + expf(-z)),
IEEE division. One thread owns one token: it reads its row of mixes and the base as n + 2 vectors of n
floats each (base 16-byte aligned) and writes n-float vectors, FWD_TOKENS tokens a CTA.

Backward, with z the pre-activation (mixes * scale + base) and sigma = sigmoid(z) recomputed from mixes:
    dz = pre_grad * sigma (1 - sigma), post_grad * post_mult_value * sigma (1 - sigma), comb_grad
    mixes_grad = dz * scale[group], base_grad = sum_t dz, scale_grad[group] = sum_t sum_(j in group) dz * mixes.
(The post gradient is formed from sigma, not from post_mix / post_mult_value: no division, so a post_mult_value
of 0 works.) The token sums go through kernel_src.mhc.chunk_sums (a partial per chunk of 64 tokens, then one CTA
adds the partials in a fixed order), so they are bitwise independent of the GPU's SM count. Every float
(post_mult_value, pre_eps) is a run-time argument: one binary per mhc.
"""

import tilelang  # noqa: F401  (before tvm: it sets up the tvm that tilelang ships)
from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc import chunk_sums
from kernel_src.mhc.chunk_sums import CHUNK, WARP

FWD_TOKENS = 32  # threads (tokens) of a forward CTA: one warp, so that T = 8192 fills every SM
MHC_VALUES = (2, 4, 8)  # n: a row of n floats is one vector of 8, 16 or 32 bytes


def check(mhc: int) -> None:
    if mhc not in MHC_VALUES:
        raise ValueError(f'mhc must be one of {MHC_VALUES}, got {mhc}')


def pre_mix(mix, scale, base, pre_eps):
    """The pre weight of one stream from its mix: sigmoid(mix * scale + base) + pre_eps."""
    return T.sigmoid(T.ieee_fmaf(mix, scale, base)) + pre_eps


def post_mix(mix, scale, base, post_mult_value):
    """The post weight of one stream: sigmoid(mix * scale + base) * post_mult_value."""
    return T.sigmoid(T.ieee_fmaf(mix, scale, base)) * post_mult_value


def comb_mix(mix, scale, base):
    """One entry of the residual mixing matrix before Sinkhorn: mix * scale + base."""
    return T.ieee_fmaf(mix, scale, base)


def build_fwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    mhc3 = n * (n + 2)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def pre_split_mixes_fwd(
        mixes: T.Tensor[(num_tokens, mhc3), T.float32],
        scale: T.Tensor[(3,), T.float32],
        base: T.Tensor[(mhc3,), T.float32],
        pre: T.Tensor[(num_tokens, n), T.float32],
        post: T.Tensor[(num_tokens, n), T.float32],
        comb: T.Tensor[(num_tokens, n * n), T.float32],
        post_mult_value: T.float32,
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, FWD_TOKENS), threads=FWD_TOKENS) as pid:
            token = pid * FWD_TOKENS + T.get_thread_binding()
            m = T.alloc_local((mhc3,), T.float32)
            b = T.alloc_local((mhc3,), T.float32)
            out = T.alloc_local((mhc3,), T.float32)
            if token < num_tokens:
                for g in T.unroll(n + 2):
                    for k in T.vectorized(n):
                        m[g * n + k] = mixes[token, g * n + k]
                for g in T.unroll(n + 2):
                    for k in T.vectorized(n):
                        b[g * n + k] = base[g * n + k]
                for j in T.unroll(n):
                    out[j] = pre_mix(m[j], scale[0], b[j], pre_eps)
                    out[n + j] = post_mix(m[n + j], scale[1], b[n + j], post_mult_value)
                for j in T.unroll(n * n):
                    out[2 * n + j] = comb_mix(m[2 * n + j], scale[2], b[2 * n + j])
                for k in T.vectorized(n):
                    pre[token, k] = out[k]
                for k in T.vectorized(n):
                    post[token, k] = out[n + k]
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        comb[token, j * n + k] = out[2 * n + j * n + k]

    return KernelProgram(pre_split_mixes_fwd, alignment={'mixes': 16, 'scale': 4, 'base': 16, 'pre': 16, 'post': 16, 'comb': 16})


@T.macro
def _scale_term(terms, row, dz, m, lo, hi, tid):
    """terms[row, tid] = sum over lo <= j < hi of dz[j] * m[j], in order: a token's share of one scale_grad."""
    total = T.alloc_var(T.float32)
    total = dz[lo] * m[lo]
    for j in T.unroll(lo + 1, hi):
        total = total + dz[j] * m[j]
    terms[row, tid] = total


def build_bwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    mhc3 = n * (n + 2)
    num_terms = mhc3 + 3  # base_grad (mhc3), then scale_grad (3)
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def pre_split_mixes_bwd(
        pre_grad: T.Tensor[(num_tokens, n), T.float32],
        post_grad: T.Tensor[(num_tokens, n), T.float32],
        comb_grad: T.Tensor[(num_tokens, n * n), T.float32],
        mixes: T.Tensor[(num_tokens, mhc3), T.float32],
        scale: T.Tensor[(3,), T.float32],
        base: T.Tensor[(mhc3,), T.float32],
        mixes_grad: T.Tensor[(num_tokens, mhc3), T.float32],
        partial: T.Tensor[(T.ceildiv(num_tokens, CHUNK), num_terms), T.float32],
        scale_grad: T.Tensor[(3,), T.float32],
        base_grad: T.Tensor[(mhc3,), T.float32],
        post_mult_value: T.float32,
    ):
        with T.Kernel(chunk_sums.num_chunks(num_tokens), threads=CHUNK) as chunk:
            tid = T.get_thread_binding()
            token = chunk * CHUNK + tid
            terms = T.alloc_shared((num_terms, CHUNK), T.float32)
            m = T.alloc_local((mhc3,), T.float32)
            dz = T.alloc_local((mhc3,), T.float32)
            for j in T.unroll(mhc3):
                dz[j] = T.float32(0)
                m[j] = T.float32(0)
            if token < num_tokens:
                for g in T.unroll(n + 2):
                    for k in T.vectorized(n):
                        m[g * n + k] = mixes[token, g * n + k]
                for k in T.vectorized(n):
                    dz[k] = pre_grad[token, k]
                for k in T.vectorized(n):
                    dz[n + k] = post_grad[token, k]
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        dz[2 * n + j * n + k] = comb_grad[token, j * n + k]
                for j in T.unroll(n):
                    sigma = T.alloc_var(T.float32)
                    sigma = T.sigmoid(T.ieee_fmaf(m[j], scale[0], base[j]))
                    dz[j] = dz[j] * sigma * (1 - sigma)
                    sigma = T.sigmoid(T.ieee_fmaf(m[n + j], scale[1], base[n + j]))
                    dz[n + j] = dz[n + j] * post_mult_value * sigma * (1 - sigma)
                for g in T.unroll(n + 2):
                    for k in T.vectorized(n):
                        mixes_grad[token, g * n + k] = dz[g * n + k] * scale[T.min(g, 2)]
            for j in T.unroll(mhc3):
                terms[j, tid] = dz[j]
            _scale_term(terms, mhc3, dz, m, 0, n, tid)
            _scale_term(terms, mhc3 + 1, dz, m, n, 2 * n, tid)
            _scale_term(terms, mhc3 + 2, dz, m, 2 * n, mhc3, tid)
            chunk_sums.write_chunk_partial(terms, partial, num_terms, chunk, tid)

        with T.Kernel(1, threads=WARP * num_terms):
            tid = T.get_thread_binding()
            term, lane = tid // WARP, tid % WARP
            if term < mhc3:
                chunk_sums.reduce_chunk_partials(partial, chunk_sums.num_chunks(num_tokens), term, lane, base_grad, term)
            else:
                chunk_sums.reduce_chunk_partials(partial, chunk_sums.num_chunks(num_tokens), term, lane, scale_grad, term - mhc3)

    return KernelProgram(pre_split_mixes_bwd, alignment={
        'pre_grad': 16, 'post_grad': 16, 'comb_grad': 16, 'mixes': 16, 'scale': 4, 'base': 4,
        'mixes_grad': 16, 'partial': 4, 'scale_grad': 4, 'base_grad': 4})


def prebuilt():
    for mhc in models.mhc_mults():
        yield dict(mhc=mhc)


PARAMS = (param('mhc', 'int', 'm'),)
PASS_CONFIGS = {'tl.disable_warp_specialized': True}
FWD = KernelDecl('mhc.pre_split_mixes_fwd', PARAMS, build_fwd, prebuilt, check, PASS_CONFIGS,
                 constants={'tokens_per_block': FWD_TOKENS})
BWD = KernelDecl('mhc.pre_split_mixes_bwd', PARAMS, build_bwd, prebuilt, check, PASS_CONFIGS,
                 constants={'chunk_tokens': CHUNK})
