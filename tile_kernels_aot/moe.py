"""moe ops (upstream TileKernels v1 names and signatures)."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch.compiler import is_compiling

from tile_kernels_aot import _checks, _custom_ops, _plans
from tile_kernels_aot import _index_checks
from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot._select import find_kernel, kernel_constant
from tile_kernels_aot.config import get_device_num_sms, get_num_sms

# Argument domains the ops check before they look at a device (the kernels' check() refuses specs beyond them at build
# time). Limits that only a kernel knows come from its manifest entries (kernel_constant), like everything the ops
# compute a launch with.
MAX_TOPK = 32  # topk_gate: one warp per token; lane k writes the k-th winner
MAX_UNIQUE_GROUPS = 1024  # inplace_unique_group_indices: the op's bound (the kernel compares the indices themselves)
MAX_GATE_GROUPS = 32  # topk_sum_and_topk_group_idx: one lane per group
INDEX_DTYPES = {torch.int64: 'int64', torch.int32: 'int32'}


@_plans.launch_plan
def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """Select the top-k experts of each token.

    Args:
        scores: ``[num_tokens, num_experts]`` float32 CUDA tensor, contiguous in the expert dimension
            (the row stride is free). Larger is preferred; infinities rank as numbers. A NaN score stops the kernel
            at a device-side assert (TILE_KERNELS_AOT_CHECK_INDICES=1 raises ValueError before it instead).
        num_topk: experts per token, ``1 <= num_topk <= min(num_experts, 32)``.

    Returns:
        ``[num_tokens, num_topk]`` int64 expert indices in rank order (best first); on equal scores the
        lower index comes first, as a stable descending sort would order them.
    """
    if is_compiling():
        return _custom_ops.topk_gate(scores, num_topk)
    op = 'topk_gate'
    _checks.tensor(op, 'scores', scores, ndim=2, dtypes=(torch.float32,))
    num_tokens, num_experts = scores.shape
    _checks.integer(op, 'num_topk', num_topk, low=1, high=min(num_experts, MAX_TOPK))
    _checks.inner_contiguous(op, 'scores', scores)
    device = _checks.on_one_cuda_device(op, scores=scores)
    topk_idx = scores.new_empty((num_tokens, num_topk), dtype=torch.int64)
    if _index_checks.enabled:
        _index_checks.finite(op, 'scores', scores, infinities=True)
    if num_tokens == 0:
        return topk_idx
    kernel = find_kernel('moe.topk_gate', {'num_experts': num_experts, 'num_topk': num_topk}, device)
    kernel(device, {'scores': scores, 'topk_idx': topk_idx})
    return topk_idx


@_plans.launch_plan
def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """Rank groups of experts by the sum of their ``num_topk_sum`` largest scores and keep the best.

    Args:
        scores: ``[num_tokens, num_groups, experts_per_group]`` float32 CUDA tensor, contiguous in the last
            two dimensions (the token stride is free); ``num_groups <= 32``. Every score must be finite: a NaN or
            infinity stops the kernel at a device-side assert (TILE_KERNELS_AOT_CHECK_INDICES=1 raises ValueError before
            it instead).
        num_topk_sum: 1 (a group's best score) or 2 (the sum of its two best).
        num_topk_groups: groups kept per token, at most ``num_groups``.

    Returns:
        ``[num_tokens, num_topk_groups]`` int64 group indices, best first; ties go to the lower index.
    """
    if is_compiling():
        return _custom_ops.topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups)
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
    if _index_checks.enabled:
        _index_checks.finite(op, 'scores', scores)
    if num_tokens == 0:
        return out
    params = dict(num_groups=num_groups, experts_per_group=per_group, num_topk_sum=num_topk_sum, num_topk_groups=num_topk_groups)
    flat = scores.as_strided((num_tokens, num_groups * per_group), (scores.stride(0), 1))
    find_kernel('moe.topk_sum_and_topk_group_idx', params, device)(device, {'scores': flat, 'group_topk_idx': out})
    return out


SCORING_FUNCS = ('sigmoid', 'sqrtsoftplus', 'softmax')  # top2_sum_gate's; the kernel's run-time id of each is its constant scoring_<name>
MAX_GATE_EXPERTS = 1024  # top2_sum_gate: a warp holds a token's scores in registers


def _placeholders(device: torch.device, num_topk: int) -> dict[str, torch.Tensor]:
    """top2_sum_gate's stand-ins for its optional tensors, which the kernel binds but never reads when the matching
    has_* flag is 0."""
    def make():
        flag = torch.zeros((1,), dtype=torch.bool, device=device)
        count = torch.ones((1,), dtype=torch.int32, device=device)
        return {'mask': flag, 'fix_routing_mask': flag, 'to_physical_map': count.view(1, 1), 'logical_count': count,
                'unmapped_topk_idx': torch.zeros((1, num_topk), dtype=torch.int64, device=device)}
    return _plans.stand_ins(('top2_sum_gate', device, num_topk), make)


def _optional(op: str, name: str, t: object, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    _checks.tensor(op, name, t, ndim=len(shape), dtypes=(dtype,))
    if tuple(t.shape) != shape:
        raise ValueError(f'{op}: {name} must have shape {shape}, got {tuple(t.shape)}')


@_plans.launch_plan
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
    mask: Optional[torch.Tensor] = None,
    fix_routing_mask: Optional[torch.Tensor] = None,
    to_physical_map: Optional[torch.Tensor] = None,
    logical_count: Optional[torch.Tensor] = None,
    unmapped_topk_idx: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 style routing: score, rank with bias, keep the best groups, pick the top-k, weigh.

    Per routed token ``t`` (``mask[t]``, default all): scores ``s`` are ``sigmoid(l)``,
    ``sqrt(softplus(l))`` or ``softmax(l)``; experts rank by ``s + bias`` (softmax: ``l + bias``). With
    grouping (``num_groups != num_topk_groups``) only the ``num_topk_groups`` groups with the largest sum of
    their two best ranking scores compete. The ``num_topk`` best experts (ties to the lower index; with
    ``fix_routing_mask[t]``, the indices already in ``unmapped_topk_idx[t]``) get weights
    ``s_k / (1e-20 + s_0 + ... + s_{K-1}) * routed_scaling_factor``. With ``use_shared_as_routed``,
    ``num_shared_experts`` slots with ids ``E .. E+S-1`` and weight 1 follow. ``to_physical_map`` maps each
    logical id to replica ``(ep_rank + t * 23333) % logical_count[id]`` (``t`` the row, masked rows
    included). Last, ids on other tensor-parallel ranks become -1 and the others are renumbered as
    ``mask_indices_by_tp`` does, with ``(E + extra experts) // num_ep_ranks`` experts per rank. Masked-out
    rows get ids -1 and weights 0.

    Args:
        logits: ``[num_tokens, E]`` float32 CUDA tensor, contiguous, 16-byte aligned, finite on the routed rows (a
            device-side assert fires otherwise); ``E`` a multiple of 4, at most 1024.
        bias: ``[E]`` float32, contiguous, finite; used for ranking only.
        num_topk: routed experts per token, ``num_topk + shared slots <= 32``.
        num_topk_groups, num_groups: both 0 (or equal) for no grouping; else ``num_groups <= 32`` dividing
            ``E`` into groups of at most 32 experts.
        use_shared_as_routed, num_shared_experts: append ``num_shared_experts`` (1 or 2, dividing
            ``num_topk``) shared-expert slots; needs a ``to_physical_map`` with at least that many extra
            replicas, as upstream.
        routed_scaling_factor: multiplies the normalised routed weights.
        ep_rank, num_ep_ranks, tp_rank, num_tp_ranks: this rank's place in expert/tensor parallelism.
        scoring_func: ``'sigmoid'``, ``'sqrtsoftplus'`` or ``'softmax'``.
        mask: ``[num_tokens]`` bool; False rows are not routed.
        fix_routing_mask: ``[num_tokens]`` bool; True rows reuse ``unmapped_topk_idx`` (which must be given).
        to_physical_map: ``[E + S, 1 + extra]`` int32, contiguous; with ``logical_count`` ``[E + S]`` int32.
        unmapped_topk_idx: ``[num_tokens, num_topk]`` int64, contiguous in ``num_topk``; receives the
            logical routed ids (-1 on masked rows).

    Returns:
        ``(topk_idx, topk_weights)``: int64 and float32, ``[num_tokens, num_topk + S]``.
    """
    if is_compiling():
        return _custom_ops.top2_sum_gate(logits, bias, num_topk, num_topk_groups, num_groups, use_shared_as_routed, num_shared_experts,
                                         routed_scaling_factor, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, scoring_func, mask,
                                         fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx)
    op = 'top2_sum_gate'
    _checks.tensor(op, 'logits', logits, ndim=2, dtypes=(torch.float32,))
    num_tokens, num_experts = logits.shape
    if num_experts % 4 or not 4 <= num_experts <= MAX_GATE_EXPERTS:
        raise ValueError(f'{op}: logits must have a multiple of 4 experts in [4, {MAX_GATE_EXPERTS}], got {num_experts}')
    if num_tokens and (not logits.is_contiguous() or logits.data_ptr() % 16):
        raise ValueError(f'{op}: logits must be contiguous and 16-byte aligned (it is read in float4 vectors)')
    _checks.tensor(op, 'bias', bias, ndim=1, dtypes=(torch.float32,))
    if bias.shape[0] != num_experts or not bias.is_contiguous() or bias.data_ptr() % 16:
        raise ValueError(f'{op}: bias must be a contiguous, 16-byte aligned [{num_experts}] tensor, got shape {tuple(bias.shape)}')
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f'{op}: scoring_func must be one of {sorted(SCORING_FUNCS)}, got {scoring_func!r}')
    _checks.integer(op, 'num_topk', num_topk, low=1, high=min(num_experts, MAX_TOPK))
    _checks.integer(op, 'num_groups', num_groups, low=0, high=MAX_GATE_GROUPS)
    _checks.integer(op, 'num_topk_groups', num_topk_groups, low=0, high=num_groups)
    if (num_groups == 0) != (num_topk_groups == 0):
        raise ValueError(f'{op}: num_groups and num_topk_groups must both be 0 or both positive, got {num_groups} and {num_topk_groups}')
    if num_groups == num_topk_groups:
        num_groups = num_topk_groups = 0  # every group kept: no grouping
    elif num_experts % num_groups or num_experts // num_groups > 32:
        raise ValueError(f'{op}: num_groups must divide the {num_experts} experts into groups of at most 32, got {num_groups}')
    elif num_topk_groups * (num_experts // num_groups) < num_topk:
        raise ValueError(f'{op}: the {num_topk_groups} kept groups hold fewer than num_topk={num_topk} experts')
    if not isinstance(use_shared_as_routed, bool):
        raise TypeError(f'{op}: use_shared_as_routed must be a bool, got {type(use_shared_as_routed).__name__}')
    if use_shared_as_routed:
        _checks.integer(op, 'num_shared_experts', num_shared_experts, low=1, high=2)
        if num_topk % num_shared_experts or num_experts % (num_topk // num_shared_experts):
            raise ValueError(f'{op}: with use_shared_as_routed, num_shared_experts must divide num_topk and num_topk // num_shared_experts '
                             f'must divide the {num_experts} experts, got {num_shared_experts} and {num_topk}')
    num_shared = num_shared_experts if use_shared_as_routed else 0
    num_slots = num_topk + num_shared
    if num_slots > MAX_TOPK:
        raise ValueError(f'{op}: num_topk plus shared slots must be at most {MAX_TOPK}, got {num_slots}')
    if not isinstance(routed_scaling_factor, (int, float)) or isinstance(routed_scaling_factor, bool):
        raise TypeError(f'{op}: routed_scaling_factor must be a float, got {type(routed_scaling_factor).__name__}')
    _checks.integer(op, 'num_ep_ranks', num_ep_ranks, low=1)
    _checks.integer(op, 'ep_rank', ep_rank, low=0, high=num_ep_ranks - 1)
    _checks.integer(op, 'num_tp_ranks', num_tp_ranks, low=1)
    _checks.integer(op, 'tp_rank', tp_rank, low=0, high=num_tp_ranks - 1)
    num_logical = num_experts + num_shared
    tensors = {'logits': logits, 'bias': bias}
    if mask is not None:
        _optional(op, 'mask', mask, (num_tokens,), torch.bool)
        tensors['mask'] = mask.contiguous()
    if (to_physical_map is None) != (logical_count is None):
        raise ValueError(f'{op}: to_physical_map and logical_count must be given together')
    num_extra = 0
    if to_physical_map is not None:
        _checks.tensor(op, 'to_physical_map', to_physical_map, ndim=2, dtypes=(torch.int32,))
        if to_physical_map.shape[0] != num_logical or not to_physical_map.is_contiguous():
            raise ValueError(f'{op}: to_physical_map must be contiguous with {num_logical} rows (routed + shared experts), got shape {tuple(to_physical_map.shape)}')
        _optional(op, 'logical_count', logical_count, (num_logical,), torch.int32)
        num_extra = to_physical_map.shape[1] - 1
        tensors.update(to_physical_map=to_physical_map, logical_count=logical_count.contiguous())
    if num_shared > num_extra:
        raise ValueError(f'{op}: {num_shared} shared experts as routed need a to_physical_map with at least as many extra replicas, got {num_extra}')
    experts_per_rank = (num_experts + num_extra) // num_ep_ranks
    if experts_per_rank < 1:
        raise ValueError(f'{op}: num_ep_ranks={num_ep_ranks} leaves no expert per rank')
    if unmapped_topk_idx is not None:
        _optional(op, 'unmapped_topk_idx', unmapped_topk_idx, (num_tokens, num_topk), torch.int64)
        _checks.inner_contiguous(op, 'unmapped_topk_idx', unmapped_topk_idx)
        tensors['unmapped_topk_idx'] = unmapped_topk_idx
    if fix_routing_mask is not None:
        if unmapped_topk_idx is None:
            raise ValueError(f'{op}: fix_routing_mask needs unmapped_topk_idx, the indices to reuse')
        _optional(op, 'fix_routing_mask', fix_routing_mask, (num_tokens,), torch.bool)
        tensors['fix_routing_mask'] = fix_routing_mask.contiguous()
    device = _checks.on_one_cuda_device(op, **tensors)
    if to_physical_map is not None:
        max_replicas = kernel_constant('moe.top2_sum_gate', 'max_replicas', device)  # the replica hash is exact up to it
        if num_extra + 1 > max_replicas:
            raise ValueError(f'{op}: to_physical_map may have at most {max_replicas} replicas per expert, got {num_extra + 1}')
    if _index_checks.enabled:
        _index_checks.finite(op, 'logits', logits, rows=mask)  # the kernel scores the routed rows
        if num_tokens and (mask is None or bool(mask.any())):
            _index_checks.finite(op, 'bias', bias)
        if fix_routing_mask is not None:  # the rows that read unmapped_topk_idx: fixed and routed
            rows = fix_routing_mask if mask is None else fix_routing_mask & mask
            _index_checks.within(op, 'unmapped_topk_idx', unmapped_topk_idx, 0, num_experts, rows=rows,
                                 what=f'the rows with fix_routing_mask set hold expert ids in [0, {num_experts})')
        if logical_count is not None:
            _index_checks.within(op, 'logical_count', logical_count, 1, num_extra + 2,
                                 what=f'replica counts are in [1, {num_extra + 1}] (the columns of to_physical_map)')
    topk_idx = logits.new_empty((num_tokens, num_slots), dtype=torch.int64)
    topk_weights = logits.new_empty((num_tokens, num_slots))
    if num_tokens == 0:
        return topk_idx, topk_weights
    spec = dict(num_experts=num_experts, num_topk=num_topk, num_groups=num_groups, num_topk_groups=num_topk_groups)
    kernel = find_kernel('moe.top2_sum_gate', spec, device)
    scalars = {
        'scoring': kernel.entry.constants[f'scoring_{scoring_func}'], 'routed_scaling_factor': float(routed_scaling_factor),
        'has_mask': mask is not None, 'has_fix': fix_routing_mask is not None, 'has_unmapped': unmapped_topk_idx is not None,
        'has_map': to_physical_map is not None, 'ep_rank': ep_rank, 'experts_per_rank': experts_per_rank,
        'experts_per_dp': experts_per_rank * num_tp_ranks, 'tp_rank': tp_rank, 'num_tp_ranks': num_tp_ranks,
    }
    kernel(device, {**_placeholders(logits.device, num_topk), **tensors, 'topk_idx': topk_idx, 'topk_weights': topk_weights}, scalars)
    return topk_idx, topk_weights


@_plans.launch_plan
def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalise each token's top-k weights to sum to one.

    Args:
        topk_weights: ``[num_tokens, num_topk]`` float32 CUDA tensor, contiguous in ``num_topk``.

    Returns:
        ``(denominator, normalized)``: ``denominator[t] = 1e-20 + w[t, 0] + w[t, 1] + ...`` summed in
        that order (float32, ``[num_tokens]``) and ``normalized = w / denominator`` (``[num_tokens, num_topk]``).
    """
    if is_compiling():
        return _custom_ops.normalize_weight(topk_weights)
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


def _persistent_blocks(kernel: LoadedKernel, num_tokens: int, device: int) -> int:
    """Blocks of group_count's or aux_fi's grid-stride loop over tokens, of which a block counts rows_per_block
    consecutive rows a step: 2 per SM, fewer when the tokens fill fewer blocks. A block past the last row would count
    nothing, yet still launch and flush: aux_fi's blocks each make one atomic per expert, so that idle blocks would add
    contention on the same slots."""
    return max(1, min(2 * get_num_sms(device), -(-num_tokens // kernel.entry.constants['rows_per_block'])))


@_plans.launch_plan
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
    if is_compiling():
        return _custom_ops.group_count(group_idx, num_groups)
    op = 'group_count'
    _index_tensor(op, 'group_idx', group_idx)
    device = _checks.on_one_cuda_device(op, group_idx=group_idx)
    _checks.integer(op, 'num_groups', num_groups, low=1, high=kernel_constant('moe.group_count', 'max_bins', device))
    if _index_checks.enabled:
        _index_checks.below(op, 'group_idx', group_idx, num_groups, what=f'num_groups ({num_groups})')
    if not group_idx.numel():
        return torch.zeros((num_groups,), dtype=torch.int32, device=group_idx.device)
    kernel = find_kernel('moe.group_count', {'index_dtype': INDEX_DTYPES[group_idx.dtype]}, device)
    num_blocks = _persistent_blocks(kernel, group_idx.shape[0], device)
    # Several blocks add their counts to a zeroed output; one block writes every count itself.
    out = (torch.empty if num_blocks == 1 else torch.zeros)((num_groups,), dtype=torch.int32, device=group_idx.device)
    kernel(device, {'group_idx': group_idx, 'out': out}, {'num_blocks': num_blocks})
    return out


@_plans.launch_plan
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
    if is_compiling():
        return _custom_ops.aux_fi(topk_idx, num_experts, num_aux_topk)
    op = 'aux_fi'
    _index_tensor(op, 'topk_idx', topk_idx)
    _checks.integer(op, 'num_aux_topk', num_aux_topk, low=1)
    device = _checks.on_one_cuda_device(op, topk_idx=topk_idx)
    _checks.integer(op, 'num_experts', num_experts, low=1, high=kernel_constant('moe.aux_fi', 'max_bins', device))
    if _index_checks.enabled:
        _index_checks.below(op, 'topk_idx', topk_idx, num_experts, what=f'num_experts ({num_experts})')
    num_tokens = topk_idx.shape[0]
    if num_tokens == 0:
        return torch.zeros((num_experts,), dtype=torch.float32, device=topk_idx.device)  # as upstream
    kernel = find_kernel('moe.aux_fi', {'index_dtype': INDEX_DTYPES[topk_idx.dtype]}, device)
    num_blocks = _persistent_blocks(kernel, num_tokens, device)
    out = torch.empty((num_experts,), dtype=torch.float32, device=topk_idx.device)
    if num_blocks == 1:  # one block has the whole count and leaves the slots alone
        slots = _unused_slots(topk_idx.device, num_experts)
    else:
        slots = torch.zeros((num_experts,), dtype=torch.int64, device=topk_idx.device)  # blocks arrived << 32 | count
    kernel(device, {'topk_idx': topk_idx, 'slots': slots, 'out': out}, {'num_aux_topk': num_aux_topk, 'num_blocks': num_blocks})
    return out


def _unused_slots(device: torch.device, num_experts: int) -> torch.Tensor:
    """aux_fi's slots for a grid of one block, which binds them and never touches them."""
    return _plans.stand_ins(('aux_fi', device, num_experts),
                            lambda: {'slots': torch.empty((num_experts,), dtype=torch.int64, device=device)})['slots']


@_plans.launch_plan
def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """In each row, replace every repeat of an index already seen in that row by -1, in place.

    Args:
        group_indices: ``[num_tokens, num_topk]`` int64 (or int32) CUDA tensor of indices in
            ``[-1, num_groups)``, contiguous in ``num_topk``; negative entries are left alone.
        num_groups: number of groups, at most 1024.
    """
    if is_compiling():
        return _custom_ops.inplace_unique_group_indices(group_indices, num_groups)
    op = 'inplace_unique_group_indices'
    _index_tensor(op, 'group_indices', group_indices)
    _checks.integer(op, 'num_groups', num_groups, low=1, high=MAX_UNIQUE_GROUPS)
    device = _checks.on_one_cuda_device(op, group_indices=group_indices)
    if _index_checks.enabled:
        _index_checks.below(op, 'group_indices', group_indices, num_groups, what=f'num_groups ({num_groups})')
    if group_indices.numel():
        kernel = find_kernel('moe.inplace_unique_group_indices', {'index_dtype': INDEX_DTYPES[group_indices.dtype]}, device)
        kernel(device, {'group_indices': group_indices})


@_plans.launch_plan
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
    if is_compiling():
        return _custom_ops.mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
    op = 'mask_indices_by_tp'
    _index_tensor(op, 'indices', indices)
    _checks.integer(op, 'num_ep_ranks', num_ep_ranks, low=1)
    _checks.integer(op, 'n', n, low=num_ep_ranks)
    _checks.integer(op, 'num_tp_ranks', num_tp_ranks, low=1)
    _checks.integer(op, 'tp_rank', tp_rank, low=0, high=num_tp_ranks - 1)
    device = _checks.on_one_cuda_device(op, indices=indices)
    if _index_checks.enabled:
        _index_checks.below(op, 'indices', indices, n, what=f'n ({n})')
    per_gpu = n // num_ep_ranks
    out = indices.new_empty(indices.shape)
    if indices.numel():
        kernel = find_kernel('moe.mask_indices_by_tp', {'index_dtype': INDEX_DTYPES[indices.dtype]}, device)
        scalars = {'per_gpu': per_gpu, 'per_dp': num_tp_ranks * per_gpu, 'num_tp_ranks': num_tp_ranks, 'tp_rank': tp_rank}
        kernel(device, {'indices': indices, 'masked_indices': out}, scalars)
    return out


# -- the fused (expert-major) layout ---------------------------------------------------------------

_INT32_LIMIT = 2**31 - 1  # positions and flat pair indices are int32 in the kernels
_EXPAND_CARRIERS = {1: torch.uint8, 2: torch.float16, 4: torch.int32}  # bit-for-bit stand-ins by element size
_REDUCE_IN = {torch.float32: 'float32', torch.bfloat16: 'bfloat16'}


def _fused_placeholders(device: torch.device) -> dict[str, torch.Tensor]:
    """The fused-layout ops' stand-ins for absent optional tensors, never read by the kernels."""
    def make():
        one = torch.ones((1,), dtype=torch.float32, device=device)
        return {'no_sf': torch.empty((1, 0), dtype=torch.int32, device=device), 'one': one, 'one_2d': one.view(1, 1)}
    return _plans.stand_ins(('fused layout', device), make)


def _contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f'{op}: {name} must be contiguous, got strides {t.stride()} for shape {tuple(t.shape)}')


def _fused_maps(op: str, token_topk_to_pos: object, pos_to_expert: object | None, num_tokens: int | None) -> None:
    _checks.tensor(op, 'token_topk_to_pos', token_topk_to_pos, ndim=2, dtypes=(torch.int32,))
    _contiguous(op, 'token_topk_to_pos', token_topk_to_pos)
    if num_tokens is not None and token_topk_to_pos.shape[0] != num_tokens:
        raise ValueError(f'{op}: token_topk_to_pos has {token_topk_to_pos.shape[0]} rows, x has {num_tokens} tokens')
    if token_topk_to_pos.shape[1] < 1:
        raise ValueError(f'{op}: token_topk_to_pos must have at least one column (num_topk >= 1)')
    if pos_to_expert is not None:
        _checks.tensor(op, 'pos_to_expert', pos_to_expert, ndim=1, dtypes=(torch.int32,))
        _contiguous(op, 'pos_to_expert', pos_to_expert)
        if pos_to_expert.shape[0] > _INT32_LIMIT:
            raise ValueError(f'{op}: pos_to_expert has {pos_to_expert.shape[0]} positions, more than int32 positions can address')


def get_fused_mapping(
    topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int, force_no_sync: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Build the expert-major ("fused") layout of a routing.

    Expert ``e`` owns positions ``[expert_start[e], expert_end[e])``, experts in index order, a segment
    of ``align(count_e, alignment)`` positions. Each (token, k) pair with ``topk_idx[t, k] >= 0`` gets one
    position in its expert's segment; within a segment the pairs are in ascending ``t * num_topk + k``
    order (upstream leaves the order implementation-defined; this one is also independent of
    ``config.set_num_sms``). Padding positions hold -1 in all three ``pos_to_*`` arrays.

    Args:
        topk_idx: ``[num_tokens, num_topk]`` int64 (or int32) CUDA tensor of expert indices in
            ``[-1, num_experts)``, contiguous in ``num_topk``; negative entries are not routed. An index
            of ``num_experts`` or more fails a device-side assert.
        num_experts: experts, at most 1024.
        num_expanded_tokens: positions in the fused buffer. ``0`` sizes it by upstream's bound
            ``(T*K + (alignment-1)*E) // alignment * alignment``; then, unless ``force_no_sync``, the
            outputs are trimmed to the positions used, which reads the counts back (a host sync). A
            non-zero value too small for the routing fails a device-side assert.
        alignment: segment alignment, >= 1.
        force_no_sync: with ``num_expanded_tokens == 0``, keep the bound-sized buffers and skip the sync.
            (Upstream allocates zero positions in that case and writes past them.)

    Returns:
        ``(pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end,
        num_tokens_per_expert, num_tokens_per_expert_list)``: int32 ``[N]`` x 3 (``pos_to_token_topk``
        holds ``t * num_topk + k``), int32 ``[num_tokens, num_topk]`` (-1 for unrouted pairs), int32
        ``[num_experts]`` x 3 (``num_tokens_per_expert`` holds the *aligned* counts), and those counts
        as a list when the host synced, else ``[]``.
    """
    if is_compiling():
        return _custom_ops.get_fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    mapping = _fused_mapping(topk_idx, num_experts, num_expanded_tokens, alignment, force_no_sync)
    if num_expanded_tokens or force_no_sync:
        return (*mapping, [])
    counts = mapping[6].tolist()  # the host sync
    used = sum(counts)
    return (mapping[0][:used], mapping[1][:used], mapping[2][:used], *mapping[3:], counts)


@_plans.launch_plan
def _fused_mapping(topk_idx: torch.Tensor, num_experts: int, num_expanded_tokens: int, alignment: int,
                   force_no_sync: bool) -> tuple[torch.Tensor, ...]:
    """get_fused_mapping's checks and launch, with outputs of ``num_expanded_tokens`` positions (upstream's bound where
    that is 0): a launch plan replays it, and get_fused_mapping's host sync and trim come after."""
    op = 'get_fused_mapping'
    _index_tensor(op, 'topk_idx', topk_idx)
    num_tokens, num_topk = topk_idx.shape
    _checks.integer(op, 'num_expanded_tokens', num_expanded_tokens, low=0, high=_INT32_LIMIT)
    _checks.integer(op, 'alignment', alignment, low=1, high=_INT32_LIMIT)
    if not isinstance(force_no_sync, bool):
        raise TypeError(f'{op}: force_no_sync must be a bool, got {type(force_no_sync).__name__}')
    if num_topk < 1:
        raise ValueError(f'{op}: topk_idx must have at least one column (num_topk >= 1)')
    if num_tokens * num_topk > _INT32_LIMIT:
        raise ValueError(f'{op}: {num_tokens} x {num_topk} pairs exceed the int32 range the kernel indexes with')
    device = _checks.on_one_cuda_device(op, topk_idx=topk_idx)
    _checks.integer(op, 'num_experts', num_experts, low=1, high=kernel_constant('moe.get_fused_mapping', 'max_experts', device))
    if _index_checks.enabled:
        _index_checks.below(op, 'topk_idx', topk_idx, num_experts, what=f'num_experts ({num_experts})')
        if num_expanded_tokens:
            _index_checks.fused_positions_fit(op, topk_idx, num_experts, alignment, num_expanded_tokens)
    if num_expanded_tokens == 0:
        num_expanded_tokens = (num_tokens * num_topk + (alignment - 1) * num_experts) // alignment * alignment
        if num_expanded_tokens > _INT32_LIMIT:
            raise ValueError(f'{op}: the fused buffer bound {num_expanded_tokens} exceeds the int32 range; pass num_expanded_tokens')

    # One block per SM at most: a block (256 threads, ~41 KB of shared memory) always fits on an SM, so the
    # cooperative grid is co-resident. Within that, more blocks shorten each warp's serial walk over its
    # pairs and spread the scattered stores, but every block reads every block's counts after the grid
    # barrier (one L2 round trip per 32 blocks), so the best count grows like the square root of the pairs
    # (E 256, K 8 on the H200): sqrt(pairs / 8) gives 11 blocks at 128 tokens, 91 at 8192, all SMs at 32768.
    # The result does not depend on the count.
    sms = min(get_num_sms(device), get_device_num_sms(device))
    num_blocks = max(1, min(sms, round(math.sqrt(num_tokens * num_topk / 8))))
    new = topk_idx.new_empty
    pos_to_expert, pos_to_token, pos_to_token_topk = (new((num_expanded_tokens,), dtype=torch.int32) for _ in range(3))
    token_topk_to_pos = new((num_tokens, num_topk), dtype=torch.int32)
    expert_start, expert_end, num_tokens_per_expert = (new((num_experts,), dtype=torch.int32) for _ in range(3))
    block_counts = new((num_blocks, num_experts), dtype=torch.int32)
    tensors = {
        'topk_idx': topk_idx, 'pos_to_expert': pos_to_expert, 'pos_to_token': pos_to_token, 'pos_to_token_topk': pos_to_token_topk,
        'token_topk_to_pos': token_topk_to_pos, 'expert_start': expert_start, 'expert_end': expert_end,
        'num_tokens_per_expert': num_tokens_per_expert, 'block_counts': block_counts,
    }
    kernel = find_kernel('moe.get_fused_mapping', {'index_dtype': INDEX_DTYPES[topk_idx.dtype]}, device)
    kernel(device, tensors, {'alignment': alignment})
    return pos_to_expert, pos_to_token, pos_to_token_topk, token_topk_to_pos, expert_start, expert_end, num_tokens_per_expert


get_fused_mapping.plans = _fused_mapping.plans  # its launch plans (tests and benchmarks read them): the sync comes after


def _expand(x: torch.Tensor, x_sf: torch.Tensor | None, out_sf: torch.Tensor | None,
            token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor, device: int) -> torch.Tensor:
    num_tokens, hidden = x.shape
    num_expanded = pos_to_expert.shape[0]
    size = x.element_size()
    out = x.new_empty((num_expanded, hidden))
    if num_tokens + num_expanded == 0:
        return out
    # 16-byte vectors when every row start is 16-byte aligned; element by element otherwise.
    aligned = hidden * size % 16 == 0 and x.data_ptr() % 16 == 0 and (num_tokens <= 1 or x.stride(0) * size % 16 == 0)
    carrier = _EXPAND_CARRIERS[size]
    if x_sf is None:
        x_sf = out_sf = _fused_placeholders(x.device)['no_sf']
    tensors = {'x': x.view(carrier), 'x_sf': x_sf, 'out': out.view(carrier), 'out_sf': out_sf,
               'token_topk_to_pos': token_topk_to_pos, 'pos_to_expert': pos_to_expert}
    find_kernel('moe.expand_to_fused', {'elem_bytes': size, 'aligned': aligned}, device)(device, tensors)
    return out


def _expand_inputs(op: str, x: object, token_topk_to_pos: object, pos_to_expert: object) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'{op}: x must be a torch.Tensor, got {type(x).__name__}')
    if x.dim() != 2:
        raise ValueError(f'{op}: x must have 2 dimensions, got shape {tuple(x.shape)}')
    if x.element_size() not in _EXPAND_CARRIERS:
        raise TypeError(f'{op}: x must have 1-, 2- or 4-byte elements, got {str(x.dtype).removeprefix("torch.")}')
    _checks.inner_contiguous(op, 'x', x)
    _fused_maps(op, token_topk_to_pos, pos_to_expert, x.shape[0])


def _check_expand_topk(op: str, token_topk_to_pos: torch.Tensor, device: int) -> None:
    """The kernel stages a token's positions in shared memory, room for max_topk of them."""
    max_topk = kernel_constant('moe.expand_to_fused', 'max_topk', device)
    if token_topk_to_pos.shape[1] > max_topk:
        raise ValueError(f'{op}: num_topk must be at most {max_topk}, got {token_topk_to_pos.shape[1]}')


def _check_positions(op: str, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> None:
    """TILE_KERNELS_AOT_CHECK_INDICES: every position is one of the fused buffer's (pos_to_expert's) or negative."""
    num_expanded = pos_to_expert.shape[0]
    _index_checks.below(op, 'token_topk_to_pos', token_topk_to_pos, num_expanded, what=f'the {num_expanded} fused positions of pos_to_expert')


@_plans.launch_plan
def expand_to_fused(x: torch.Tensor, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor) -> torch.Tensor:
    """Copy token rows into the fused layout: ``out[token_topk_to_pos[t, k]] = x[t]`` where the position
    is >= 0, and zero rows where ``pos_to_expert < 0``. Rows neither routed to nor marked -1 are left
    uninitialised (a layout from get_fused_mapping has none).

    Args:
        x: ``[num_tokens, hidden]`` CUDA tensor of any 1-, 2- or 4-byte dtype, contiguous in ``hidden``
            (the row stride is free).
        token_topk_to_pos: ``[num_tokens, num_topk]`` int32, contiguous, ``num_topk <= 64``; -1 skips a slot, and
            an entry of ``num_expanded_tokens`` or more fails a device-side assert.
        pos_to_expert: ``[num_expanded_tokens]`` int32, contiguous.

    Returns:
        ``[num_expanded_tokens, hidden]`` contiguous, of x's dtype; bits are copied unchanged.
    """
    if is_compiling():
        return _custom_ops.expand_to_fused(x, token_topk_to_pos, pos_to_expert)
    op = 'expand_to_fused'
    _expand_inputs(op, x, token_topk_to_pos, pos_to_expert)
    device = _checks.on_one_cuda_device(op, x=x, token_topk_to_pos=token_topk_to_pos, pos_to_expert=pos_to_expert)
    _check_expand_topk(op, token_topk_to_pos, device)
    if _index_checks.enabled:
        _check_positions(op, token_topk_to_pos, pos_to_expert)
    return _expand(x, None, None, token_topk_to_pos, pos_to_expert, device)


@_plans.launch_plan
def expand_to_fused_with_sf(
    x: tuple[torch.Tensor, torch.Tensor], num_per_channels: int, token_topk_to_pos: torch.Tensor, pos_to_expert: torch.Tensor,
    use_tma_aligned_col_major_sf: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """expand_to_fused for quantised activations: the data rows and their scale-factor rows move alike.

    Args:
        x: ``(data, sf)``: data ``[num_tokens, hidden]`` (any 1-, 2- or 4-byte dtype, contiguous); sf
            contiguous (row-major), either float32 ``[num_tokens, ceil(hidden / num_per_channels)]`` or
            packed UE8M0 int32 ``[num_tokens, ceil(ceil(hidden / num_per_channels) / 4)]``, which needs
            ``use_tma_aligned_col_major_sf``.
        num_per_channels: 32 or 128.
        token_topk_to_pos, pos_to_expert: as expand_to_fused.
        use_tma_aligned_col_major_sf: return the SF as the ``[N, hidden_sf]`` view, strides
            ``(1, align(N, 4))``, of a ``[hidden_sf, align(N, 4)]`` buffer (upstream's layout); else row-major.

    Returns:
        ``(out, out_sf)``; padding rows (``pos_to_expert < 0``) are zero in both.
    """
    if is_compiling():
        return _custom_ops.expand_to_fused_with_sf(x, num_per_channels, token_topk_to_pos, pos_to_expert, use_tma_aligned_col_major_sf)
    op = 'expand_to_fused_with_sf'
    if not isinstance(x, tuple) or len(x) != 2:
        raise TypeError(f'{op}: x must be a (data, sf) tuple, got {type(x).__name__}')
    data, sf = x
    _expand_inputs(op, data, token_topk_to_pos, pos_to_expert)
    _contiguous(op, 'x[0] (data)', data)
    _checks.tensor(op, 'x[1] (sf)', sf, ndim=2, dtypes=(torch.float32, torch.int32))
    _contiguous(op, 'x[1] (sf)', sf)
    if num_per_channels not in (32, 128):
        raise ValueError(f'{op}: num_per_channels must be 32 or 128, got {num_per_channels!r}')
    if not isinstance(use_tma_aligned_col_major_sf, bool):
        raise TypeError(f'{op}: use_tma_aligned_col_major_sf must be a bool, got {type(use_tma_aligned_col_major_sf).__name__}')
    num_tokens, hidden = data.shape
    hidden_sf = -(-hidden // num_per_channels)
    if sf.dtype == torch.int32:
        hidden_sf = -(-hidden_sf // 4)
        if not use_tma_aligned_col_major_sf:
            raise ValueError(f'{op}: packed UE8M0 (int32) scale factors need use_tma_aligned_col_major_sf=True')
    if tuple(sf.shape) != (num_tokens, hidden_sf):
        raise ValueError(f'{op}: sf must have shape {(num_tokens, hidden_sf)} for hidden {hidden} and {num_per_channels} per channel, got {tuple(sf.shape)}')
    device = _checks.on_one_cuda_device(op, data=data, sf=sf, token_topk_to_pos=token_topk_to_pos, pos_to_expert=pos_to_expert)
    _check_expand_topk(op, token_topk_to_pos, device)
    if _index_checks.enabled:
        _check_positions(op, token_topk_to_pos, pos_to_expert)
    num_expanded = pos_to_expert.shape[0]
    if use_tma_aligned_col_major_sf:
        out_sf = sf.new_empty((hidden_sf, (num_expanded + 3) // 4 * 4))[:, :num_expanded].T
    else:
        out_sf = sf.new_empty((num_expanded, hidden_sf))
    out = _expand(data, sf.view(torch.int32), out_sf.view(torch.int32), token_topk_to_pos, pos_to_expert, device)
    return out, out_sf


@_plans.launch_plan
def reduce_fused(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    topk_weights: Optional[torch.Tensor],
    token_topk_to_pos: torch.Tensor,
    fp8_format: str = '',
    sf: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Sum each token's rows of the fused layout back, weighted:

        acc = 0; for k ascending with pos = token_topk_to_pos[t, k] >= 0:
            acc = fma(x[pos], w[t, k] * x_sf[pos], acc)          (float32, one rounding each)
        out[t] = cast(acc * sf[0]) with fp8 output and sf, else cast(acc)

    (a missing weight or x_sf is 1). The e4m3 cast saturates to +-448, NaN stays NaN.

    Args:
        x: ``[num_expanded_tokens, hidden]`` float32 or bfloat16, contiguous in ``hidden`` with 16-byte
            aligned rows (hidden a multiple of 16 bytes), or ``(x, x_sf)`` with x_sf float32 ``[num_expanded_tokens]``.
        topk_weights: ``[num_tokens, num_topk]`` float32 contiguous in ``num_topk``, or None.
        token_topk_to_pos: ``[num_tokens, num_topk]`` int32, contiguous; -1 skips a slot, and an entry past the
            rows of ``x`` fails a device-side assert.
        fp8_format: ``''`` (output in x's dtype) or ``'e4m3'``.
        sf: float32 ``[1]`` output scale, only with ``fp8_format='e4m3'``.
        out: optional ``[num_tokens, hidden]`` output of that dtype, contiguous in ``hidden``, rows aligned like x's.

    Returns:
        ``out`` (allocated contiguous when not given).
    """
    if is_compiling():
        return _custom_ops.reduce_fused(x, topk_weights, token_topk_to_pos, fp8_format, sf, out)
    op = 'reduce_fused'
    x_sf = None
    if isinstance(x, tuple):
        if len(x) != 2:
            raise TypeError(f'{op}: x must be a tensor or an (x, x_sf) tuple')
        x, x_sf = x
    _checks.tensor(op, 'x', x, ndim=2, dtypes=tuple(_REDUCE_IN))
    _checks.inner_contiguous(op, 'x', x)
    num_expanded, hidden = x.shape
    _fused_maps(op, token_topk_to_pos, None, None)
    num_tokens, num_topk = token_topk_to_pos.shape
    vec = 16 // x.element_size()
    if hidden % vec:
        raise ValueError(f'{op}: hidden must be a multiple of {vec} (16-byte rows), got {hidden}')
    if x.data_ptr() % 16 or (num_expanded > 1 and x.stride(0) % vec):
        raise ValueError(f'{op}: x rows must start on 16-byte boundaries (data_ptr {x.data_ptr():#x}, row stride {x.stride(0)})')
    if x_sf is not None:
        _checks.tensor(op, 'x_sf', x_sf, ndim=1, dtypes=(torch.float32,))
        _contiguous(op, 'x_sf', x_sf)
        if x_sf.shape[0] != num_expanded:
            raise ValueError(f'{op}: x_sf must have {num_expanded} entries (one per row of x), got {x_sf.shape[0]}')
    if topk_weights is not None:
        _checks.tensor(op, 'topk_weights', topk_weights, ndim=2, dtypes=(torch.float32,))
        _checks.inner_contiguous(op, 'topk_weights', topk_weights)
        if tuple(topk_weights.shape) != (num_tokens, num_topk):
            raise ValueError(f'{op}: topk_weights must have shape {(num_tokens, num_topk)}, got {tuple(topk_weights.shape)}')
    if fp8_format == 'e4m3':
        out_dtype = torch.float8_e4m3fn
    elif fp8_format == '':
        out_dtype = x.dtype
        if sf is not None:
            raise ValueError(f"{op}: sf is only for fp8 output (fp8_format='e4m3')")
    else:
        raise ValueError(f"{op}: fp8_format must be '' or 'e4m3', got {fp8_format!r}")
    if sf is not None:
        _checks.tensor(op, 'sf', sf, ndim=1, dtypes=(torch.float32,))
        if sf.shape[0] != 1:
            raise ValueError(f'{op}: sf must have shape (1,), got {tuple(sf.shape)}')
    out_vec = 16 // x.element_size()  # elements per thread store: 16 bytes, or 8 / 4 bytes of e4m3
    out_align = out_vec * (1 if fp8_format else x.element_size())
    if out is None:
        out = x.new_empty((num_tokens, hidden), dtype=out_dtype)
    else:
        _checks.tensor(op, 'out', out, ndim=2, dtypes=(out_dtype,))
        if tuple(out.shape) != (num_tokens, hidden):
            raise ValueError(f'{op}: out must have shape {(num_tokens, hidden)}, got {tuple(out.shape)}')
        _checks.inner_contiguous(op, 'out', out)
        if out.data_ptr() % out_align or (num_tokens > 1 and out.stride(0) % out_vec):
            raise ValueError(f'{op}: out rows must start on {out_align}-byte boundaries (data_ptr {out.data_ptr():#x}, row stride {out.stride(0)})')
    tensors = {'x': x, 'token_topk_to_pos': token_topk_to_pos, 'out': out}
    device = _checks.on_one_cuda_device(op, **tensors, **{k: v for k, v in (('x_sf', x_sf), ('topk_weights', topk_weights), ('sf', sf)) if v is not None})
    if _index_checks.enabled:
        _index_checks.below(op, 'token_topk_to_pos', token_topk_to_pos, num_expanded, what=f'the {num_expanded} rows of x')
    if num_tokens == 0 or hidden == 0:
        return out
    absent = _fused_placeholders(x.device)
    tensors.update(x_sf=absent['one'] if x_sf is None else x_sf, sf=absent['one'] if sf is None else sf,
                   topk_weights=absent['one_2d'] if topk_weights is None else topk_weights)
    scalars = {'with_weights': int(topk_weights is not None), 'with_x_sf': int(x_sf is not None), 'with_sf': int(sf is not None)}
    spec = {'in_dtype': _REDUCE_IN[x.dtype], 'out_dtype': 'same' if fp8_format == '' else 'float8_e4m3fn'}
    find_kernel('moe.reduce_fused', spec, device)(device, tensors, scalars)
    return out
