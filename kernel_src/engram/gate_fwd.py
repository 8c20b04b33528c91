"""engram.engram_gate_fwd: the Engram gate, out = x + sigmoid(signed_sqrt(s)) * v per token and stream.

For row (t, h) of x and k (T, 4, H): rstd_x = rsqrt(mean(x^2) + eps), rstd_k likewise, dot = sum(x * wf * k)
(wf = weight_hidden * weight_embed, fp32), s = dot * rstd_x * rstd_k / sqrt(H), z = sign(s) * sqrt(max(|s|, clamp)),
gate = sigmoid(z), out = bf16(x + gate * v[t]). With `save` the kernel also writes dot, gate, rstd_x and rstd_k
(T, 4) for the backward pass; without it those buffers are not parameters at all.

A persistent grid of `num_blocks` CTAs (a run-time argument: the op sizes it from the SM count) walks the rows
t * 4 + h in a grid-stride loop. A CTA reads a row's x and k into registers (common.py's layout: all its
loads in flight at once), sums the three products per thread in element order, adds them over the CTA
(common.block_sum), then reads v[t] and writes the output row from the x it kept. Rows are independent: the
result does not depend on the grid. eps, clamp, the token count and the row strides of k (token and stream)
and v (token) are run-time; the spec is H and `save`.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.engram.common import HC, HIDDEN_PARAMS, VEC, block_sum, check_hidden, hidden_specs, warps_for

MAX_WARPS = 4  # a row per 128 threads or fewer: each thread holds 2..8 vectors of x
CTAS_PER_SM = 4  # resident CTAs an SM must hold: the register cap ptxas gets, and the grid's CTAs an SM
SUMS = 3  # sum x^2, sum k^2, sum x*wf*k


def build(arch: Arch, hidden: int, save: bool) -> KernelProgram:
    warps = warps_for(hidden, MAX_WARPS)
    threads = 32 * warps
    vecs = hidden // (VEC * threads)
    row_elems = vecs * VEC
    num_tokens = T.dynamic('num_tokens')
    k_stride_t, k_stride_h, v_stride_t = T.dynamic('k_stride_t'), T.dynamic('k_stride_h'), T.dynamic('v_stride_t')
    scale = hidden ** -0.5  # rounded to float32 where it is used

    @T.macro
    def gate_rows(x, k, v, weight_fused, out, dot, gate, rstd_x, rstd_k, eps, clamp_value, num_blocks):
        with T.Kernel(num_blocks, threads=threads) as pid:
            T.annotate_min_blocks_per_sm(CTAS_PER_SM)
            T.assume(k_stride_t % VEC == 0)
            T.assume(k_stride_h % VEC == 0)
            T.assume(v_stride_t % VEC == 0)
            tid = T.get_thread_binding()
            xs = T.alloc_local((row_elems,), T.bfloat16)
            ks = T.alloc_local((row_elems,), T.bfloat16)
            vs = T.alloc_local((row_elems,), T.bfloat16)
            w = T.alloc_local((VEC,), T.float32)
            sums = T.alloc_local((SUMS,), T.float32)
            shared = T.alloc_shared((2, warps, SUMS), T.float32)
            rx = T.alloc_var(T.float32)
            rk = T.alloc_var(T.float32)
            s = T.alloc_var(T.float32)
            root = T.alloc_var(T.float32)
            g = T.alloc_var(T.float32)
            for it in T.serial(T.ceildiv(num_tokens * HC, num_blocks)):
                row = it * num_blocks + pid
                if row < num_tokens * HC:
                    t = row // HC
                    h = row % HC
                    for i in T.unroll(vecs):
                        for e in T.vectorized(VEC):
                            xs[i * VEC + e] = x[t, h, (i * threads + tid) * VEC + e]
                        for e in T.vectorized(VEC):
                            ks[i * VEC + e] = k[t, h, (i * threads + tid) * VEC + e]
                    for j in T.unroll(SUMS):
                        sums[j] = T.float32(0)
                    for i in T.unroll(vecs):
                        for e in T.vectorized(VEC):
                            w[e] = weight_fused[h, (i * threads + tid) * VEC + e]
                        for e in T.unroll(VEC):
                            xf = T.Cast(T.float32, xs[i * VEC + e])
                            kf = T.Cast(T.float32, ks[i * VEC + e])
                            sums[0] = sums[0] + xf * xf
                            sums[1] = sums[1] + kf * kf
                            sums[2] = sums[2] + xf * w[e] * kf
                    block_sum(sums, SUMS, shared, it % 2, tid, warps)
                    # v[t] is read once the sums are in: its loads overlap the gate's arithmetic.
                    for i in T.unroll(vecs):
                        for e in T.vectorized(VEC):
                            vs[i * VEC + e] = v[t, (i * threads + tid) * VEC + e]
                    rx = T.rsqrt(sums[0] / T.float32(hidden) + eps)
                    rk = T.rsqrt(sums[1] / T.float32(hidden) + eps)
                    s = sums[2] * rx * rk * T.float32(scale)
                    root = T.sqrt(T.max(T.abs(s), clamp_value))
                    # torch's sign: 0 at s == 0, so the gate is sigmoid(0) there.
                    root = T.if_then_else(s > T.float32(0), root, T.if_then_else(s < T.float32(0), -root, T.float32(0)))
                    g = T.float32(1) / (T.float32(1) + T.exp(-root))
                    if save:  # noqa: SIM102 (a Python constant: the branch exists only in the save variant)
                        if tid == 0:
                            dot[t, h] = sums[2]
                            gate[t, h] = g
                            rstd_x[t, h] = rx
                            rstd_k[t, h] = rk
                    for i in T.unroll(vecs):
                        for e in T.vectorized(VEC):
                            out[t, h, (i * threads + tid) * VEC + e] = T.Cast(
                                T.bfloat16, T.Cast(T.float32, xs[i * VEC + e]) + g * T.Cast(T.float32, vs[i * VEC + e]))

    if save:
        @T.prim_func
        def engram_gate_fwd(
            x: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
            k: T.StridedTensor[(num_tokens, HC, hidden), (k_stride_t, k_stride_h, 1), T.bfloat16],
            v: T.StridedTensor[(num_tokens, hidden), (v_stride_t, 1), T.bfloat16],
            weight_fused: T.Tensor[(HC, hidden), T.float32],
            out: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
            dot: T.Tensor[(num_tokens, HC), T.float32],
            gate: T.Tensor[(num_tokens, HC), T.float32],
            rstd_x: T.Tensor[(num_tokens, HC), T.float32],
            rstd_k: T.Tensor[(num_tokens, HC), T.float32],
            eps: T.float32,
            clamp_value: T.float32,
            num_blocks: T.int32,
        ):
            gate_rows(x, k, v, weight_fused, out, dot, gate, rstd_x, rstd_k, eps, clamp_value, num_blocks)
    else:
        @T.prim_func
        def engram_gate_fwd(
            x: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
            k: T.StridedTensor[(num_tokens, HC, hidden), (k_stride_t, k_stride_h, 1), T.bfloat16],
            v: T.StridedTensor[(num_tokens, hidden), (v_stride_t, 1), T.bfloat16],
            weight_fused: T.Tensor[(HC, hidden), T.float32],
            out: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
            eps: T.float32,
            clamp_value: T.float32,
            num_blocks: T.int32,
        ):
            gate_rows(x, k, v, weight_fused, out, None, None, None, None, eps, clamp_value, num_blocks)

    alignment = {'x': 16, 'k': 16, 'v': 16, 'weight_fused': 16, 'out': 16}
    if save:
        alignment.update(dot=4, gate=4, rstd_x=4, rstd_k=4)
    return KernelProgram(engram_gate_fwd, alignment=alignment)


def check(hidden: int, save: bool) -> None:
    check_hidden(hidden, MAX_WARPS)


def prebuilt():
    for spec in hidden_specs(MAX_WARPS):
        for save in (True, False):
            yield dict(spec, save=save)


DECL = KernelDecl(
    name='engram.engram_gate_fwd',
    params=HIDDEN_PARAMS + (param('save', 'bool', 'save'),),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={
        'tl.disable_warp_specialized': True,
        # block_sum places the one barrier a row needs; tilelang's own would add one before each shared write.
        'tl.disable_thread_storage_sync': True,
        'tl.disable_safe_memory_legalize': True,  # every access is in bounds by the loop bounds
    },
    constants={'ctas_per_sm': CTAS_PER_SM},  # the op's grid: this many CTAs an SM, at most one a row
)
