"""engram.engram_gate_bwd: gradients of the Engram gate (engram_gate_fwd) for x, k, v and the fused weight.

Per row (t, h), with c = rstd_x * rstd_k / sqrt(H) and G = sum(grad_out[t, h] * v[t]) (dL/dgate):
D = 0 where |dot| * c < clamp, else G * gate * (1 - gate) * sqrt(c / |dot|) / 2 (dL/d(dot));
grad_x = grad_out + D * (k * wf - x * dot * rstd_x^2 / H), grad_k = D * (x * wf - k * dot * rstd_k^2 / H),
grad_v[t] = sum over h of grad_out[t, h] * gate[t, h] (h = 0..3 in order), and the fused-weight gradient
sum over t of D * x * k.

Work unit: a chunk of `tokens_per_partial` consecutive tokens (a run-time argument the op derives from the
token count alone) and one stream h. A persistent grid of `num_blocks` CTAs walks the units c * 4 + h in a
grid-stride loop; a CTA walks its chunk's tokens in order, reads each row's grad_out, v, x and k at once
(common.py's row layout), adds G over the CTA (common.block_sum), writes grad_x and grad_k, and keeps the
weight gradient of its slice of the row in registers. At the chunk's end it writes them to
grad_w_partial[c, h]: the partials, and so the sum grad_w_reduce makes of them in chunk order, do not
depend on the grid, only on the token count. grad_v[t] is written by the unit of stream t % 4, which reads
grad_out[t] of all four streams for it (the four units of a chunk run side by side, so those reads mostly
hit L2). The clamp, the token count and the row strides of k and v are run-time; the spec is H.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.engram.common import HC, HIDDEN_PARAMS, VEC, block_sum, check_hidden, hidden_specs, warps_for

MAX_WARPS = 8
MAX_TOKENS_PER_PARTIAL = 32  # the op's chunk: ceil(T / MIN_PARTIALS) tokens, at most this many
MIN_PARTIALS = 128  # chunks the op aims for: enough units (4 a chunk) to fill the grid at small T
CTAS_PER_SM = 2  # resident CTAs an SM must hold: the register cap ptxas gets, and the grid's CTAs an SM


def build(arch: Arch, hidden: int) -> KernelProgram:
    warps = warps_for(hidden, MAX_WARPS)
    threads = 32 * warps
    vecs = hidden // (VEC * threads)
    row_elems = vecs * VEC
    num_tokens, num_partials = T.dynamic('num_tokens'), T.dynamic('num_partials')
    k_stride_t, k_stride_h, v_stride_t = T.dynamic('k_stride_t'), T.dynamic('k_stride_h'), T.dynamic('v_stride_t')
    scale = hidden ** -0.5  # rounded to float32 where it is used

    @T.prim_func
    def engram_gate_bwd(
        grad_out: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        x: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        k: T.StridedTensor[(num_tokens, HC, hidden), (k_stride_t, k_stride_h, 1), T.bfloat16],
        v: T.StridedTensor[(num_tokens, hidden), (v_stride_t, 1), T.bfloat16],
        weight_fused: T.Tensor[(HC, hidden), T.float32],
        dot: T.Tensor[(num_tokens, HC), T.float32],
        gate: T.Tensor[(num_tokens, HC), T.float32],
        rstd_x: T.Tensor[(num_tokens, HC), T.float32],
        rstd_k: T.Tensor[(num_tokens, HC), T.float32],
        grad_x: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        grad_k: T.Tensor[(num_tokens, HC, hidden), T.bfloat16],
        grad_v: T.Tensor[(num_tokens, hidden), T.bfloat16],
        grad_w_partial: T.Tensor[(num_partials, HC, hidden), T.float32],
        clamp_value: T.float32,
        tokens_per_partial: T.int32,
        num_blocks: T.int32,
    ):
        with T.Kernel(num_blocks, threads=threads) as pid:
            T.annotate_min_blocks_per_sm(CTAS_PER_SM)
            T.assume(k_stride_t % VEC == 0)
            T.assume(k_stride_h % VEC == 0)
            T.assume(v_stride_t % VEC == 0)
            tid = T.get_thread_binding()
            gos = T.alloc_local((row_elems,), T.bfloat16)
            vs = T.alloc_local((row_elems,), T.bfloat16)
            xs = T.alloc_local((row_elems,), T.bfloat16)
            ks = T.alloc_local((row_elems,), T.bfloat16)
            heads = T.alloc_local((HC * VEC,), T.bfloat16)
            w = T.alloc_local((VEC,), T.float32)
            gv = T.alloc_local((VEC,), T.float32)
            gw = T.alloc_local((row_elems,), T.float32)
            sums = T.alloc_local((1,), T.float32)
            gates = T.alloc_local((HC,), T.float32)
            shared = T.alloc_shared((2, warps, 1), T.float32)
            parity = T.alloc_var(T.int32)
            g = T.alloc_var(T.float32)
            c = T.alloc_var(T.float32)
            d_dot = T.alloc_var(T.float32)
            dot_x = T.alloc_var(T.float32)
            dot_k = T.alloc_var(T.float32)
            parity = 0
            for it in T.serial(T.ceildiv(num_partials * HC, num_blocks)):
                unit = it * num_blocks + pid
                if unit < num_partials * HC:
                    chunk = unit // HC
                    h = unit % HC
                    first = chunk * tokens_per_partial
                    for e in T.unroll(row_elems):
                        gw[e] = T.float32(0)
                    for step in T.serial(T.min(tokens_per_partial, num_tokens - first)):
                        t = first + step
                        for i in T.unroll(vecs):
                            for e in T.vectorized(VEC):
                                gos[i * VEC + e] = grad_out[t, h, (i * threads + tid) * VEC + e]
                            for e in T.vectorized(VEC):
                                vs[i * VEC + e] = v[t, (i * threads + tid) * VEC + e]
                            for e in T.vectorized(VEC):
                                xs[i * VEC + e] = x[t, h, (i * threads + tid) * VEC + e]
                            for e in T.vectorized(VEC):
                                ks[i * VEC + e] = k[t, h, (i * threads + tid) * VEC + e]
                        sums[0] = T.float32(0)
                        for i in T.unroll(vecs):
                            for e in T.unroll(VEC):
                                sums[0] = sums[0] + T.Cast(T.float32, gos[i * VEC + e]) * T.Cast(T.float32, vs[i * VEC + e])
                        block_sum(sums, 1, shared, parity, tid, warps)
                        parity = 1 - parity
                        g = gate[t, h]
                        c = rstd_x[t, h] * rstd_k[t, h] * T.float32(scale)
                        d_dot = T.if_then_else(
                            T.abs(dot[t, h]) * c < clamp_value, T.float32(0),
                            sums[0] * g * (T.float32(1) - g) * T.float32(0.5) * T.sqrt(c / T.abs(dot[t, h])))
                        dot_x = dot[t, h] * rstd_x[t, h] * rstd_x[t, h] / T.float32(hidden)
                        dot_k = dot[t, h] * rstd_k[t, h] * rstd_k[t, h] / T.float32(hidden)
                        for i in T.unroll(vecs):
                            for e in T.vectorized(VEC):
                                w[e] = weight_fused[h, (i * threads + tid) * VEC + e]
                            for e in T.vectorized(VEC):
                                grad_x[t, h, (i * threads + tid) * VEC + e] = T.Cast(T.bfloat16, T.Cast(T.float32, gos[i * VEC + e]) + d_dot * (
                                    T.Cast(T.float32, ks[i * VEC + e]) * w[e] - T.Cast(T.float32, xs[i * VEC + e]) * dot_x))
                            for e in T.vectorized(VEC):
                                grad_k[t, h, (i * threads + tid) * VEC + e] = T.Cast(T.bfloat16, d_dot * (
                                    T.Cast(T.float32, xs[i * VEC + e]) * w[e] - T.Cast(T.float32, ks[i * VEC + e]) * dot_k))
                            for e in T.unroll(VEC):
                                gw[i * VEC + e] = gw[i * VEC + e] + d_dot * T.Cast(T.float32, xs[i * VEC + e]) * T.Cast(T.float32, ks[i * VEC + e])
                        if t % HC == h:
                            for j in T.unroll(HC):
                                gates[j] = gate[t, j]
                            for i in T.unroll(vecs):
                                for j in T.unroll(HC):
                                    for e in T.vectorized(VEC):
                                        heads[j * VEC + e] = grad_out[t, j, (i * threads + tid) * VEC + e]
                                for e in T.unroll(VEC):
                                    gv[e] = T.Cast(T.float32, heads[e]) * gates[0]
                                    for j in T.unroll(1, HC):
                                        gv[e] = gv[e] + T.Cast(T.float32, heads[j * VEC + e]) * gates[j]
                                for e in T.vectorized(VEC):
                                    grad_v[t, (i * threads + tid) * VEC + e] = T.Cast(T.bfloat16, gv[e])
                    for i in T.unroll(vecs):
                        for e in T.vectorized(VEC):
                            grad_w_partial[chunk, h, (i * threads + tid) * VEC + e] = gw[i * VEC + e]

    alignment = {name: 16 for name in ('grad_out', 'x', 'k', 'v', 'weight_fused', 'grad_x', 'grad_k', 'grad_v', 'grad_w_partial')}
    alignment.update(dot=4, gate=4, rstd_x=4, rstd_k=4)
    return KernelProgram(engram_gate_bwd, alignment=alignment)


def check(hidden: int) -> None:
    check_hidden(hidden, MAX_WARPS)


def prebuilt():
    return hidden_specs(MAX_WARPS)


DECL = KernelDecl(
    name='engram.engram_gate_bwd',
    params=HIDDEN_PARAMS,
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={
        'tl.disable_warp_specialized': True,
        'tl.disable_thread_storage_sync': True,  # block_sum places the one barrier a row needs
        'tl.disable_safe_memory_legalize': True,  # every access is in bounds by the loop bounds
    },
    # The op sizes the grid (ctas_per_sm times the SM count) and the chunks from these.
    constants={'ctas_per_sm': CTAS_PER_SM, 'max_tokens_per_partial': MAX_TOKENS_PER_PARTIAL, 'min_partials': MIN_PARTIALS},
)
