"""engram.grad_w_reduce: grad_weight_hidden += gw * weight_embed and grad_weight_embed += gw * weight_hidden,
where gw = sum over p of grad_w_partial[p] (the fused-weight gradient engram_gate_bwd leaves in partials).

PARTS adjacent lanes own VEC consecutive elements of the hc * H columns. Lane q adds the partials p = q, q + PARTS,
q + 2 * PARTS, ... in that order (UNROLL loads in flight), then the lanes add their sums by three shuffle steps,
((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) in every lane alike (each add commutes), and lane q < VEC
updates element q. So the sum depends only on the partials and P, never on the grid. With PARTS lanes a column
group, a thread's chain of dependent loads is P / (PARTS * UNROLL) rounds long (two at P = 132), and the weights and
gradients the update reads are loaded before the partials, so their latency hides behind the sum.
P and the column count are run-time (columns a multiple of VEC); the spec is hc.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.engram.common import HC_PARAMS, check_hc, hc_specs

THREADS = 128
PARTS = 8  # lanes that share a column group, each summing every PARTS-th partial
VEC = 4  # fp32 columns a lane group: one 16-byte load a partial; lane q < VEC then updates column q of them
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
        with T.Kernel(T.ceildiv(count, THREADS // PARTS * VEC), threads=THREADS) as pid:
            T.assume(count % VEC == 0)
            tid = T.get_thread_binding()
            q = tid % PARTS
            first = (pid * (THREADS // PARTS) + tid // PARTS) * VEC
            column = first + q % VEC
            acc = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((UNROLL * VEC,), T.float32)
            update = T.alloc_local((4,), T.float32)  # weight_embed, weight_hidden and the two gradients at `column`
            for e in T.unroll(VEC):
                acc[e] = T.float32(0)
            if first < count:
                update[0] = T.Cast(T.float32, weight_embed[column])
                update[1] = T.Cast(T.float32, weight_hidden[column])
                update[2] = grad_weight_hidden[column]
                update[3] = grad_weight_embed[column]
                for group in T.serial(num_partials // (UNROLL * PARTS)):
                    for u in T.unroll(UNROLL):
                        for e in T.vectorized(VEC):
                            loaded[u * VEC + e] = grad_w_partial[(group * UNROLL + u) * PARTS + q, first + e]
                    for u in T.unroll(UNROLL):
                        for e in T.unroll(VEC):
                            acc[e] = acc[e] + loaded[u * VEC + e]
                for p in T.serial(num_partials // (UNROLL * PARTS) * UNROLL * PARTS + q, num_partials, PARTS):
                    for e in T.vectorized(VEC):
                        loaded[e] = grad_w_partial[p, first + e]
                    for e in T.unroll(VEC):
                        acc[e] = acc[e] + loaded[e]
            # Every lane of the warp shuffles (whole lane groups are in or out of range together).
            for step in T.unroll(3):
                for e in T.unroll(VEC):
                    acc[e] = acc[e] + T.shfl_xor(acc[e], 1 << step)
            if first < count and q < VEC:
                gw = T.alloc_var(T.float32)
                gw = acc[0]
                for e in T.unroll(1, VEC):
                    gw = T.if_then_else(q == e, acc[e], gw)
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
