"""moe.topk_gate: the indices of the K largest scores of each token, ties to the lower index.

One warp per token. Lane l holds experts l, l + 32, l + 64, ... in registers. Each of the K rounds takes
the best untaken expert of every lane (scanning in ascending index, so a tie keeps the lower index),
then a butterfly over the warp picks the largest score, the lower index on a tie, and the lane that owns
the winner marks it taken. Marking with a flag rather than overwriting the score with -inf keeps
the order right when scores themselves are -inf. The K winners are stored by lanes 0 .. K-1 in one
coalesced write.
"""

from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

WARPS_PER_BLOCK = 4


def check(num_experts: int, num_topk: int) -> None:
    if not 1 <= num_experts <= 1024:
        raise ValueError(f'num_experts must be in [1, 1024], got {num_experts}')
    if not 1 <= num_topk <= min(num_experts, 32):
        raise ValueError(f'num_topk must be in [1, min(num_experts, 32)], got {num_topk} for {num_experts} experts')


def build(arch: Arch, num_experts: int, num_topk: int, warps_per_block: int = WARPS_PER_BLOCK) -> KernelProgram:
    per_lane = (num_experts + 31) // 32
    no_expert = num_experts  # sentinel index: loses every tie against a real expert
    num_tokens = T.dynamic('num_tokens')
    row_stride = T.dynamic('row_stride')  # run-time: scores may be a slice of a wider logits tensor

    @T.prim_func
    def topk_gate(
        scores: T.StridedTensor[(num_tokens, num_experts), (row_stride, 1), T.float32],
        topk_idx: T.Tensor[(num_tokens, num_topk), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, warps_per_block), threads=32 * warps_per_block) as pid:
            tid = T.get_thread_binding()
            lane = tid % 32
            token = pid * warps_per_block + tid // 32
            values = T.alloc_local((per_lane,), T.float32)
            taken = T.alloc_local((per_lane,), T.bool)
            best_value = T.alloc_var(T.float32)
            best_index = T.alloc_var(T.int32)
            other_value = T.alloc_var(T.float32)
            other_index = T.alloc_var(T.int32)
            my_result = T.alloc_var(T.int32)
            my_result = 0
            if token < num_tokens:
                for i in T.unroll(per_lane):
                    taken[i] = lane + 32 * i >= num_experts
                    values[i] = T.if_then_else(taken[i], -T.infinity(T.float32), scores[token, T.min(lane + 32 * i, num_experts - 1)])
                for k in T.unroll(num_topk):
                    best_value = -T.infinity(T.float32)
                    best_index = no_expert
                    for i in T.unroll(per_lane):
                        if not taken[i] and (best_index == no_expert or values[i] > best_value):
                            best_value = values[i]
                            best_index = lane + 32 * i
                    for offset in T.unroll(5):
                        other_value = T.shfl_xor(best_value, 16 >> offset)
                        other_index = T.shfl_xor(best_index, 16 >> offset)
                        if other_value > best_value or (other_value == best_value and other_index < best_index):
                            best_value = other_value
                            best_index = other_index
                    for i in T.unroll(per_lane):
                        if best_index == lane + 32 * i:
                            taken[i] = True
                    if lane == k:
                        my_result = best_index
                if lane < num_topk:
                    topk_idx[token, lane] = T.int64(my_result)

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
