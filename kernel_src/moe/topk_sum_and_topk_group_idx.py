"""moe.topk_sum_and_topk_group_idx: score each group of experts by its largest score (num_topk_sum 1) or
the sum of its two largest (2), and return the num_topk_groups best groups, best first, ties to the
lower group index.

One warp per token; lane g < num_groups reads group g's scores (adjacent in memory) and keeps its top
two; the rank of each group is the number of groups that beat it, counted with shuffles, and the lanes
whose rank is below num_topk_groups write their group index at that rank.
"""

from tilelang import language as T

from kernel_src import models
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param

WARPS_PER_BLOCK = 4


def check(num_groups: int, experts_per_group: int, num_topk_sum: int, num_topk_groups: int) -> None:
    if not 1 <= num_groups <= 32:
        raise ValueError(f'num_groups must be in [1, 32] (one lane per group), got {num_groups}')
    if num_topk_sum not in (1, 2) or num_topk_sum > experts_per_group:
        raise ValueError(f'num_topk_sum must be 1 or 2 and at most experts_per_group ({experts_per_group}), got {num_topk_sum}')
    if not 1 <= num_topk_groups <= num_groups:
        raise ValueError(f'num_topk_groups must be in [1, num_groups={num_groups}], got {num_topk_groups}')


def build(arch: Arch, num_groups: int, experts_per_group: int, num_topk_sum: int, num_topk_groups: int) -> KernelProgram:
    num_tokens, row_stride = T.dynamic('num_tokens'), T.dynamic('row_stride')

    @T.prim_func
    def topk_sum_and_topk_group_idx(
        scores: T.StridedTensor[(num_tokens, num_groups * experts_per_group), (row_stride, 1), T.float32],
        group_topk_idx: T.Tensor[(num_tokens, num_topk_groups), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=32 * WARPS_PER_BLOCK) as pid:
            tid = T.get_thread_binding()
            lane = tid % 32
            token = pid * WARPS_PER_BLOCK + tid // 32
            top1 = T.alloc_var(T.float32)
            top2 = T.alloc_var(T.float32)
            group_score = T.alloc_var(T.float32)
            rank = T.alloc_var(T.int32)
            if token < num_tokens:
                top1 = -T.infinity(T.float32)
                top2 = -T.infinity(T.float32)
                if lane < num_groups:
                    for i in T.unroll(experts_per_group):
                        value = scores[token, lane * experts_per_group + i]
                        if value > top1:
                            top2 = top1
                            top1 = value
                        elif value > top2:
                            top2 = value
                group_score = top1 if num_topk_sum == 1 else top1 + top2
                rank = 0
                for g in T.unroll(num_groups):
                    other = T.shfl_sync(group_score, g)
                    if other > group_score or (other == group_score and g < lane):
                        rank = rank + 1
                if lane < num_groups and rank < num_topk_groups:
                    group_topk_idx[token, rank] = T.Cast('int64', lane)

    return KernelProgram(topk_sum_and_topk_group_idx, alignment={'scores': 4, 'group_topk_idx': 8})


def prebuilt():
    for groups, per_group, topk_sum, topk_groups in models.group_gate_shapes():
        yield dict(num_groups=groups, experts_per_group=per_group, num_topk_sum=topk_sum, num_topk_groups=topk_groups)


DECL = KernelDecl(
    name='moe.topk_sum_and_topk_group_idx',
    params=(param('num_groups', 'int', 'g'), param('experts_per_group', 'int', 'e'), param('num_topk_sum', 'int', 's'),
            param('num_topk_groups', 'int', 'k')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    pass_configs={'tl.disable_warp_specialized': True},
)
