"""mhc.sinkhorn_fwd and mhc.sinkhorn_bwd: Sinkhorn normalisation of (T, n, n) float32 matrices, n = mhc.

Forward, per token: x = softmax(x, -1) + eps; x /= colsum(x) + eps; then repeat - 1 rounds of
x /= rowsum(x) + eps; x /= colsum(x) + eps. A token's matrix is spread over a group of `lanes(n)` lanes of one
warp, one element a lane (lane j * n + k holds x[j, k]; n * n <= lanes, the spare lanes of a group compute on
zeros and store nothing). A row or column sum gathers the n values of the line with warp shuffles and adds them
in ascending index order, and every normalisation is an IEEE division, exactly as the macros below write it, so
the results are those of a serial loop over the matrix, bit for bit. mhc.pre_big_fuse runs the same macros, so
its comb_mix is bitwise the forward's. Every lane of a warp runs every shuffle: a group past the last token
works on zeros instead of branching away.

Backward: exact reverse mode through the softmax and all 2 * repeat normalisations. A step y = x / (s + eps)
(s the row or column sums of x) has dL/dx = (g - sum(g * x) / (s + eps)) / (s + eps), the sum along the
normalised axis, so it needs its input x. The kernel reruns the forward and keeps each lane's element of the
input of every step but the first in shared memory, then walks the steps backwards, recomputing each step's sums
from the saved input (bit for bit the forward's); the first step's input (softmax + eps) comes from the
softmax, which stays in a register. Shared memory, not recomputation, holds the intermediates: recomputing each
step's input from the start costs O(repeat^2) steps, while the saved inputs cost 4 bytes a step and lane. Shared
memory has a compile-time size, so the run-time repeat has a maximum, MAX_REPEAT (the decl's constant
`max_repeat`, which the op checks): 24 covers DeepSeek-V4's 20 and upstream's default 10 and keeps nine CTAs
resident per SM. A lane reads back only what it wrote, so the backward needs no barrier; its shared memory is
laid out [step][thread], so the 32 lanes of a warp hit 32 banks.

repeat and eps are run-time arguments (int32, float32): one binary per n serves every model.
"""

import tilelang  # noqa: F401  (before tvm: it sets up the tvm that tilelang ships)
from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

FWD_TOKENS = 8  # tokens of a forward CTA
BWD_TOKENS = 8  # tokens of a backward CTA
MAX_REPEAT = 24  # the backward's shared memory holds the inputs of 2 * MAX_REPEAT - 1 steps
MAX_MHC = 4  # a token's n * n elements fit one group of at most 16 lanes


def check(mhc: int) -> None:
    if not 2 <= mhc <= MAX_MHC:
        raise ValueError(f'mhc must be in [2, {MAX_MHC}], got {mhc}')


def lanes(n: int) -> int:
    """Lanes a token's matrix is spread over: n * n rounded up to a power of two (4 or 16)."""
    return 1 << (n * n - 1).bit_length()


class Element:
    """The (row, col) of the matrix element a thread holds, from its index in the CTA."""

    def __init__(self, tid, n: int):
        self.n, self.width = n, lanes(n)
        self.group, self.lane = tid // self.width, tid % self.width  # the lane holds element lane = row * n + col
        self.row, self.col = self.lane // n, self.lane % n
        self.valid = self.lane < n * n

    def line_sum(self, value, rows: bool):
        """sum(value) over the element's row (rows=True) or column, in ascending index order, by shuffles."""
        n, width = self.n, self.width
        source = (lambda i: self.row * n + i) if rows else (lambda i: i * n + self.col)
        total = T.shfl_sync(value, source(0), width)
        for i in range(1, n):
            total = total + T.shfl_sync(value, source(i), width)
        return total

    def row_max(self, value):
        total = T.shfl_sync(value, self.row * self.n, self.width)
        for i in range(1, self.n):
            total = T.max(total, T.shfl_sync(value, self.row * self.n + i, self.width))
        return total


@T.macro
def softmax(v, e):
    """v[0] = softmax(row)[col] of the element e holds: exp(v - rowmax) / rowsum."""
    row_max = T.alloc_var(T.float32)
    row_max = e.row_max(v[0])
    v[0] = T.exp(v[0] - row_max)
    total = T.alloc_var(T.float32)
    total = e.line_sum(v[0], True)
    v[0] = v[0] / total


@T.macro
def normalize(v, e, eps, rows):
    """v[0] /= sum of its row (rows=True) or column + eps."""
    divisor = T.alloc_var(T.float32)
    divisor = e.line_sum(v[0], rows) + eps
    v[0] = v[0] / divisor


@T.macro
def sinkhorn_normalize(v, e, repeat, eps):
    """The whole forward on the element v[0] of the lanes' matrix (the mhc.sinkhorn_fwd arithmetic)."""
    softmax(v, e)
    v[0] = v[0] + eps
    normalize(v, e, eps, False)
    for _ in T.serial(repeat - 1):
        normalize(v, e, eps, True)
        normalize(v, e, eps, False)


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
        with T.Kernel(T.ceildiv(num_tokens, FWD_TOKENS), threads=FWD_TOKENS * lanes(n)) as pid:
            e = Element(T.get_thread_binding(), n)
            token = pid * FWD_TOKENS + e.group
            v = T.alloc_local((1,), T.float32)
            v[0] = 0
            if token < num_tokens and e.valid:
                v[0] = x[token, e.row, e.col]
            sinkhorn_normalize(v, e, repeat, eps)
            if token < num_tokens and e.valid:
                out[token, e.row, e.col] = v[0]

    return KernelProgram(sinkhorn_fwd, alignment={'x': 16, 'out': 16})


@T.macro
def _backward_step(g, x, e, eps, rows):
    """g[0] = dL/d(input) of the step y = x / (s + eps) along rows (rows=True) or columns, from g[0] = dL/dy."""
    divisor = T.alloc_var(T.float32)
    dot = T.alloc_var(T.float32)
    divisor = e.line_sum(x[0], rows) + eps
    dot = e.line_sum(g[0] * x[0], rows) / divisor
    g[0] = (g[0] - dot) / divisor


def build_bwd(arch: Arch, mhc: int) -> KernelProgram:
    n = mhc
    num_tokens = T.dynamic('num_tokens')
    threads = BWD_TOKENS * lanes(n)
    slots = 2 * MAX_REPEAT - 1  # inputs of steps 1 .. 2 * repeat - 1

    @T.prim_func
    def sinkhorn_bwd(
        grad_out: T.Tensor[(num_tokens, n, n), T.float32],
        x: T.Tensor[(num_tokens, n, n), T.float32],
        grad_in: T.Tensor[(num_tokens, n, n), T.float32],
        repeat: T.int32,
        eps: T.float32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, BWD_TOKENS), threads=threads) as pid:
            tid = T.get_thread_binding()
            e = Element(tid, n)
            token = pid * BWD_TOKENS + e.group
            saved = T.alloc_shared((slots, threads), T.float32)
            p = T.alloc_local((1,), T.float32)  # the softmax
            m = T.alloc_local((1,), T.float32)
            g = T.alloc_local((1,), T.float32)
            p[0] = 0
            g[0] = 0
            if token < num_tokens and e.valid:
                p[0] = x[token, e.row, e.col]
                g[0] = grad_out[token, e.row, e.col]
            # Forward, saving the input of steps 1 .. 2 * repeat - 1 (step 2s + 1 normalises rows).
            softmax(p, e)
            m[0] = p[0] + eps
            normalize(m, e, eps, False)
            for s in T.serial(repeat - 1):
                saved[2 * s, tid] = m[0]
                normalize(m, e, eps, True)
                saved[2 * s + 1, tid] = m[0]
                normalize(m, e, eps, False)
            # Backward through steps 2 * repeat - 1 .. 1, columns then rows.
            for r in T.serial(repeat - 1):
                s = repeat - 2 - r
                m[0] = saved[2 * s + 1, tid]
                _backward_step(g, m, e, eps, False)
                m[0] = saved[2 * s, tid]
                _backward_step(g, m, e, eps, True)
            # Step 0 (columns of p + eps), then the softmax: dL/dx = (g - sum(g * p)) * p along the row.
            m[0] = p[0] + eps
            _backward_step(g, m, e, eps, False)
            dot = T.alloc_var(T.float32)
            dot = e.line_sum(g[0] * p[0], True)
            g[0] = (g[0] - dot) * p[0]
            if token < num_tokens and e.valid:
                grad_in[token, e.row, e.col] = g[0]

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
