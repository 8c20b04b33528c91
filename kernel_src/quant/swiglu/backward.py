"""SwiGLU backward + per-token cast of the input gradient: quant.swiglu_backward_and_per_token_cast.

One CTA of BWD_THREADS threads per row of the fused layout, BWD_ELEMS elements per thread and step; the formulas are
in the module docstring of tile_kernels_aot.quant.swiglu. The (1, 32) or (1, 128) block width of the e4m3 gradient
is a run-time argument (npc_log2).
"""

from tilelang import language as T

from kernel_src.bounds import device_assert
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.quant.common import block_scale
from kernel_src.quant.swiglu.common import E4M3_MAX, PASS_CONFIGS, clamp_or_inf, clamp_up, swiglu_prelude

BWD_THREADS = 64
BWD_ELEMS = 16  # elements per thread-step (16 bytes of e4m3)
# CTAs per SM the register allocation must allow: 96 registers, 20 warps an SM. The branch-free divisions let nvcc
# overlap a step's 16 elements, which takes more registers than one element's chain at a time; at 80 registers it
# spills.
BWD_MIN_BLOCKS = 10

BACKWARD_PRELUDE = swiglu_prelude('swiglu_backward_div.cuh')


@T.macro
def load_step(hidden, x, grad_out, xq, yq, g, row, col):
    """The thread's 16 gates, 16 ups and 16 output gradients of row `row` from channel `col`."""
    for e in T.vectorized(BWD_ELEMS):
        xq[e] = x[row, col + e]
    for e in T.vectorized(BWD_ELEMS):
        yq[e] = x[row, hidden + col + e]
    for e in T.vectorized(BWD_ELEMS):
        g[e] = grad_out[row, col + e]


@T.macro
def step_elements(xq, yq, g, sfx, sfy, w, clamp_c, fast, xf, yf, xc, yc, denominator, sig, quotient, gws, out_f32, gx, gy,
                  amax, acc, div_range):
    """The 16 elements of a step: out_f32, gx, gy, their block amax and the weight_grad sum acc. fast: the divisions
    by tk_rcp_rn_fast and tk_div_rn_fast_by, with the range of the clamped gates in div_range (exact only if
    tk_div_fast_in_range_or_zero passes); else IEEE division."""
    n = BWD_ELEMS
    # Vectorised fp8 -> float32 conversions: one unpack a pair, not a mask, shift and unpack an element.
    for e in T.vectorized(n):
        xf[e] = T.Cast(T.float32, xq[e])
    for e in T.vectorized(n):
        yf[e] = T.Cast(T.float32, yq[e])
    for e in T.unroll(n):
        xv = xf[e] * sfx
        yv = yf[e] * sfy
        go = T.Cast(T.float32, g[e])
        # Selects against clamp_c (+inf without a clamp), each value bound once through a register array: an
        # if_then_else on use_clamp becomes if/else blocks pasted at every use, which nvcc does not fold back.
        xc[e] = T.Select(xv > clamp_c, clamp_c, xv)
        yc[e] = clamp_up(yv, clamp_c)
        denominator[e] = T.float32(1) + T.exp(-xc[e])
        if fast:
            div_range[0] = T.call_extern('float32', 'tk_max_nan', div_range[0], T.abs(xc[e]))
            div_range[1] = T.min(div_range[1], T.call_extern('float32', 'tk_abs_below_or_nan_at_zero', xc[e]))
            sig[e] = T.call_extern('float32', 'tk_rcp_rn_fast', denominator[e])
            quotient[e] = T.call_extern('float32', 'tk_div_rn_fast_by', xc[e], denominator[e], sig[e])
        else:
            sig[e] = T.float32(1) / denominator[e]
            quotient[e] = xc[e] / denominator[e]
        act = quotient[e] * yc[e]
        acc[0] = acc[0] + go * act
        gws[e] = go * w * sig[e]
        out_f32[e] = act * w
        # 1 + x (1 - s) with one rounding, as the reference's compiled FMA.
        dx = gws[e] * yc[e] * T.call_extern('float32', '__fmaf_rn', xc[e], T.float32(1) - sig[e], T.float32(1))
        gx[e] = T.Select(xv > clamp_c, T.float32(0), dx)
        # r > c or r < -c is |r| > c for any non-NaN c (for c < 0 both hold for every non-NaN r): one compare.
        gy[e] = T.Select(T.abs(yv) > clamp_c, T.float32(0), gws[e] * xc[e])
        amax[0] = T.max(amax[0], T.abs(gx[e]))
        amax[1] = T.max(amax[1], T.abs(gy[e]))


def check_backward(grad_dtype: str) -> None:
    if grad_dtype != 'bfloat16':
        raise ValueError(f"grad_dtype must be 'bfloat16' (upstream's only gradient dtype), got {grad_dtype!r}")


def build_backward(arch: Arch, grad_dtype: str) -> KernelProgram:
    num_rows = T.dynamic('num_rows')
    width = T.dynamic('width')
    hidden = T.dynamic('hidden')
    num_sf = T.dynamic('num_sf')
    num_weights = T.dynamic('num_weights')
    num_warps = BWD_THREADS // 32
    n = BWD_ELEMS

    @T.prim_func
    def swiglu_backward(
        x: T.Tensor[(num_rows, width), T.float8_e4m3fn],
        x_sf: T.Tensor[(num_rows, num_sf), T.float32],
        grad_out: T.Tensor[(num_rows, hidden), T.bfloat16],
        weight: T.Tensor[(num_weights,), T.float32],
        pos_to_token_topk: T.Tensor[(num_rows,), T.int32],
        token_topk_to_pos: T.Tensor[(num_weights,), T.int32],
        out: T.Tensor[(num_rows, hidden), T.bfloat16],
        x_grad_fp8: T.Tensor[(num_rows, width), T.float8_e4m3fn],
        x_grad_sf: T.Tensor[(num_rows, num_sf), T.float32],
        x_grad: T.Tensor[(num_rows, width), T.bfloat16],
        weight_grad: T.Tensor[(num_weights,), T.float32],
        num_ctas: T.int32,
        num_iters: T.int32,
        npc_log2: T.int32,
        round_sf: T.int32,
        use_clamp: T.int32,
        clamp_value: T.float32,
    ):
        with T.Kernel(num_ctas, threads=BWD_THREADS, prelude=BACKWARD_PRELUDE) as pid:
            # Issue-bound (exponential and the divisions per element): as many warps as fit without a spill.
            T.annotate_min_blocks_per_sm(BWD_MIN_BLOCKS)
            T.assume(hidden % 32 == 0)
            T.assume(width % 64 == 0)
            tid = T.get_thread_binding()
            xq = T.alloc_local((n,), T.float8_e4m3fn)
            yq = T.alloc_local((n,), T.float8_e4m3fn)
            g = T.alloc_local((n,), T.bfloat16)
            gx = T.alloc_local((n,), T.float32)
            gy = T.alloc_local((n,), T.float32)
            xf = T.alloc_local((n,), T.float32)
            yf = T.alloc_local((n,), T.float32)
            xc = T.alloc_local((n,), T.float32)
            yc = T.alloc_local((n,), T.float32)
            denominator = T.alloc_local((n,), T.float32)
            sig = T.alloc_local((n,), T.float32)
            quotient = T.alloc_local((n,), T.float32)
            gws = T.alloc_local((n,), T.float32)
            out_f32 = T.alloc_local((n,), T.float32)
            out_local = T.alloc_local((n,), T.bfloat16)
            gx16 = T.alloc_local((n,), T.bfloat16)
            gy16 = T.alloc_local((n,), T.bfloat16)
            qx = T.alloc_local((n,), T.float8_e4m3fn)
            qy = T.alloc_local((n,), T.float8_e4m3fn)
            amax = T.alloc_local((2,), T.float32)
            sf = T.alloc_local((2,), T.float32)
            multiplier = T.alloc_local((2,), T.float32)
            acc = T.alloc_local((1,), T.float32)
            acc_before = T.alloc_local((1,), T.float32)  # acc at the start of the step, for its IEEE redo
            div_range = T.alloc_local((2,), T.float32)  # largest |clamped gate| and smallest nonzero one, less an ulp
            w_local = T.alloc_local((1,), T.float32)
            index_local = T.alloc_local((1,), T.int32)
            sf_in = T.alloc_local((2,), T.float32)
            red = T.alloc_shared((num_warps,), T.float32)
            lanes_log2 = npc_log2 - 4  # lanes per block, log2: 1 (32 channels) or 3 (128)
            clamp_c = T.alloc_var(T.float32)
            clamp_c = clamp_or_inf(use_clamp, clamp_value)

            # A (token, topk) slot no row maps to gets a zero gradient, as upstream.
            if pid < num_weights:
                if tid == 0 and token_topk_to_pos[pid] == -1:
                    weight_grad[pid] = T.float32(0)
            if pid < num_rows:  # uniform over the CTA
                # An index past weight is skipped like a negative one, and fails a device assert at the end (after
                # the reduction's shuffles, which an assert before them would make ptxas compile twice).
                index_local[0] = pos_to_token_topk[pid]
                index_ok = index_local[0] < num_weights
                index_local[0] = T.if_then_else(index_ok, index_local[0], -1)
                index = index_local[0]
                w_local[0] = T.if_then_else(index >= 0, weight[T.max(index, 0)], T.float32(0))
                w = w_local[0]
                acc[0] = T.float32(0)
                for it in T.serial(num_iters):
                    col = (it * BWD_THREADS + tid) * n
                    amax[0] = T.float32(0)
                    amax[1] = T.float32(0)
                    if col < hidden:  # a whole block is in or out
                        # Load.
                        load_step(hidden, x, grad_out, xq, yq, g, pid, col)
                        # Into registers once: a load bound to a Python name is re-emitted at every use, and the
                        # lowered ld.global intrinsics are not merged.
                        sf_in[0] = x_sf[pid, col >> npc_log2]
                        sf_in[1] = x_sf[pid, (hidden + col) >> npc_log2]
                        sfx = sf_in[0]
                        sfy = sf_in[1]
                        # Compute: the divisions without branches (tk_rcp_rn_fast, tk_div_rn_fast_by: one reciprocal
                        # for the sigmoid and the quotient), so that the 16 elements overlap, and the largest and
                        # smallest nonzero |clamped gate| for the step's one range test; outside the range (a tiny
                        # or large gate, inf, NaN: rare) the step again with IEEE division, from the row read again
                        # (in cache) rather than loaded vectors kept live through the element loop.
                        acc_before[0] = acc[0]
                        div_range[0] = T.float32(0)
                        div_range[1] = T.float32(float('inf'))
                        step_elements(xq, yq, g, sfx, sfy, w, clamp_c, True, xf, yf, xc, yc, denominator, sig, quotient, gws, out_f32,
                                      gx, gy, amax, acc, div_range)
                        if T.call_extern('int32', 'tk_div_fast_in_range_or_zero', div_range[0], div_range[1]) == 0:
                            acc[0] = acc_before[0]
                            amax[0] = T.float32(0)
                            amax[1] = T.float32(0)
                            # The row index plus a zero nvcc cannot see through: the same loads would be merged
                            # with the step's, keeping its 48 widened inputs live through the fast element loop.
                            load_step(hidden, x, grad_out, xq, yq, g, pid + T.call_extern('int32', 'tk_opaque_zero'), col)
                            step_elements(xq, yq, g, sfx, sfy, w, clamp_c, False, xf, yf, xc, yc, denominator, sig, quotient, gws,
                                          out_f32, gx, gy, amax, acc, div_range)
                        # Store out and x_grad: vectorised casts, one conversion instruction per pair.
                        for e in T.vectorized(n):
                            out_local[e] = T.Cast(T.bfloat16, out_f32[e])
                        for e in T.vectorized(n):
                            gx16[e] = T.Cast(T.bfloat16, gx[e])
                        for e in T.vectorized(n):
                            gy16[e] = T.Cast(T.bfloat16, gy[e])
                        for e in T.vectorized(n):
                            out[pid, col + e] = out_local[e]
                        for e in T.vectorized(n):
                            x_grad[pid, col + e] = gx16[e]
                        for e in T.vectorized(n):
                            x_grad[pid, hidden + col + e] = gy16[e]
                    # Block amax over its adjacent lanes (uniform loop: every lane takes part).
                    for s in T.unroll(3):
                        if s < lanes_log2:
                            amax[0] = T.max(amax[0], T.shfl_xor(amax[0], 1 << s))
                            amax[1] = T.max(amax[1], T.shfl_xor(amax[1], 1 << s))
                    # Store the e4m3 gradient and its scale factors: products first, then the casts as vectorised
                    # loops.
                    if col < hidden:
                        block_scale(amax[0], T.float32(1e-4), E4M3_MAX, round_sf, False, sf, multiplier, 0)
                        block_scale(amax[1], T.float32(1e-4), E4M3_MAX, round_sf, False, sf, multiplier, 1)
                        if (tid & ((1 << lanes_log2) - 1)) == 0:
                            x_grad_sf[pid, col >> npc_log2] = sf[0]
                            x_grad_sf[pid, (hidden + col) >> npc_log2] = sf[1]
                        for e in T.unroll(n):
                            gx[e] = gx[e] * multiplier[0]
                            gy[e] = gy[e] * multiplier[1]
                        for e in T.vectorized(n):
                            qx[e] = T.Cast(T.float8_e4m3fn, gx[e])
                        for e in T.vectorized(n):
                            qy[e] = T.Cast(T.float8_e4m3fn, gy[e])
                        for e in T.vectorized(n):
                            x_grad_fp8[pid, col + e] = qx[e]
                        for e in T.vectorized(n):
                            x_grad_fp8[pid, hidden + col + e] = qy[e]
                # weight_grad = sum over the row of grad_out * act (fp32; the order is the kernel's).
                for s in T.unroll(5):
                    acc[0] = acc[0] + T.shfl_xor(acc[0], 16 >> s)
                if tid % 32 == 0:
                    red[tid // 32] = acc[0]
                T.sync_threads()
                if tid == 0 and index >= 0:
                    total = T.alloc_var(T.float32)
                    total = red[0]
                    for k in T.unroll(1, num_warps):
                        total = total + red[k]
                    weight_grad[index] = total
                device_assert(index_ok)

    alignment = {'x': 16, 'x_sf': 4, 'grad_out': 16, 'weight': 4, 'pos_to_token_topk': 4, 'token_topk_to_pos': 4, 'out': 16,
                 'x_grad_fp8': 16, 'x_grad_sf': 4, 'x_grad': 16, 'weight_grad': 4}
    return KernelProgram(swiglu_backward, alignment=alignment)


def prebuilt_backward():
    yield {'grad_dtype': 'bfloat16'}


BACKWARD = KernelDecl(
    name='quant.swiglu_backward_and_per_token_cast',
    params=(param('grad_dtype', 'str', ''),),
    factory=build_backward,
    prebuilt=prebuilt_backward,
    check=check_backward,
    pass_configs=PASS_CONFIGS,
    constants={'thread_elements': BWD_ELEMS},  # a thread's a step: the op's num_iters covers a row in such steps
)
