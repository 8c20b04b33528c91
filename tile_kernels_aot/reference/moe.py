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


# -- the fused (expert-major) layout: get_fused_mapping, expand_to_fused(_with_sf), reduce_fused ---------


def fused_num_expanded_tokens(num_tokens: int, num_topk: int, num_experts: int, alignment: int) -> int:
    """Upstream's upper bound on the fused rows: (T*K + (alignment-1)*E) rounded down to the alignment.
    Sum_e align(count_e) <= T*K + (alignment-1)*E and is a multiple of the alignment, so it fits."""
    return (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment


def get_fused_mapping(
    topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int, force_no_sync: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """The fused layout with pairs in ascending flat order (t * K + k) inside each expert segment: the
    order tile_kernels_aot.moe.get_fused_mapping produces, so its outputs can be compared bit for bit."""
    num_tokens, num_topk = topk_idx.shape
    device = topk_idx.device
    flat = topk_idx.reshape(-1).long()
    if bool((flat >= num_experts).any()):
        raise ValueError(f'get_fused_mapping: topk_idx has an index >= num_experts ({num_experts})')
    routed = (flat >= 0).nonzero().flatten()  # ascending flat order
    experts = flat[routed]
    counts = torch.bincount(experts, minlength=num_experts)
    aligned = (counts + alignment - 1) // alignment * alignment
    start = torch.cumsum(aligned, 0) - aligned
    should_sync = num_expanded_tokens == 0 and not force_no_sync
    if num_expanded_tokens == 0:
        num_expanded_tokens = fused_num_expanded_tokens(num_tokens, num_topk, num_experts, alignment)
    order = torch.sort(experts, stable=True).indices  # by expert, flat order kept within one
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=device) - (torch.cumsum(counts, 0) - counts)[experts[order]]
    pos = start[experts] + rank
    if pos.numel() and int(pos.max()) >= num_expanded_tokens:
        raise ValueError(f'get_fused_mapping: num_expanded_tokens={num_expanded_tokens} is too small for this routing')
    pos_to_expert = torch.full((num_expanded_tokens,), -1, dtype=torch.int32, device=device)
    pos_to_token = pos_to_expert.clone()
    pos_to_token_topk = pos_to_expert.clone()
    pos_to_expert[pos] = experts.int()
    pos_to_token[pos] = (routed // max(num_topk, 1)).int()
    pos_to_token_topk[pos] = routed.int()
    token_topk_to_pos = torch.full((num_tokens * num_topk,), -1, dtype=torch.int32, device=device)
    token_topk_to_pos[routed] = pos.int()
    as_list: list[int] = []
    if should_sync:
        as_list = aligned.tolist()
        used = sum(as_list)
        pos_to_expert, pos_to_token, pos_to_token_topk = pos_to_expert[:used], pos_to_token[:used], pos_to_token_topk[:used]
    return (pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos.view(num_tokens, num_topk),
            start.int(), (start + aligned).int(), aligned.int(), as_list)


def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """out[token_topk_to_pos[t, k]] = x[t] where the position is >= 0; every other row zero (upstream's reference)."""
    num_tokens, hidden = x.shape
    out = torch.zeros((pos_to_expert.shape[0], hidden), dtype=x.dtype, device=x.device)
    pos = token_topk_to_pos.reshape(-1).long()
    routed = pos >= 0
    out[pos[routed]] = x.repeat_interleave(token_topk_to_pos.shape[1], dim=0)[routed]
    return out


def expand_to_fused_with_sf(
    x: tuple[torch.Tensor, torch.Tensor], num_per_channels: int, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and their scale-factor rows gathered alike. With use_tma_aligned_col_major_sf the SF is the
    (N, hidden_sf) view, strides (1, align(N, 4)), of a (hidden_sf, align(N, 4)) buffer, as upstream returns."""
    data, sf = x
    num_expanded = pos_to_expert.shape[0]
    out = expand_to_fused(data, token_topk_to_pos, pos_to_expert)
    if use_tma_aligned_col_major_sf:
        out_sf = torch.zeros((sf.shape[1], (num_expanded + 3) // 4 * 4), dtype=sf.dtype, device=sf.device)[:, :num_expanded].T
    else:
        out_sf = torch.zeros((num_expanded, sf.shape[1]), dtype=sf.dtype, device=sf.device)
    pos = token_topk_to_pos.reshape(-1).long()
    routed = pos >= 0
    out_sf[pos[routed]] = sf.repeat_interleave(token_topk_to_pos.shape[1], dim=0)[routed]
    return out, out_sf


def fma_f32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """a * b + c for float32 tensors with a single rounding, as the GPU's fmaf, on any device.

    The product of two float32 values is exact in float64 (24 + 24 significant bits <= 53, exponents
    far inside float64's range). The sum with c, however, is not: rounding it to float64 and then to
    float32 can go wrong when the float64 result falls on a float32 midpoint. So the sum is rounded to
    odd instead: s = RN64(p + c) and its exact error e (Knuth's TwoSum, exact for any two float64 values);
    if e != 0 and s has an even last bit, s moves one float64 ulp towards e. Rounding to odd at 53 bits
    followed by round-to-nearest-even at 24 bits equals a single round-to-nearest-even at 24 bits, since
    53 >= 24 + 2 (Boldo and Melquiond, "When double rounding is odd", 2005); that also holds for results
    in float32's subnormal or overflow range, which are normal float64 values.
    """
    p = a.double() * b.double()
    c64 = c.double()
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    even = (s.view(torch.int64) & 1) == 0
    fix = (e != 0) & even & torch.isfinite(s)
    toward = torch.where(e > 0, torch.full_like(s, float('inf')), torch.full_like(s, float('-inf')))
    return torch.where(fix, torch.nextafter(s, toward), s).float()


E4M3_MAX = 448.0


def reduce_fused(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor], topk_weights: torch.Tensor | None, token_topk_to_pos: torch.Tensor,
    fp8_format: str = '', sf: torch.Tensor | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """acc = sum over k ascending of fma(x[pos], w[t, k] * x_sf[pos], acc) in float32 (pos < 0 skipped),
    then * sf[0] (fp8 output only) and the cast; e4m3 saturates to +-448 as the GPU's cvt.rn.satfinite
    does (torch's own cast would give NaN above 464)."""
    x, x_sf = x if isinstance(x, tuple) else (x, None)
    num_tokens, num_topk = token_topk_to_pos.shape
    out_dtype = torch.float8_e4m3fn if fp8_format == 'e4m3' else x.dtype
    acc = torch.zeros((num_tokens, x.shape[1]), dtype=torch.float32, device=x.device)
    for k in range(num_topk):
        pos = token_topk_to_pos[:, k].long()
        routed = pos >= 0
        if not bool(routed.any()):
            continue
        safe = pos.clamp(min=0)
        scale = topk_weights[:, k].float().clone() if topk_weights is not None else torch.ones(num_tokens, device=x.device)
        if x_sf is not None:
            scale = scale * x_sf[safe]
        acc = torch.where(routed[:, None], fma_f32(x[safe].float(), scale[:, None], acc), acc)
    if sf is not None:
        acc = acc * sf.reshape(-1)[0]
    if out_dtype == torch.float8_e4m3fn:
        acc = acc.clamp(-E4M3_MAX, E4M3_MAX)
    result = acc.to(out_dtype)
    if out is not None:
        out.copy_(result)
        return out
    return result
