"""moe.topk_gate: the indices of the K largest scores of each token, ties to the lower index.

One warp per token. Lane l holds experts l, l + 32, l + 64, ... in registers (coalesced loads, padding
marked NaN) and kernel_src/moe/warp_select.warp_topk picks the K winners; lanes 0 .. K-1 store them in
one coalesced write. A NaN score fails a device trap (kernel_src/bounds.py); infinities rank as numbers.
"""

from tilelang import language as T

from kernel_src import models
from kernel_src.bounds import TRAP_PRELUDE, all_of, any_of, device_trap
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.moe.warp_select import NAN, warp_topk

WARPS_PER_BLOCK = 4


def _expert_of(i, lane):  # lane l holds experts l, l + 32, l + 64, ...
    return lane + 32 * i


def check(num_experts: int, num_topk: int) -> None:
    if not 1 <= num_experts <= 1024:
        raise ValueError(f'num_experts must be in [1, 1024], got {num_experts}')
    if not 1 <= num_topk <= min(num_experts, 32):
        raise ValueError(f'num_topk must be in [1, min(num_experts, 32)], got {num_topk} for {num_experts} experts')


def build(arch: Arch, num_experts: int, num_topk: int, warps_per_block: int = WARPS_PER_BLOCK) -> KernelProgram:
    per_lane = (num_experts + 31) // 32
    no_expert = num_experts  # above every real index: loses every min
    num_tokens = T.dynamic('num_tokens')
    row_stride = T.dynamic('row_stride')  # run-time: scores may be a slice of a wider logits tensor

    @T.prim_func
    def topk_gate(
        scores: T.StridedTensor[(num_tokens, num_experts), (row_stride, 1), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps_per_block), threads=32 * warps_per_block, prelude=TRAP_PRELUDE) as pid:
            tid = T.get_thread_binding()
            lane = tid % 32
            token = pid * warps_per_block + tid // 32
            values = T.alloc_local((per_lane,), T.float32)
            winner = T.alloc_local((1,), T.int32)
            numbers = T.alloc_var(T.bool)
            winner[0] = 0
            if token < num_tokens:
                for i in T.unroll(per_lane):
                    values[i] = T.if_then_else(lane + 32 * i < num_experts, scores[token, T.min(lane + 32 * i, num_experts - 1)], T.float32(NAN))
                numbers = True
                for i in T.unroll(per_lane):
                    numbers = all_of(numbers, any_of(lane + 32 * i >= num_experts, not T.isnan(values[i])))
                warp_topk(values, per_lane, _expert_of, no_expert, num_topk, lane, winner)
                # Checked after the selection's shuffles: before them, the trap's possible exit would make ptxas
                # compile every shuffle twice, for a warp that is no longer whole.
                device_trap(numbers)
                if lane < num_topk:
                    topk_idx[token, lane] = T.int64(winner[0])

    return KernelProgram(topk_gate, alignment={'scores': 4, 'topk_idx': 8})


def prebuilt():
    for num_experts, num_topk in models.gate_shapes():
        yield dict(num_experts=num_experts, num_topk=num_topk)


DECL = KernelDecl(
    name='moe.topk_gate',
    params=(param('num_experts', 'int', 'e'), param('num_topk', 'int', 'k')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True},
)
