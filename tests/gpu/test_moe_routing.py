"""The MoE routing helpers against their references, bit for bit, and independent of the SM count."""

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import config, reference

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, calc_diff, installed_specs, poison_allocator, sm_counts

pytestmark = pytest.mark.gpu

# (top-k, experts per rank, EP ranks) as upstream's generate_moe_params, plus whole models on one rank.
ROUTING = [(k, e // ep, ep) for k in (2, 6, 8, 9) for e in (72, 256) for ep in (8, 64) if e % ep == 0] + [(8, 256, 1), (8, 384, 1), (4, 128, 1)]


def routing_indices(num_tokens: int, num_topk: int, num_experts: int, num_ep_ranks: int) -> torch.Tensor:
    """Top-k over all ranks' experts, with other ranks' experts as -1 and rows without a local one dropped."""
    scores = torch.rand(num_tokens * num_ep_ranks, num_experts * num_ep_ranks, device='cuda')
    idx = scores.topk(num_topk, dim=-1).indices
    idx[idx >= num_experts] = -1
    return idx[(idx >= 0).any(dim=1)][:num_tokens].contiguous()


@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('num_topk, num_experts, num_ep_ranks', ROUTING)
def test_group_count_and_aux_fi(num_tokens, num_topk, num_experts, num_ep_ranks, restore_num_sms):
    idx = routing_indices(num_tokens, num_topk, num_experts, num_ep_ranks)
    expected = reference.group_count(idx, num_experts)
    for num_aux_topk in (1, num_topk):
        fi_expected = reference.aux_fi(idx, num_experts, num_aux_topk)
        for sms in sm_counts():
            config.set_num_sms(sms)
            assert_bitwise_equal(tile_kernels_aot.moe.group_count(idx, num_experts), expected)
            fi = tile_kernels_aot.moe.aux_fi(idx, num_experts, num_aux_topk)
            assert_bitwise_equal(fi, fi_expected)
        if idx.shape[0]:
            # Upstream's formula (a float product, then the division) agrees to float rounding.
            upstream = expected.float() * num_experts / (idx.shape[0] * num_aux_topk)
            assert calc_diff(fi, upstream) < 2e-7


def test_counting_handles_int32_and_strided_indices():
    idx = routing_indices(4001, 8, 32, 8)
    wide = torch.full((idx.shape[0], 11), -1, dtype=torch.int32, device='cuda')
    wide[:, 2:10] = idx
    strided = wide[:, 2:10]
    assert_bitwise_equal(tile_kernels_aot.moe.group_count(strided, 32), reference.group_count(idx, 32))
    assert_bitwise_equal(tile_kernels_aot.moe.aux_fi(strided, 32, 8), reference.aux_fi(idx, 32, 8))


@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('num_topk', (1, 2, 6, 8, 9, 16, 20))  # 20: past the unrolled 16
def test_normalize_weight(num_tokens, num_topk):
    weights = torch.rand(num_tokens, num_topk + 3, device='cuda')[:, :num_topk]  # strided rows
    weights[::5] = 0  # all-zero rows stay finite thanks to the 1e-20
    poison_allocator(((num_tokens,), torch.float32), ((num_tokens, num_topk), torch.float32))
    denominator, normalized = tile_kernels_aot.moe.normalize_weight(weights)
    expected_denominator, expected = reference.normalize_weight(weights)
    assert_bitwise_equal(denominator, expected_denominator)
    assert_bitwise_equal(normalized, expected.contiguous())


@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('num_groups, num_topk', [(8, 4), (8, 8), (64, 9), (72, 8), (128, 16), (256, 8), (1024, 32)])
def test_inplace_unique_group_indices(num_tokens, num_groups, num_topk):
    # Few distinct values per row: plenty of repeats, and some -1 padding.
    idx = torch.randint(-1, min(num_groups, 2 * num_topk), (num_tokens, num_topk), device='cuda')
    idx += (idx >= 0) * torch.randint(0, max(num_groups - 2 * num_topk, 1), (num_tokens, 1), device='cuda')
    expected = idx.clone()
    reference.inplace_unique_group_indices(expected, num_groups)
    assert tile_kernels_aot.moe.inplace_unique_group_indices(idx, num_groups) is None
    assert_bitwise_equal(idx, expected)


@pytest.mark.parametrize('dtype', (torch.int64, torch.int32))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('n, num_ep_ranks, num_tp_ranks', [(256, 8, 2), (288, 72, 4), (256, 64, 1), (384, 8, 8), (64, 1, 2)])
def test_mask_indices_by_tp(dtype, num_tokens, n, num_ep_ranks, num_tp_ranks):
    indices = torch.randint(-1, n, (num_tokens, 8), device='cuda', dtype=dtype)
    for tp_rank in range(num_tp_ranks):
        poison_allocator(((num_tokens, 8), dtype))
        out = tile_kernels_aot.moe.mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)
        assert_bitwise_equal(out, reference.mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks))


@pytest.mark.parametrize('spec', installed_specs('moe.topk_sum_and_topk_group_idx'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_topk_sum_and_topk_group_idx(spec, num_tokens):
    g, per_group, topk_sum, topk_groups = spec['num_groups'], spec['experts_per_group'], spec['num_topk_sum'], spec['num_topk_groups']
    wide = torch.randn(num_tokens, g * per_group + 5, device='cuda')
    scores = wide[:, :g * per_group].view(num_tokens, g, per_group) if num_tokens else torch.randn(0, g, per_group, device='cuda')
    if num_tokens:
        scores[::3, g // 2] = scores[::3, 0]  # equal groups: the lower index must win
    poison_allocator(((num_tokens, topk_groups), torch.int64))
    out = tile_kernels_aot.moe.topk_sum_and_topk_group_idx(scores, topk_sum, topk_groups)
    assert_bitwise_equal(out, reference.topk_sum_and_topk_group_idx(scores, topk_sum, topk_groups))


def test_routing_helpers_reject_bad_input():
    idx = torch.zeros(4, 8, dtype=torch.int64, device='cuda')
    with pytest.raises(ValueError, match='num_groups must be in \\[1, 1024\\]'):
        tile_kernels_aot.moe.group_count(idx, 2000)
    with pytest.raises(TypeError, match='int64 or int32'):
        tile_kernels_aot.moe.aux_fi(idx.float(), 8, 8)
    with pytest.raises(ValueError, match='tp_rank must be in \\[0, 1\\]'):
        tile_kernels_aot.moe.mask_indices_by_tp(idx, 256, 8, 2, 2)
    with pytest.raises(ValueError, match='num_topk_groups must be in \\[1, 8\\]'):
        tile_kernels_aot.moe.topk_sum_and_topk_group_idx(torch.randn(4, 8, 32, device='cuda'), 2, 9)
    with pytest.raises(ValueError, match='num_topk_sum'):
        tile_kernels_aot.moe.topk_sum_and_topk_group_idx(torch.randn(4, 8, 32, device='cuda'), 3, 4)
    with pytest.raises(TypeError, match='float32'):
        tile_kernels_aot.moe.normalize_weight(torch.ones(4, 8, device='cuda', dtype=torch.float64))
