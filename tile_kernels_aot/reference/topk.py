import torch

from tile_kernels_aot.reference.moe import mask_indices_by_tp, topk_sum_and_topk_group_idx


def stable_topk(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Indices of the `num_topk` largest scores per row, best first, equal scores in index order."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :num_topk].contiguous()


def top2_sum_gate(
    logits: torch.Tensor,
    bias: torch.Tensor,
    num_topk: int,
    num_topk_groups: int,
    num_groups: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    num_ep_ranks: int,
    tp_rank: int,
    num_tp_ranks: int,
    scoring_func: str,
    mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router of tile_kernels_aot.moe.top2_sum_gate, step by step (see its docstring). Indices match
    the kernel exactly when no two candidate scores are closer than the scoring functions' rounding;
    weights agree to float rounding (the kernel's exp and softmax sum round differently from torch's)."""
    num_tokens, num_experts = logits.shape
    num_shared = num_shared_experts if use_shared_as_routed else 0
    if scoring_func == 'sigmoid':
        scores = torch.sigmoid(logits)
    elif scoring_func == 'sqrtsoftplus':
        scores = torch.nn.functional.softplus(logits).sqrt()
    elif scoring_func == 'softmax':
        scores = torch.softmax(logits, dim=-1)
    else:
        raise ValueError(f'unknown scoring_func {scoring_func!r}')
    ranking = (logits if scoring_func == 'softmax' else scores) + bias
    if num_groups != num_topk_groups:
        per_group = num_experts // num_groups
        kept = topk_sum_and_topk_group_idx(ranking.view(num_tokens, num_groups, per_group), 2, num_topk_groups)
        keep = torch.zeros((num_tokens, num_groups), dtype=torch.bool, device=logits.device).scatter_(1, kept, True)
        ranking = ranking.masked_fill(~keep.repeat_interleave(per_group, dim=1), float('-inf'))
    idx = stable_topk(ranking, num_topk)
    if fix_routing_mask is not None:
        idx = torch.where(fix_routing_mask[:, None], unmapped_topk_idx, idx)
    picked = scores.gather(1, idx.clamp(0, num_experts - 1))
    denominator = torch.full((num_tokens,), 1e-20, dtype=torch.float32, device=logits.device)
    for k in range(num_topk):  # in k order, as the kernel adds them
        denominator = denominator + picked[:, k]
    weights = picked / denominator[:, None] * routed_scaling_factor
    routed = mask if mask is not None else torch.ones(num_tokens, dtype=torch.bool, device=logits.device)
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(torch.where(routed[:, None], idx, -1))
    if num_shared:
        shared = torch.arange(num_experts, num_experts + num_shared, device=logits.device).expand(num_tokens, -1)
        idx = torch.cat([idx, shared], dim=1)
        weights = torch.cat([weights, torch.ones((num_tokens, num_shared), device=logits.device)], dim=1)
    num_extra = 0
    if to_physical_map is not None:
        num_extra = to_physical_map.shape[1] - 1
        row = torch.arange(num_tokens, device=logits.device, dtype=torch.int64)[:, None]
        replica = (ep_rank + row * 23333) % logical_count[idx].long()
        idx = to_physical_map[idx, replica].long()
    idx = mask_indices_by_tp(idx, num_experts + num_extra, num_ep_ranks, tp_rank, num_tp_ranks)
    idx = torch.where(routed[:, None], idx, -1)
    weights = torch.where(routed[:, None], weights, 0.0)
    return idx, weights
