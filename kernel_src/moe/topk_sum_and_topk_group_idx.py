"""moe.topk_sum_and_topk_group_idx: score each group of experts by its largest score (num_topk_sum 1) or
the sum of its two largest (2), and return the num_topk_groups best groups, best first, ties to the
lower group index.

One warp per token. The warp copies the token's scores to its row of shared memory in coalesced loads,
then kernel_src/moe/warp_select.rank_groups has lane g < num_groups score group g and count the groups
that beat it; the lanes whose rank is below num_topk_groups write their group index at that rank. A NaN or
infinite score fails a device trap (kernel_src/bounds.py): a group's sum of +inf and -inf would be NaN.
"""

from tilelang import language as T

from kernel_src import models
from kernel_src.bounds import TRAP_PRELUDE, all_finite, device_trap
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.moe.warp_select import rank_groups

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
    num_experts = num_groups * experts_per_group
    per_lane = (num_experts + 31) // 32

    @T.prim_func
    def topk_sum_and_topk_group_idx(
        scores: T.StridedTensor[(num_tokens, num_groups * experts_per_group), (row_stride, 1), T.float32],
        group_topk_idx: T.Tensor[(num_tokens, num_topk_groups), T.int64],
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=32 * WARPS_PER_BLOCK, prelude=TRAP_PRELUDE) as pid:
            tid = T.get_thread_binding()
            lane = tid % 32
            warp = tid // 32
            token = pid * WARPS_PER_BLOCK + warp
            rows = T.alloc_shared((WARPS_PER_BLOCK, num_experts), T.float32)
            rank = T.alloc_local((1,), T.int32)
            loaded = T.alloc_local((per_lane,), T.float32)
            finite = T.alloc_var(T.bool)
            if token < num_tokens:
                # min(): a lane past the row loads its last score, which the check may read and the store skips.
                for i in T.unroll(per_lane):
                    loaded[i] = scores[token, T.min(lane + 32 * i, num_experts - 1)]
                for i in T.unroll(per_lane):
                    if lane + 32 * i < num_experts:
                        rows[warp, lane + 32 * i] = loaded[i]
                finite = all_finite(loaded, per_lane)  # checked in the registers the scores were loaded to
                T.sync_warp()
                rank_groups(rows, warp, lane, num_groups, experts_per_group, num_topk_sum, rank)
                if lane < num_groups and rank[0] < num_topk_groups:
                    group_topk_idx[token, rank[0]] = T.Cast('int64', lane)
                device_trap(finite)  # last, after rank_groups' shuffles (see topk_gate)

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
    # Each warp writes and reads only its own shared row, ordered by __syncwarp.
    pass_configs={'tl.disable_warp_specialized': True, 'tl.disable_thread_storage_sync': True},
)
