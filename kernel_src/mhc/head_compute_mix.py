"""mhc.head_compute_mix_fwd and mhc.head_compute_mix_bwd: the head's stream weights from its mixes (T, n).

Forward: out[t, j] = sigmoid(mix[t, j] * scale[0] + base[j]) + pre_eps, the pre weight of
kernel_src.mhc.pre_split_mixes (the same expression helper). One thread owns one element, FWD_TOKENS tokens a
CTA: a warp reads and writes 32 consecutive floats, and each thread has one sigmoid on its path.

Backward, with sigma = sigmoid(mix * scale + base) recomputed: dz = grad * sigma (1 - sigma);
input_grad = dz * scale, base_grad[j] = sum_t dz[t, j], scale_grad = sum_t sum_j dz[t, j] * mix[t, j] (the
token's terms added in j order). The token sums go through kernel_src.mhc.chunk_sums (a partial per chunk of
64 tokens, added in a fixed order by a second kernel), so they are bitwise independent of the SM count. pre_eps
is a run-time argument: one binary per mhc.
"""

import tilelang  # noqa: F401  (before tvm: it sets up the tvm that tilelang ships)
from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.mhc import chunk_sums
from kernel_src.mhc.chunk_sums import CHUNK, WARP
from kernel_src.mhc.pre_split_mixes import check, pre_mix

FWD_TOKENS = 32  # tokens of a forward CTA (32 * mhc threads)


def build_fwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def head_compute_mix_fwd(
        input_mix: T.Tensor[(num_tokens, n), T.float32],
        scale: T.Tensor[(1,), T.float32],
        base: T.Tensor[(n,), T.float32],
        out: T.Tensor[(num_tokens, n), T.float32],
        pre_eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, FWD_TOKENS), threads=FWD_TOKENS * n) as pid:
            tid = T.get_thread_binding()
            token = pid * FWD_TOKENS + tid // n
            j = tid % n
            if token < num_tokens:
                out[token, j] = pre_mix(input_mix[token, j], scale[0], base[j], pre_eps)

    return KernelProgram(head_compute_mix_fwd, alignment={'input_mix': 16, 'scale': 4, 'base': 4, 'out': 16})


def build_bwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    num_terms = n + 1  # base_grad (n), then scale_grad
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def head_compute_mix_bwd(
        grad: T.Tensor[(num_tokens, n), T.float32],
        input_mix: T.Tensor[(num_tokens, n), T.float32],
        scale: T.Tensor[(1,), T.float32],
        base: T.Tensor[(n,), T.float32],
        input_grad: T.Tensor[(num_tokens, n), T.float32],
        partial: T.Tensor[(T.ceildiv(num_tokens, CHUNK), num_terms), T.float32],
        scale_grad: T.Tensor[(1,), T.float32],
        base_grad: T.Tensor[(n,), T.float32],
    ):
        with T.Kernel(chunk_sums.num_chunks(num_tokens), threads=CHUNK) as chunk:
            tid = T.get_thread_binding()
            token = chunk * CHUNK + tid
            terms = T.alloc_shared((num_terms, CHUNK), T.float32)
            m = T.alloc_local((n,), T.float32)
            dz = T.alloc_local((n,), T.float32)
            for j in T.unroll(n):
                dz[j] = T.float32(0)
                m[j] = T.float32(0)
            if token < num_tokens:
                for k in T.vectorized(n):
                    m[k] = input_mix[token, k]
                for k in T.vectorized(n):
                    dz[k] = grad[token, k]
                for j in T.unroll(n):
                    sigma = T.alloc_var(T.float32)
                    sigma = T.sigmoid(T.ieee_fmaf(m[j], scale[0], base[j]))
                    dz[j] = dz[j] * sigma * (1 - sigma)
                for k in T.vectorized(n):
                    input_grad[token, k] = dz[k] * scale[0]
            total = T.alloc_var(T.float32)
            total = dz[0] * m[0]
            for j in T.unroll(1, n):
                total = total + dz[j] * m[j]
            for j in T.unroll(n):
                terms[j, tid] = dz[j]
            terms[n, tid] = total
            chunk_sums.write_chunk_partial(terms, partial, num_terms, chunk, tid)

        with T.Kernel(1, threads=WARP * num_terms):
            tid = T.get_thread_binding()
            term, lane = tid // WARP, tid % WARP
            if term < n:
                chunk_sums.reduce_chunk_partials(partial, chunk_sums.num_chunks(num_tokens), term, lane, base_grad, term)
            else:
                chunk_sums.reduce_chunk_partials(partial, chunk_sums.num_chunks(num_tokens), term, lane, scale_grad, 0)

    return KernelProgram(head_compute_mix_bwd, alignment={
        'grad': 16, 'input_mix': 16, 'scale': 4, 'base': 4, 'input_grad': 16, 'partial': 4, 'scale_grad': 4, 'base_grad': 4})


def prebuilt():
    for mhc in models.mhc_mults():
        yield dict(mhc=mhc)


PARAMS = (param('mhc', 'int', 'm'),)
PASS_CONFIGS = {'tl.disable_warp_specialized': True}
FWD = KernelDecl('mhc.head_compute_mix_fwd', PARAMS, build_fwd, prebuilt, check, PASS_CONFIGS,
                 constants={'tokens_per_block': FWD_TOKENS})
BWD = KernelDecl('mhc.head_compute_mix_bwd', PARAMS, build_bwd, prebuilt, check, PASS_CONFIGS,
                 constants={'chunk_tokens': CHUNK})
