"""moe ops (upstream TileKernels v1 names and signatures)."""

from __future__ import annotations

import torch

from tile_kernels_aot import _checks
from tile_kernels_aot._select import find_kernel
from tile_kernels_aot.config import get_num_sms

MAX_TOPK = 32  # topk_gate: one warp per token; lane k writes the k-th winner
MAX_GROUP_COUNT_BINS = 1024  # group_count / aux_fi keep a 1024-bin histogram in shared memory
MAX_UNIQUE_GROUPS = 1024  # inplace_unique_group_indices keeps 16 64-bit masks per token
MAX_GATE_GROUPS = 32  # topk_sum_and_topk_group_idx: one lane per group
INDEX_DTYPES = {torch.int64: 'int64', torch.int32: 'int32'}


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Select the top-k experts of each token.

    Args:
        scores: ``[num_tokens, num_experts]`` float32 CUDA tensor, contiguous in the expert dimension
            (the row stride is free). Larger is preferred. Scores should be finite: NaN ranks unspecified.
        num_topk: experts per token, ``1 <= num_topk <= min(num_experts, 32)``.

    Returns:
        ``[num_tokens, num_topk]`` int64 expert indices in rank order (best first); on equal scores the
        lower index comes first, as a stable descending sort would order them.
    """
    op = 'topk_gate'
    _checks.tensor(op, 'scores', scores, ndim=2, dtypes=(torch.float32,))
    num_tokens, num_experts = scores.shape
    _checks.integer(op, 'num_topk', num_topk, low=1, high=min(num_experts, MAX_TOPK))
    _checks.inner_contiguous(op, 'scores', scores)
    device = _checks.on_one_cuda_device(op, scores=scores)
    topk_idx = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if num_tokens == 0:
        return topk_idx
    kernel = find_kernel('moe.topk_gate', {'num_experts': num_experts, 'num_topk': num_topk}, device)
    kernel(device, {'scores': scores, 'topk_idx': topk_idx})
    return topk_idx


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """Rank groups of experts by the sum of their ``num_topk_sum`` largest scores and keep the best.

    Args:
        scores: ``[num_tokens, num_groups, experts_per_group]`` float32 CUDA tensor, contiguous in the last
            two dimensions (the token stride is free); ``num_groups <= 32``.
        num_topk_sum: 1 (a group's best score) or 2 (the sum of its two best).
        num_topk_groups: groups kept per token, at most ``num_groups``.

    Returns:
        ``[num_tokens, num_topk_groups]`` int64 group indices, best first; ties go to the lower index.
    """
    op = 'topk_sum_and_topk_group_idx'
    _checks.tensor(op, 'scores', scores, ndim=3, dtypes=(torch.float32,))
    num_tokens, num_groups, per_group = scores.shape
    _checks.integer(op, 'num_groups (scores.shape[1])', num_groups, low=1, high=MAX_GATE_GROUPS)
    _checks.integer(op, 'num_topk_sum', num_topk_sum, low=1, high=min(2, per_group))
    _checks.integer(op, 'num_topk_groups', num_topk_groups, low=1, high=num_groups)
    # The kernel reads row t as one run of num_groups * per_group scores.
    if (num_groups > 1 and scores.stride(1) != per_group) or (per_group > 1 and scores.stride(2) != 1):
        raise ValueError(f'{op}: scores must be contiguous in its last two dimensions, got strides {scores.stride()}')
    device = _checks.on_one_cuda_device(op, scores=scores)
    out = scores.new_empty((num_tokens, num_topk_groups), dtype=torch.int64)
    if num_tokens == 0:
        return out
    params = dict(num_groups=num_groups, experts_per_group=per_group, num_topk_sum=num_topk_sum, num_topk_groups=num_topk_groups)
    flat = scores.as_strided((num_tokens, num_groups * per_group), (scores.stride(0), 1))
    find_kernel('moe.topk_sum_and_topk_group_idx', params, device)(device, {'scores': flat, 'group_topk_idx': out})
    return out


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise each token's top-k weights to sum to one.

    Args:
        topk_weights: ``[num_tokens, num_topk]`` float32 CUDA tensor, contiguous in ``num_topk``.

    Returns:
        ``(denominator, normalized)``: ``denominator[t] = 1e-20 + w[t, 0] + w[t, 1] + ...`` summed in
        that order (float32, ``[num_tokens]``) and ``normalized = w / denominator`` (``[num_tokens, num_topk]``).
    """
    op = 'normalize_weight'
    _checks.tensor(op, 'topk_weights', topk_weights, ndim=2, dtypes=(torch.float32,))
    _checks.inner_contiguous(op, 'topk_weights', topk_weights)
    device = _checks.on_one_cuda_device(op, topk_weights=topk_weights)
    num_tokens, num_topk = topk_weights.shape
    denominator = topk_weights.new_empty((num_tokens,))
    normalized = topk_weights.new_empty((num_tokens, num_topk))
    if num_tokens and num_topk:
        tensors = {'topk_weights': topk_weights, 'denominator': denominator, 'normalized_weights': normalized}
        find_kernel('moe.normalize_weight', {'dtype': 'float32'}, device)(device, tensors)
    elif num_tokens:
        denominator.fill_(1e-20)
    return denominator, normalized


def _index_tensor(op: str, name: str, t: object) -> torch.Tensor:
    _checks.tensor(op, name, t, ndim=2, dtypes=tuple(INDEX_DTYPES))
    _checks.inner_contiguous(op, name, t)
    return t


def _persistent_blocks(num_tokens: int, device: int) -> int:
    """Blocks of a grid-stride loop over tokens: 2 per SM, fewer when there are fewer tokens."""
    return max(1, min(2 * get_num_sms(device), -(-num_tokens // 128)))


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Count how often each group (expert) index appears; entries of -1 are padding and not counted.

    Args:
        group_idx: ``[num_tokens, num_topk]`` int64 (or int32) CUDA tensor of indices in
            ``[-1, num_groups)``, contiguous in ``num_topk``. An index of ``num_groups`` or more fails a
            device-side assert.
        num_groups: number of groups, at most 1024.

    Returns:
        ``[num_groups]`` int32 counts. Exact and independent of ``config.set_num_sms``.
    """
    op = 'group_count'
    _index_tensor(op, 'group_idx', group_idx)
    _checks.integer(op, 'num_groups', num_groups, low=1, high=MAX_GROUP_COUNT_BINS)
    device = _checks.on_one_cuda_device(op, group_idx=group_idx)
    out = torch.zeros((num_groups,), dtype=torch.int32, device=group_idx.device)
    if group_idx.numel():
        kernel = find_kernel('moe.group_count', {'index_dtype': INDEX_DTYPES[group_idx.dtype]}, device)
        kernel(device, {'group_idx': group_idx, 'out': out}, {'num_blocks': _persistent_blocks(group_idx.shape[0], device)})
    return out


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """Per-expert load fraction of the auxiliary loss: ``count_e * num_experts / (num_tokens * num_aux_topk)``.

    Args:
        topk_idx: ``[num_tokens, num_topk]`` int64 (or int32) expert indices in ``[-1, num_experts)``
            (-1 is padding), contiguous in ``num_topk``.
        num_experts: experts, at most 1024.
        num_aux_topk: the top-k the loss normalises by (usually ``num_topk``).

    Returns:
        ``[num_experts]`` float32. The counts are exact integers and each value is rounded once, so the
        result does not depend on ``config.set_num_sms`` (upstream sums per-block fractions with float
        atomics, whose order varies; the values agree to float rounding).
    """
    op = 'aux_fi'
    _index_tensor(op, 'topk_idx', topk_idx)
    _checks.integer(op, 'num_experts', num_experts, low=1, high=MAX_GROUP_COUNT_BINS)
    _checks.integer(op, 'num_aux_topk', num_aux_topk, low=1)
    device = _checks.on_one_cuda_device(op, topk_idx=topk_idx)
    num_tokens = topk_idx.shape[0]
    if num_tokens == 0:
        return torch.zeros((num_experts,), dtype=torch.float32, device=topk_idx.device)  # as upstream
    out = torch.empty((num_experts,), dtype=torch.float32, device=topk_idx.device)
    counts = torch.zeros((num_experts,), dtype=torch.int32, device=topk_idx.device)
    kernel = find_kernel('moe.aux_fi', {'index_dtype': INDEX_DTYPES[topk_idx.dtype]}, device)
    kernel(device, {'topk_idx': topk_idx, 'counts': counts, 'out': out},
           {'num_aux_topk': num_aux_topk, 'num_blocks': _persistent_blocks(num_tokens, device)})
    return out


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """In each row, replace every repeat of an index already seen in that row by -1, in place.

    Args:
        group_indices: ``[num_tokens, num_topk]`` int64 (or int32) CUDA tensor of indices in
            ``[-1, num_groups)``, contiguous in ``num_topk``; negative entries are left alone.
        num_groups: number of groups, at most 1024.
    """
    op = 'inplace_unique_group_indices'
    _index_tensor(op, 'group_indices', group_indices)
    _checks.integer(op, 'num_groups', num_groups, low=1, high=MAX_UNIQUE_GROUPS)
    device = _checks.on_one_cuda_device(op, group_indices=group_indices)
    if group_indices.numel():
        kernel = find_kernel('moe.inplace_unique_group_indices', {'index_dtype': INDEX_DTYPES[group_indices.dtype]}, device)
        kernel(device, {'group_indices': group_indices}, {'num_groups': num_groups})


def mask_indices_by_tp(indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int) -> torch.Tensor:
    """Keep the experts served by this tensor-parallel rank, renumbered to its local range; others -1.

    With ``per_gpu = n // num_ep_ranks`` and ``per_dp = num_tp_ranks * per_gpu``: an index ``i`` is kept
    when ``i >= 0`` and ``(i // per_gpu) % num_tp_ranks == tp_rank``, and becomes
    ``v - (v // per_dp) * (per_dp - per_gpu)`` with ``v = i - tp_rank * per_gpu``.

    Args:
        indices: ``[num_tokens, num_topk]`` int64 or int32 CUDA tensor, contiguous in ``num_topk``.
        n: experts across all ranks; num_ep_ranks: expert-parallel size (``n // num_ep_ranks >= 1``);
        tp_rank, num_tp_ranks: this rank and the tensor-parallel size.

    Returns:
        A new tensor like ``indices`` (contiguous).
    """
    op = 'mask_indices_by_tp'
    _index_tensor(op, 'indices', indices)
    _checks.integer(op, 'num_ep_ranks', num_ep_ranks, low=1)
    _checks.integer(op, 'n', n, low=num_ep_ranks)
    _checks.integer(op, 'num_tp_ranks', num_tp_ranks, low=1)
    _checks.integer(op, 'tp_rank', tp_rank, low=0, high=num_tp_ranks - 1)
    device = _checks.on_one_cuda_device(op, indices=indices)
    per_gpu = n // num_ep_ranks
    out = indices.new_empty(indices.shape)
    if indices.numel():
        kernel = find_kernel('moe.mask_indices_by_tp', {'index_dtype': INDEX_DTYPES[indices.dtype]}, device)
        scalars = {'per_gpu': per_gpu, 'per_dp': num_tp_ranks * per_gpu, 'num_tp_ranks': num_tp_ranks, 'tp_rank': tp_rank}
        kernel(device, {'indices': indices, 'masked_indices': out}, scalars)
    return out
