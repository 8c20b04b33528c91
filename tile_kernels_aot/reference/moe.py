"""References for the MoE routing helpers, computing exactly what the kernels compute."""

import torch


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """scores [T, G, E/G]: the groups with the largest sum of their num_topk_sum best scores, best first,
    ties to the lower group."""
    group_scores = scores.topk(num_topk_sum, dim=-1, sorted=False).values.sum(-1)
    return torch.sort(group_scores, dim=1, descending=True, stable=True).indices[:, :num_topk_groups].contiguous()


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(1e-20 + w_0 + w_1 + ... summed left to right, w / that)."""
    denominator = torch.full((topk_weights.shape[0],), 1e-20, dtype=torch.float32, device=topk_weights.device)
    for k in range(topk_weights.shape[1]):
        denominator = denominator + topk_weights[:, k]
    return denominator, topk_weights / denominator[:, None]


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    valid = group_idx[group_idx >= 0].long()
    return torch.bincount(valid, minlength=num_groups)[:num_groups].int()


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """count_e * num_experts / (num_tokens * num_aux_topk), the product in integers, one division."""
    num_tokens = topk_idx.shape[0]
    if num_tokens == 0:
        return torch.zeros(num_experts, dtype=torch.float32, device=topk_idx.device)
    numerator = (group_count(topk_idx, num_experts).long() * num_experts).float()
    # A tensor divisor: torch turns division by a Python scalar into a multiplication by its inverse.
    return numerator / torch.full_like(numerator, float(num_tokens * num_aux_topk))


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """Later repeats of an index within a row become -1 (negative entries stay)."""
    repeat = torch.zeros_like(group_indices, dtype=torch.bool)
    for k in range(1, group_indices.shape[1]):
        for j in range(k):
            repeat[:, k] |= (group_indices[:, j] == group_indices[:, k]) & (group_indices[:, k] >= 0)
    group_indices[repeat] = -1


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int) -> torch.Tensor:
    per_gpu = n // num_ep_ranks
    per_dp = num_tp_ranks * per_gpu
    value = indices.clone()
    invalid = (value < 0) | ((value // per_gpu) % num_tp_ranks != tp_rank)
    value = value - tp_rank * per_gpu
    value = value - (value // per_dp) * (per_dp - per_gpu)
    value[invalid | (value < 0)] = -1
    return value
