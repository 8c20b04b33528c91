"""engram.grad_w_reduce: grad_weight_hidden += gw * weight_embed and grad_weight_embed += gw * weight_hidden,
where gw = sum over p of grad_w_partial[p] (the fused-weight gradient engram_gate_bwd leaves in partials).

A thread owns VEC consecutive elements of the hc * H columns and adds the P partials of each in order
p = 0, 1, ..., P-1 (UNROLL loads in flight, added in that order), so the sum depends only on the partials,
never on the grid. P and the column count are run-time (columns a multiple of VEC); the spec is hc.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.engram.common import HC_PARAMS, check_hc, hc_specs

THREADS = 64
VEC = 4  # fp32 columns a thread: one 16-byte load a partial
UNROLL = 8  # partials loaded before they are added


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
        with T.Kernel(T.ceildiv(count, THREADS * VEC), threads=THREADS) as pid:
            T.assume(count % VEC == 0)
            tid = T.get_thread_binding()
            first = (pid * THREADS + tid) * VEC
            acc = T.alloc_local((VEC,), T.float32)
            loaded = T.alloc_local((UNROLL * VEC,), T.float32)
            wh = T.alloc_local((VEC,), T.bfloat16)
            we = T.alloc_local((VEC,), T.bfloat16)
            gh = T.alloc_local((VEC,), T.float32)
            ge = T.alloc_local((VEC,), T.float32)
            if first < count:
                for e in T.unroll(VEC):
                    acc[e] = T.float32(0)
                for group in T.serial(num_partials // UNROLL):
                    for u in T.unroll(UNROLL):
                        for e in T.vectorized(VEC):
                            loaded[u * VEC + e] = grad_w_partial[group * UNROLL + u, first + e]
                    for u in T.unroll(UNROLL):
                        for e in T.unroll(VEC):
                            acc[e] = acc[e] + loaded[u * VEC + e]
                for p in T.serial(num_partials // UNROLL * UNROLL, num_partials):
                    for e in T.vectorized(VEC):
                        loaded[e] = grad_w_partial[p, first + e]
                    for e in T.unroll(VEC):
                        acc[e] = acc[e] + loaded[e]
                for e in T.vectorized(VEC):
                    wh[e] = weight_hidden[first + e]
                for e in T.vectorized(VEC):
                    we[e] = weight_embed[first + e]
                for e in T.vectorized(VEC):
                    gh[e] = grad_weight_hidden[first + e]
                for e in T.vectorized(VEC):
                    ge[e] = grad_weight_embed[first + e]
                for e in T.vectorized(VEC):
                    grad_weight_hidden[first + e] = gh[e] + acc[e] * T.Cast(T.float32, we[e])
                for e in T.vectorized(VEC):
                    grad_weight_embed[first + e] = ge[e] + acc[e] * T.Cast(T.float32, wh[e])

    return KernelProgram(grad_w_reduce, alignment={'grad_w_partial': 16, 'weight_hidden': 8, 'weight_embed': 8,
                                                   'grad_weight_hidden': 16, 'grad_weight_embed': 16})


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
