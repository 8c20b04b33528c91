"""engram.fused_weight: weight_fused = float(weight_hidden) * float(weight_embed), (hc, H) bf16 -> fp32.

The product of two bf16 values is exact in fp32, so the result is bitwise torch's. Elementwise over the
hc * H contiguous elements: a thread reads VEC of each input (16 bytes) and writes VEC floats. The element
count is run-time (a multiple of VEC); the spec is hc.
"""

from tilelang import language as T

from kernel_src.decl import Arch, KernelDecl, KernelProgram
from kernel_src.engram.common import HC_PARAMS, VEC, check_hc, hc_specs

THREADS = 128


def build(arch: Arch, hc: int) -> KernelProgram:
    count = T.dynamic('count')  # hc * H

    @T.prim_func
    def fused_weight(
        weight_hidden: T.Tensor[(count,), T.bfloat16],
        weight_embed: T.Tensor[(count,), T.bfloat16],
        weight_fused: T.Tensor[(count,), T.float32],
    ):
        with T.Kernel(T.ceildiv(count, THREADS * VEC), threads=THREADS) as pid:
            T.assume(count % VEC == 0)
            tid = T.get_thread_binding()
            a = T.alloc_local((VEC,), T.bfloat16)
            b = T.alloc_local((VEC,), T.bfloat16)
            first = (pid * THREADS + tid) * VEC
            if first < count:
                for e in T.vectorized(VEC):
                    a[e] = weight_hidden[first + e]
                for e in T.vectorized(VEC):
                    b[e] = weight_embed[first + e]
                for e in T.vectorized(VEC):
                    weight_fused[first + e] = T.Cast(T.float32, a[e]) * T.Cast(T.float32, b[e])

    return KernelProgram(fused_weight, alignment={'weight_hidden': 16, 'weight_embed': 16, 'weight_fused': 16})


DECL = KernelDecl(
    name='engram.fused_weight',
    params=HC_PARAMS,
    factory=build,
    prebuilt=hc_specs,
    check=lambda hc: check_hc(hc),
    pass_configs={'tl.disable_warp_specialized': True},
    constants={'elements_per_thread': VEC},  # the op requires hc * H to be a multiple
)
