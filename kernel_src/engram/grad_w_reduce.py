"""engram.grad_w_reduce: grad_weight_hidden += gw * weight_embed and grad_weight_embed += gw * weight_hidden,
where gw = sum over p of grad_w_partial[p] (the fused-weight gradient engram_gate_bwd leaves in partials).

A CTA owns COLUMNS consecutive elements of the hc * H columns, VEC a lane, so each warp load reads 512 contiguous
bytes of one partial. Warp w adds the partials p = w, w + WARPS, w + 2 * WARPS, ... in that order (UNROLL loads in
flight: two rounds at P = 132), the warps' sums meet in shared memory, and thread c adds them in warp order,
((s0 + s1) + s2) + ..., for column c. So the sum depends only on the partials and P, never on the grid. The
weights and gradients of the update are loaded before the partials, so their latency hides behind the sum.
P and the column count are run-time (columns a multiple of VEC); the spec is hc.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.engram.common import HC_PARAMS, check_hc, hc_specs

THREADS = 256
WARPS = THREADS // 32  # warp w sums every WARPS-th partial
VEC = 4  # fp32 columns a lane: one 16-byte load a partial
COLUMNS = 32 * VEC  # columns a CTA
UNROLL = 16  # partials a lane loads before it adds them


def build(arch: Arch, hc: int) -> KernelProgram:
    num_partials, count = T.dynamic('num_partials'), T.dynamic('count')  # count = hc * H

    @T.prim_func
    def grad_w_reduce(
        grad_w_partial: T.Tensor[(num_partials, count), T.float32],
        weight_hidden: T.Tensor[(count,), T.bfloat16],
        weight_embed: T.Tensor[(count,), T.bfloat16],
        grad_weight_hidden: T.Tensor[(count,), T.float32],
        grad_weight_embed: T.Tensor[(count,), T.float32],
    ):
        with T.Kernel(T.ceildiv(count, COLUMNS), threads=THREADS) as pid:
            T.assume(count % VEC == 0)
            tid = T.get_thread_binding()
            warp, lane = tid // 32, tid % 32
            first = pid * COLUMNS + lane * VEC
            column = pid * COLUMNS + tid  # the column thread tid < COLUMNS updates
            sums = T.alloc_shared((WARPS, COLUMNS), T.float32)
            acc = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((UNROLL * VEC,), T.float32)
            update = T.alloc_local((4,), T.float32)  # weight_embed, weight_hidden and the two gradients at `column`
            if tid < COLUMNS and column < count:
                update[0] = T.Cast(T.float32, weight_embed[column])
                update[1] = T.Cast(T.float32, weight_hidden[column])
                update[2] = grad_weight_hidden[column]
                update[3] = grad_weight_embed[column]
            for e in T.unroll(VEC):
                acc[e] = T.float32(0)
            if first < count:
                for group in T.serial(num_partials // (UNROLL * WARPS)):
                    for u in T.unroll(UNROLL):
                        for e in T.vectorized(VEC):
                            loaded[u * VEC + e] = grad_w_partial[(group * UNROLL + u) * WARPS + warp, first + e]
                    for u in T.unroll(UNROLL):
                        for e in T.unroll(VEC):
                            acc[e] = acc[e] + loaded[u * VEC + e]
                for p in T.serial(num_partials // (UNROLL * WARPS) * UNROLL * WARPS + warp, num_partials, WARPS):
                    for e in T.vectorized(VEC):
                        loaded[e] = grad_w_partial[p, first + e]
                    for e in T.unroll(VEC):
                        acc[e] = acc[e] + loaded[e]
            for e in T.vectorized(VEC):
                sums[warp, lane * VEC + e] = acc[e]
            T.sync_threads()
            if tid < COLUMNS and column < count:
                gw = T.alloc_var(T.float32)
                gw = sums[0, tid]
                for w in T.unroll(1, WARPS):
                    gw = gw + sums[w, tid]
                grad_weight_hidden[column] = update[2] + gw * update[0]
                grad_weight_embed[column] = update[3] + gw * update[1]

    return KernelProgram(grad_w_reduce, alignment={'grad_w_partial': 16, 'weight_hidden': 2, 'weight_embed': 2,
                                                   'grad_weight_hidden': 4, 'grad_weight_embed': 4})


DECL = KernelDecl(
    name='engram.grad_w_reduce',
    params=HC_PARAMS,
    factory=build,
    prebuilt=hc_specs,
    check=lambda hc: check_hc(hc),
    pass_configs={
        'tl.disable_warp_specialized': True,
        'tl.disable_safe_memory_legalize': True,  # every access is in bounds: first < count, p < num_partials
    },
    constants={'columns_per_thread': VEC},  # the op requires hc * H to be a multiple
)
