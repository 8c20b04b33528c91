"""moe.top2_sum_gate: the DeepSeek-V3 style router in one kernel, one warp per token.

Lane l holds experts 128 i + 4 l + j (j < 4), loaded as float4 vectors, so a lane's experts ascend with
its register index and a strict '>' while scanning them keeps the lower index on a tie. Per token:
1. scores without bias, s: sigmoid, sqrt(softplus) or softmax (max-subtracted, warp-wide sum);
   the ranking score r = s + bias, except softmax, which ranks on logits + bias. A NaN or infinite logit
   or bias fails a device trap (kernel_src/bounds.py has the rule).
2. Group-limited routing (num_groups != num_topk_groups): every lane writes r to the warp's row of
   shared memory, lane g < num_groups scores group g by the sum of its two best r, counts the groups that
   beat it (a higher sum, or the same sum and a lower index) and keeps the group when fewer than
   num_topk_groups do. A butterfly OR gives every lane the bit mask of kept groups; experts of other
   groups are marked taken.
3. Top-K by K rounds of: each lane's best untaken expert, a butterfly picking the largest score (the
   lower index on a tie), the owner marks it taken, lane k keeps the k-th winner. With fix_routing the
   token's K indices come from unmapped_topk_idx instead; one outside [0, E) fails a device trap.
4. weights: w_k = s[idx_k] / (1e-20 + s[idx_0] + ... + s[idx_{K-1}]) * routed_scaling_factor, the sum
   taken in k order; s is read back from the warp's shared row.
5. Lanes K .. K+S-1 carry the shared experts E .. E+S-1 with weight 1. Then the replica map
   (duplicate (ep_rank + t * 23333) mod logical_count[id], reduced so that no 32-bit product wraps; a count
   outside [1, the map's width] fails a device trap), then the EP/TP masking of mask_indices_by_tp with
   per_rank = (E + extra experts) // num_ep_ranks.

What upstream specialises on besides the expert count and the top-k (the scoring function, the shared
expert count and whether mask, fix_routing_mask, unmapped_topk_idx and to_physical_map are given) is a
run-time argument here, so one binary serves every call of a model's router. The optional tensors have
shapes of their own dynamic dims, and the op passes a one-element placeholder for those not given.
"""

from tilelang import language as T

from kernel_src import models
from kernel_src.bounds import TRAP_PRELUDE, all_finite, all_of, device_trap, index_as_int32
from kernel_src.decl import Arch, KernelDecl, KernelProgram, param
from kernel_src.moe.warp_select import NAN, rank_groups, warp_topk

WARPS_PER_BLOCK = 4
VECTOR = 4  # float4 loads: E must be a multiple of 4
SCORING = {'sigmoid': 0, 'sqrtsoftplus': 1, 'softmax': 2}  # the op's scoring_func -> run-time id
HASH_PRIME = 23333  # upstream's replica hash
MAX_REPLICAS = 65535  # replicas of an expert for which the 32-bit replica hash below is exact (the op checks)


def check(num_experts: int, num_topk: int, num_groups: int, num_topk_groups: int) -> None:
    if not 4 <= num_experts <= 1024 or num_experts % VECTOR:
        raise ValueError(f'num_experts must be a multiple of {VECTOR} in [4, 1024], got {num_experts}')
    if not 1 <= num_topk <= min(num_experts, 32):
        raise ValueError(f'num_topk must be in [1, min(num_experts, 32)], got {num_topk}')
    if num_groups == 0 and num_topk_groups == 0:
        return
    if not 1 <= num_topk_groups < num_groups <= 32:
        raise ValueError('grouped routing needs 1 <= num_topk_groups < num_groups <= 32 '
                         f'(equal counts mean no grouping: spell them 0, 0), got {num_topk_groups} of {num_groups}')
    if num_experts % num_groups or num_experts // num_groups > 32:
        raise ValueError(f'num_groups must divide num_experts into groups of at most 32, got {num_experts} / {num_groups}')
    if num_topk_groups * (num_experts // num_groups) < num_topk:
        raise ValueError(f'the {num_topk_groups} kept groups hold fewer than num_topk={num_topk} experts')


def build(arch: Arch, num_experts: int, num_topk: int, num_groups: int, num_topk_groups: int) -> KernelProgram:
    grouped = num_groups > 0
    per_group = num_experts // num_groups if grouped else num_experts
    # A group that is whole lanes of one float4 slot (4, 8, 16 or 32 experts) is scored in registers by
    # shuffles among its lanes; other group sizes go through the warp's row of shared memory.
    groups_in_registers = grouped and per_group % VECTOR == 0 and (32 * VECTOR) % per_group == 0
    lanes_per_group = per_group // VECTOR
    groups_per_slot = 32 * VECTOR // per_group
    num_vectors = (num_experts + 32 * VECTOR - 1) // (32 * VECTOR)  # float4 vectors per lane
    per_lane = num_vectors * VECTOR
    no_expert = num_experts  # above every real index: loses every min

    def expert_of(i, lane):  # a lane's i-th register: vector i // 4 of the row's float4 vectors, element i % 4
        return i // VECTOR * 32 * VECTOR + lane * VECTOR + i % VECTOR
    threads = 32 * WARPS_PER_BLOCK
    # Every dim of an optional tensor is its own, so a one-element placeholder binds when it is absent.
    num_tokens = T.dynamic('num_tokens')
    num_mask, num_fix = T.dynamic('num_mask'), T.dynamic('num_fix')
    num_unmapped, unmapped_stride = T.dynamic('num_unmapped'), T.dynamic('unmapped_stride')
    num_logical, num_replicas, num_counts = T.dynamic('num_logical'), T.dynamic('num_replicas'), T.dynamic('num_counts')
    num_slots = T.dynamic('num_slots')  # num_topk + shared experts

    @T.prim_func
    def top2_sum_gate(
        logits: T.Tensor[(num_tokens, num_experts), T.float32],
        bias: T.Tensor[(num_experts,), T.float32],
        mask: T.Tensor[(num_mask,), T.bool],
        fix_routing_mask: T.Tensor[(num_fix,), T.bool],
        to_physical_map: T.Tensor[(num_logical, num_replicas), T.int32],
        logical_count: T.Tensor[(num_counts,), T.int32],
        unmapped_topk_idx: T.StridedTensor[(num_unmapped, num_topk), (unmapped_stride, 1), T.int64],
        topk_idx: T.Tensor[(num_tokens, num_slots), T.int64],
        topk_weights: T.Tensor[(num_tokens, num_slots), T.float32],
        scoring: T.int32,
        has_mask: T.int32,
        has_fix: T.int32,
        has_unmapped: T.int32,
        has_map: T.int32,
        routed_scaling_factor: T.float32,
        ep_rank: T.int32,
        experts_per_rank: T.int32,
        experts_per_dp: T.int32,
        tp_rank: T.int32,
        num_tp_ranks: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_tokens, WARPS_PER_BLOCK), threads=threads, prelude=TRAP_PRELUDE) as pid:
            tid = T.get_thread_binding()
            lane = tid % 32
            warp = tid // 32
            token = pid * WARPS_PER_BLOCK + warp
            plain_scores = T.alloc_shared((WARPS_PER_BLOCK, num_experts), T.float32)  # s, for the weights
            rank_scores = T.alloc_shared((WARPS_PER_BLOCK, num_experts if grouped and not groups_in_registers else 1), T.float32)  # r
            logit = T.alloc_local((per_lane,), T.float32)
            offset = T.alloc_local((per_lane,), T.float32)
            score = T.alloc_local((per_lane,), T.float32)
            winner = T.alloc_local((1,), T.int32)
            group_rank = T.alloc_local((1,), T.int32)
            row_max = T.alloc_var(T.float32)
            row_sum = T.alloc_var(T.float32)
            kept_groups = T.alloc_var(T.uint32)
            top1 = T.alloc_local((num_vectors,), T.float32)
            top2 = T.alloc_local((num_vectors,), T.float32)
            group_sum = T.alloc_local((num_vectors,), T.float32)
            group_rank_of = T.alloc_local((num_vectors,), T.int32)
            my_index = T.alloc_var(T.int32)
            my_score = T.alloc_var(T.float32)
            weight_sum = T.alloc_var(T.float32)
            replicas = T.alloc_var(T.int32)
            # What the token's inputs break of kernel_src/bounds.py's rule, checked once, after the warp's last
            # shuffle: a trap before a shuffle makes ptxas compile the shuffle twice, for a warp no longer whole.
            inputs_ok = T.alloc_var(T.bool)
            if token < num_tokens:
                inputs_ok = True
                routed = T.alloc_var(T.bool)
                routed = True
                if has_mask != 0:
                    routed = mask[token]
                if not routed:
                    if lane < num_topk and has_unmapped != 0:
                        unmapped_topk_idx[token, lane] = T.int64(-1)
                    if lane < num_slots:
                        topk_idx[token, lane] = T.int64(-1)
                        topk_weights[token, lane] = T.float32(0)
                else:
                    # 1. Scores.
                    for v in T.unroll(num_vectors):
                        first = v * 32 * VECTOR + lane * VECTOR
                        if first < num_experts:
                            for j in T.vectorized(VECTOR):
                                logit[v * VECTOR + j] = logits[token, first + j]
                            for j in T.vectorized(VECTOR):
                                offset[v * VECTOR + j] = bias[first + j]
                        else:
                            for j in T.unroll(VECTOR):
                                logit[v * VECTOR + j] = T.float32(0)
                                offset[v * VECTOR + j] = T.float32(0)
                    inputs_ok = all_of(all_finite(logit, per_lane), all_finite(offset, per_lane))
                    if scoring == 2:
                        row_max = -T.infinity(T.float32)
                        for i in T.unroll(per_lane):
                            if expert_of(i, lane) < num_experts:
                                row_max = T.max(row_max, logit[i])
                        for s in T.unroll(5):
                            row_max = T.max(row_max, T.shfl_xor(row_max, 16 >> s))
                        row_sum = T.float32(0)
                        for i in T.unroll(per_lane):
                            score[i] = T.exp(logit[i] - row_max)
                            if expert_of(i, lane) < num_experts:
                                row_sum = row_sum + score[i]
                        for s in T.unroll(5):
                            row_sum = row_sum + T.shfl_xor(row_sum, 16 >> s)
                        for i in T.unroll(per_lane):
                            score[i] = score[i] / row_sum
                    elif scoring == 1:
                        for i in T.unroll(per_lane):
                            score[i] = T.sqrt(T.if_then_else(logit[i] > T.float32(20), logit[i], T.log1p(T.exp(logit[i]))))
                    else:
                        for i in T.unroll(per_lane):
                            # __frcp_rn is the correctly rounded 1 / x, as the division, in fewer instructions.
                            score[i] = T.call_extern('float32', '__frcp_rn', T.float32(1) + T.exp(-logit[i]))
                    for i in T.unroll(per_lane):
                        if expert_of(i, lane) < num_experts:
                            plain_scores[warp, expert_of(i, lane)] = score[i]
                        # From here on `score` holds the ranking score, NaN for padding (never chosen).
                        score[i] = T.if_then_else(expert_of(i, lane) < num_experts, T.if_then_else(scoring == 2, logit[i], score[i]) + offset[i], T.float32(NAN))
                        if grouped and not groups_in_registers:
                            if expert_of(i, lane) < num_experts:
                                rank_scores[warp, expert_of(i, lane)] = score[i]
                    T.sync_warp()

                    fixed = T.alloc_var(T.bool)
                    fixed = False
                    if has_fix != 0:
                        fixed = fix_routing_mask[token]
                    winner[0] = 0
                    if fixed:
                        if lane < num_topk:
                            winner[0] = index_as_int32(unmapped_topk_idx[token, lane], num_experts)
                            inputs_ok = all_of(inputs_ok, winner[0] >= 0, winner[0] < num_experts)
                    else:
                        # 2. Group-limited routing: experts of groups not kept become NaN.
                        if groups_in_registers:
                            # Top two of each lane's 4, merged over the group's lanes by butterflies
                            # (the top two of two sorted pairs: max of the firsts, then the larger of
                            # the smaller first and the larger second); the sum is top1 + top2 as in
                            # a scan, whatever the order the values arrive in.
                            for v in T.unroll(num_vectors):
                                top1[v] = -T.infinity(T.float32)
                                top2[v] = -T.infinity(T.float32)
                                for j in T.unroll(VECTOR):
                                    value = score[v * VECTOR + j]
                                    if value > top1[v]:
                                        top2[v] = top1[v]
                                        top1[v] = value
                                    elif value > top2[v]:
                                        top2[v] = value
                                for m in T.unroll(lanes_per_group.bit_length() - 1):
                                    other1 = T.shfl_xor(top1[v], 1 << m)
                                    other2 = T.shfl_xor(top2[v], 1 << m)
                                    top2[v] = T.max(T.min(top1[v], other1), T.max(top2[v], other2))
                                    top1[v] = T.max(top1[v], other1)
                                group_sum[v] = top1[v] + top2[v]
                            # A group's rank: the groups with a larger sum, or an equal one and a lower index.
                            for v in T.unroll(num_vectors):
                                group_rank_of[v] = 0
                            for g in T.unroll(num_groups):
                                other_sum = T.shfl_sync(group_sum[g // groups_per_slot], g % groups_per_slot * lanes_per_group)
                                for v in T.unroll(num_vectors):
                                    mine = v * groups_per_slot + lane // lanes_per_group
                                    if other_sum > group_sum[v] or (other_sum == group_sum[v] and g < mine):
                                        group_rank_of[v] = group_rank_of[v] + 1
                            for v in T.unroll(num_vectors):
                                if group_rank_of[v] >= num_topk_groups:
                                    for j in T.unroll(VECTOR):
                                        score[v * VECTOR + j] = T.float32(NAN)
                        elif grouped:
                            rank_groups(rank_scores, warp, lane, num_groups, per_group, 2, group_rank)
                            kept_groups = T.if_then_else(lane < num_groups and group_rank[0] < num_topk_groups, T.shift_left(T.uint32(1), T.Cast('uint32', lane)), T.uint32(0))
                            for s in T.unroll(5):
                                kept_groups = kept_groups | T.shfl_xor(kept_groups, 16 >> s)
                            for i in T.unroll(per_lane):
                                group = T.min(expert_of(i, lane), num_experts - 1) // per_group
                                if T.bitwise_and(T.shift_right(kept_groups, T.Cast('uint32', group)), T.uint32(1)) == T.uint32(0):
                                    score[i] = T.float32(NAN)
                        # 3. Top-K.
                        warp_topk(score, per_lane, expert_of, no_expert, num_topk, lane, winner)
                    # Masked: a bad fixed index, or no_expert (left only by NaN scores), addresses expert 0 or E - 1.
                    my_index = T.max(T.min(winner[0], num_experts - 1), 0)
                    # 4. Weights, normalised by the top-K sum in k order.
                    my_score = T.float32(0)
                    if lane < num_topk:
                        my_score = plain_scores[warp, my_index]
                    weight_sum = T.float32(1e-20)
                    for k in T.unroll(num_topk):
                        weight_sum = weight_sum + T.shfl_sync(my_score, k)
                    if lane < num_topk:
                        my_score = my_score / weight_sum * routed_scaling_factor
                        if has_unmapped != 0:
                            unmapped_topk_idx[token, lane] = T.Cast('int64', my_index)
                    elif lane < num_slots:
                        # 5. Shared experts as routed slots.
                        my_score = T.float32(1)
                        my_index = num_experts + lane - num_topk
                    if lane < num_slots:
                        if has_map != 0:
                            # (ep_rank + token * 23333) mod replicas, in 32 bits for any token count:
                            # replicas <= MAX_REPLICAS (checked by the op), so no product below overflows.
                            replicas = logical_count[my_index]
                            inputs_ok = all_of(inputs_ok, replicas >= 1, replicas <= num_replicas)
                            replicas = T.max(T.min(replicas, num_replicas), 1)  # masked: the replica indexes the map
                            replica = T.Cast('int32', (T.Cast('uint32', token) % T.Cast('uint32', replicas) * T.Cast('uint32', HASH_PRIME % replicas)
                                                       + T.Cast('uint32', ep_rank)) % T.Cast('uint32', replicas))
                            my_index = to_physical_map[my_index, replica]
                        # EP/TP masking, as mask_indices_by_tp.
                        if my_index >= 0:
                            if my_index // experts_per_rank % num_tp_ranks != tp_rank:
                                my_index = -1
                            else:
                                my_index = my_index - tp_rank * experts_per_rank
                                my_index = my_index - my_index // experts_per_dp * (experts_per_dp - experts_per_rank)
                                my_index = T.if_then_else(my_index < 0, -1, my_index)
                    if lane < num_slots:
                        topk_idx[token, lane] = T.Cast('int64', my_index)
                        topk_weights[token, lane] = my_score
                    device_trap(inputs_ok)  # last, after the stores

    return KernelProgram(top2_sum_gate, alignment={
        'logits': 16, 'bias': 16, 'mask': 1, 'fix_routing_mask': 1, 'to_physical_map': 4, 'logical_count': 4,
        'unmapped_topk_idx': 8, 'topk_idx': 8, 'topk_weights': 4,
    })


# upstream's test configurations (groups, kept groups, experts, shared experts, top-k); shared experts
# are a run-time argument here, and equal group counts mean no grouping.
UPSTREAM_CONFIGS = (
    (0, 0, 72, 1, 6), (0, 0, 32, 2, 6), (0, 0, 64, 2, 6), (0, 0, 96, 2, 6), (0, 0, 16, 2, 6), (0, 0, 36, 2, 6),
    (0, 0, 108, 2, 6), (0, 0, 128, 2, 6), (0, 0, 144, 2, 6), (8, 8, 256, 2, 8), (8, 4, 256, 2, 8),
)


def _spec(num_experts, num_topk, num_groups, num_topk_groups):
    if num_groups == num_topk_groups:
        num_groups = num_topk_groups = 0
    return dict(num_experts=num_experts, num_topk=num_topk, num_groups=num_groups, num_topk_groups=num_topk_groups)


def prebuilt():
    for g, tg, e, _, k in UPSTREAM_CONFIGS:
        yield _spec(e, k, g, tg)
    # 72 experts in 4 groups of 18, a grouping upstream tests group ranking with: groups that are not
    # whole lanes of a slot, so this spec keeps the shared-memory group path built and tested.
    yield _spec(72, 6, 4, 2)
    for m in models.MODELS:
        # The top-2-sum group score is DeepSeek-V3's; a model that scores groups otherwise (V2) has no
        # spec here. Mixtral's 8 experts are a multiple of 4, so it is served too.
        if m.num_experts % VECTOR == 0 and (m.num_groups <= 1 or m.group_topk_sum == 2):
            yield _spec(m.num_experts, m.num_topk, m.num_groups if m.num_groups > 1 else 0, m.num_topk_groups if m.num_groups > 1 else 0)


DECL = KernelDecl(
    name='moe.top2_sum_gate',
    params=(param('num_experts', 'int', 'e'), param('num_topk', 'int', 'k'), param('num_groups', 'int', 'g'), param('num_topk_groups', 'int', 'tg')),
    factory=build,
    prebuilt=prebuilt,
    check=check,
    # Each warp writes and reads only its own shared rows, ordered by __syncwarp; the block-wide barrier
    # tilelang would insert for them is not needed.
    pass_configs={'tl.disable_warp_specialized': True, 'tl.disable_thread_storage_sync': True},
    constants={'max_replicas': MAX_REPLICAS, **{f'scoring_{name}': value for name, value in SCORING.items()}},
)
