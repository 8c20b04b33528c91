"""Warp-wide selection shared by the gating kernels (topk_gate, topk_sum_and_topk_group_idx, top2_sum_gate).

A warp owns a token. `warp_topk` picks the K largest of the scores the lanes hold in registers, ties to
the lower expert index, in two cheap butterflies per round: the largest value (one FMNMX a step), then the
lowest index holding it (one IMNMX a step). The winner is marked NaN, which fmaxf skips and `==` never
matches, so a taken expert can never win again, even when the remaining scores are -inf. Callers mark
experts that must not be chosen (padding, experts of dropped groups) NaN the same way. Scores must not
be NaN themselves.

`rank_groups` scores group g (lane g) by its best score or the sum of its two best, read from the warp's
row of shared memory, and returns how many groups beat it (a higher score, or an equal one and a lower
index): the group's rank, the same order as a stable descending sort.
"""

from tilelang import language as T

NAN = float('nan')  # the mark of an expert that cannot be chosen


@T.macro
def warp_topk(values, per_lane, expert_of, no_expert, num_topk, lane, winner):
    """values: the lane's `per_lane` scores, values[i] being expert expert_of(i, lane); afterwards lane k < num_topk
    holds the k-th winner in winner[0], a one-element local buffer (others keep what they had)."""
    best_value = T.alloc_var(T.float32)
    best_index = T.alloc_var(T.int32)
    for k in T.unroll(num_topk):
        best_value = -T.infinity(T.float32)
        for i in T.unroll(per_lane):
            best_value = T.max(best_value, values[i])
        for s in T.unroll(5):
            best_value = T.max(best_value, T.shfl_xor(best_value, 16 >> s))
        best_index = no_expert
        for i in T.unroll(per_lane):
            # Descending i: the last match, the lowest index, is what remains.
            if values[per_lane - 1 - i] == best_value:
                best_index = expert_of(per_lane - 1 - i, lane)
        for s in T.unroll(5):
            best_index = T.min(best_index, T.shfl_xor(best_index, 16 >> s))
        for i in T.unroll(per_lane):
            if expert_of(i, lane) == best_index:
                values[i] = T.float32(NAN)
        if lane == k:
            winner[0] = best_index


@T.macro
def rank_groups(rows, warp, lane, num_groups, per_group, num_topk_sum, rank):
    """rows[warp]: the warp's shared scores, group g at [g * per_group, (g + 1) * per_group). Sets rank[0], a
    one-element local buffer, to the group's rank (meaningful on lanes < num_groups)."""
    top1 = T.alloc_var(T.float32)
    top2 = T.alloc_var(T.float32)
    group_score = T.alloc_var(T.float32)
    group_score = -T.infinity(T.float32)
    if lane < num_groups:
        top1 = -T.infinity(T.float32)
        top2 = -T.infinity(T.float32)
        for e in T.unroll(per_group):
            # Lane g starts at expert g of its group, so the lanes read distinct banks.
            value = rows[warp, lane * per_group + (e + lane) % per_group]
            if value > top1:
                top2 = top1
                top1 = value
            elif value > top2:
                top2 = value
        group_score = top1 if num_topk_sum == 1 else top1 + top2
    rank[0] = 0
    for g in T.unroll(num_groups):
        other = T.shfl_sync(group_score, g)
        if other > group_score or (other == group_score and g < lane):
            rank[0] = rank[0] + 1
