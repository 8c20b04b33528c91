"""mhc.sinkhorn_fwd and mhc.sinkhorn_bwd: Sinkhorn normalisation of (T, n, n) float32 matrices, n = mhc.

Forward, per token: x = softmax(x, -1) + eps; x /= colsum(x) + eps; then repeat - 1 rounds of
x /= rowsum(x) + eps; x /= colsum(x) + eps. One thread owns one token: its n x n matrix lives in registers
(16-byte loads and stores of whole rows, so a warp reads and writes one contiguous span), every sum is taken
in ascending index order and every normalisation is an IEEE division, exactly as the macros below write it.
mhc.pre_big_fuse runs the same macros, so its comb_mix is bitwise the forward's.

Backward: exact reverse mode through the softmax and all 2 * repeat normalisations. A step y = x / (s + eps)
(s the row or column sums of x) has dL/dx = (g - sum(g * x) / (s + eps)) / (s + eps), the sum along the
normalised axis, so it needs its input x. The kernel reruns the forward and keeps the input of every step but
the first in shared memory, then walks the steps backwards; the first step's input (softmax + eps) and the
softmax itself are recomputed from the token's logits, bit for bit as the forward made them, as are all sums.
Shared memory, not recomputation, holds the intermediates: recomputing each step's input from the start costs
O(repeat^2) steps (about 20 forward passes at repeat 20), while the saved inputs cost 64 bytes a step and
token. Shared memory has a compile-time size, so the run-time repeat has a maximum, MAX_REPEAT (the decl's
constant `max_repeat`, which the op checks): 24 covers DeepSeek-V4's 20 and upstream's default 10 and keeps
two CTAs of BWD_TOKENS tokens resident per SM. A CTA of the backward is one warp of BWD_TOKENS tokens; its
shared memory is laid out [step][row][col][token], so the 32 lanes of a warp hit 32 banks.

repeat and eps are run-time arguments (int32, float32): one binary per n serves every model.
"""

import tilelang  # noqa: F401  (before tvm: it sets up the tvm that tilelang ships)
from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

FWD_TOKENS = 64  # threads (tokens) of a forward CTA
BWD_TOKENS = 32  # threads (tokens) of a backward CTA: one warp
MAX_REPEAT = 24  # the backward's shared memory holds the inputs of 2 * MAX_REPEAT - 1 steps
MAX_MHC = 4  # shared memory of the backward: BWD_TOKENS * (2 * MAX_REPEAT - 1) * n * n floats


def check(mhc: int) -> None:
    if not 2 <= mhc <= MAX_MHC:
        raise ValueError(f'mhc must be in [2, {MAX_MHC}], got {mhc}')


def _row_sum(m, n, j):
    total = m[j, 0]
    for k in range(1, n):
        total = total + m[j, k]
    return total


def _col_sum(m, n, k):
    total = m[0, k]
    for j in range(1, n):
        total = total + m[j, k]
    return total


@T.macro
def softmax(m, n):
    """m = softmax(m, -1) in place on an (n, n) local buffer: exp(m - rowmax) / rowsum."""
    for j in T.unroll(n):
        row_max = T.alloc_var(T.float32)
        row_max = m[j, 0]
        for k in T.unroll(1, n):
            row_max = T.max(row_max, m[j, k])
        for k in T.unroll(n):
            m[j, k] = T.exp(m[j, k] - row_max)
        total = T.alloc_var(T.float32)
        total = _row_sum(m, n, j)
        for k in T.unroll(n):
            m[j, k] = m[j, k] / total


@T.macro
def softmax_plus_eps(m, n, eps):
    """m = softmax(m, -1) + eps (the sum rounded before eps is added, as the backward recomputes it)."""
    softmax(m, n)
    for j in T.unroll(n):
        for k in T.unroll(n):
            m[j, k] = m[j, k] + eps


@T.macro
def normalize_rows(m, n, eps):
    """m[j, :] /= sum(m[j, :]) + eps."""
    for j in T.unroll(n):
        divisor = T.alloc_var(T.float32)
        divisor = _row_sum(m, n, j) + eps
        for k in T.unroll(n):
            m[j, k] = m[j, k] / divisor


@T.macro
def normalize_cols(m, n, eps):
    """m[:, k] /= sum(m[:, k]) + eps."""
    for k in T.unroll(n):
        divisor = T.alloc_var(T.float32)
        divisor = _col_sum(m, n, k) + eps
        for j in T.unroll(n):
            m[j, k] = m[j, k] / divisor


@T.macro
def sinkhorn_normalize(m, n, repeat, eps):
    """The whole forward on one token's (n, n) local buffer (the mhc.sinkhorn_fwd arithmetic)."""
    softmax_plus_eps(m, n, eps)
    normalize_cols(m, n, eps)
    for _ in T.serial(repeat - 1):
        normalize_rows(m, n, eps)
        normalize_cols(m, n, eps)


def build_fwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    num_tokens = T.dynamic('num_tokens')

    @T.prim_func
    def sinkhorn_fwd(
        x: T.Tensor[(num_tokens, n, n), T.float32],
        out: T.Tensor[(num_tokens, n, n), T.float32],
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, FWD_TOKENS), threads=FWD_TOKENS) as pid:
            token = pid * FWD_TOKENS + T.get_thread_binding()
            m = T.alloc_local((n, n), T.float32)
            if token < num_tokens:
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        m[j, k] = x[token, j, k]
                sinkhorn_normalize(m, n, repeat, eps)
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        out[token, j, k] = m[j, k]

    return KernelProgram(sinkhorn_fwd, alignment={'x': 16, 'out': 16})


@T.macro
def _backward_step(g, x, n, eps, rows):
    """g = dL/d(input) of the step y = x / (s + eps) along rows (rows=True) or columns, from g = dL/dy."""
    for a in T.unroll(n):
        divisor = T.alloc_var(T.float32)
        dot = T.alloc_var(T.float32)
        if rows:
            divisor = _row_sum(x, n, a) + eps
            dot = g[a, 0] * x[a, 0]
            for b in T.unroll(1, n):
                dot = dot + g[a, b] * x[a, b]
            dot = dot / divisor
            for b in T.unroll(n):
                g[a, b] = (g[a, b] - dot) / divisor
        else:
            divisor = _col_sum(x, n, a) + eps
            dot = g[0, a] * x[0, a]
            for b in T.unroll(1, n):
                dot = dot + g[b, a] * x[b, a]
            dot = dot / divisor
            for b in T.unroll(n):
                g[b, a] = (g[b, a] - dot) / divisor


def build_bwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    num_tokens = T.dynamic('num_tokens')
    slots = 2 * MAX_REPEAT - 1  # inputs of steps 1 .. 2 * repeat - 1

    @T.prim_func
    def sinkhorn_bwd(
        grad_out: T.Tensor[(num_tokens, n, n), T.float32],
        x: T.Tensor[(num_tokens, n, n), T.float32],
        grad_in: T.Tensor[(num_tokens, n, n), T.float32],
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, BWD_TOKENS), threads=BWD_TOKENS) as pid:
            tid = T.get_thread_binding()
            token = pid * BWD_TOKENS + tid
            saved = T.alloc_shared((slots, n, n, BWD_TOKENS), T.float32)
            logits = T.alloc_local((n, n), T.float32)
            m = T.alloc_local((n, n), T.float32)
            g = T.alloc_local((n, n), T.float32)
            if token < num_tokens:
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        logits[j, k] = x[token, j, k]
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        g[j, k] = grad_out[token, j, k]
                # Forward, saving the input of steps 1 .. 2 * repeat - 1 (step 2s + 1 normalises rows).
                for j in T.unroll(n):
                    for k in T.unroll(n):
                        m[j, k] = logits[j, k]
                softmax_plus_eps(m, n, eps)
                normalize_cols(m, n, eps)
                for s in T.serial(repeat - 1):
                    for j in T.unroll(n):
                        for k in T.unroll(n):
                            saved[2 * s, j, k, tid] = m[j, k]
                    normalize_rows(m, n, eps)
                    for j in T.unroll(n):
                        for k in T.unroll(n):
                            saved[2 * s + 1, j, k, tid] = m[j, k]
                    normalize_cols(m, n, eps)
                # Backward through steps 2 * repeat - 1 .. 1, columns then rows.
                for r in T.serial(repeat - 1):
                    s = repeat - 2 - r
                    for j in T.unroll(n):
                        for k in T.unroll(n):
                            m[j, k] = saved[2 * s + 1, j, k, tid]
                    _backward_step(g, m, n, eps, False)
                    for j in T.unroll(n):
                        for k in T.unroll(n):
                            m[j, k] = saved[2 * s, j, k, tid]
                    _backward_step(g, m, n, eps, True)
                # Step 0 (columns of p + eps, p the softmax), then the softmax: dL/dx = (g - sum(g * p)) * p.
                for j in T.unroll(n):
                    for k in T.unroll(n):
                        m[j, k] = logits[j, k]
                softmax(m, n)
                for j in T.unroll(n):
                    for k in T.unroll(n):
                        logits[j, k] = m[j, k] + eps
                _backward_step(g, logits, n, eps, False)
                for j in T.unroll(n):
                    dot = T.alloc_var(T.float32)
                    dot = g[j, 0] * m[j, 0]
                    for k in T.unroll(1, n):
                        dot = dot + g[j, k] * m[j, k]
                    for k in T.unroll(n):
                        g[j, k] = (g[j, k] - dot) * m[j, k]
                for j in T.unroll(n):
                    for k in T.vectorized(n):
                        grad_in[token, j, k] = g[j, k]

    return KernelProgram(sinkhorn_bwd, alignment={'grad_out': 16, 'x': 16, 'grad_in': 16})


def prebuilt():
    for mhc in models.mhc_mults():
        yield dict(mhc=mhc)


PARAMS = (param('mhc', 'int', 'm'),)
PASS_CONFIGS = {'tl.disable_warp_specialized': True}
FWD = KernelDecl('mhc.sinkhorn_fwd', PARAMS, build_fwd, prebuilt, check, PASS_CONFIGS,
                 constants={'tokens_per_block': FWD_TOKENS, 'max_repeat': MAX_REPEAT})
BWD = KernelDecl('mhc.sinkhorn_bwd', PARAMS, build_bwd, prebuilt, check, PASS_CONFIGS,
                 constants={'tokens_per_block': BWD_TOKENS, 'max_repeat': MAX_REPEAT})
