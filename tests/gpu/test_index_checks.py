"""TILE_KERNELS_AOT_CHECK_INDICES: every op that reads an index tensor refuses a bad one with a ValueError naming
the op, the argument and the first bad position, before the launch; good indices give what they give unchecked."""

from __future__ import annotations

import re

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import _index_checks

from .helpers import assert_bitwise_equal

pytestmark = pytest.mark.gpu

moe, quant = tile_kernels_aot.moe, tile_kernels_aot.quant
E, K, T = 256, 8, 64  # experts, top-k, tokens
BAD_VALUES = [E, E + 1, 2**31 - 1]  # just past the end, and far past it
HUGE_INT64 = [2**32 + 1]  # 1 if a kernel wrapped it to int32


@pytest.fixture
def checking():
    before = _index_checks.enabled
    _index_checks.enable(True)
    yield
    _index_checks.enable(before)


def routing(dtype=torch.int64) -> torch.Tensor:
    idx = torch.rand(T, E, device='cuda').topk(K, dim=-1).indices.to(dtype)
    idx[::5, -1] = -1  # padding
    return idx.contiguous()


def spoiled(t: torch.Tensor, position: tuple[int, ...], value: int) -> torch.Tensor:
    bad = t.clone()
    bad[position] = value
    return bad


def refused(op: str, name: str, position: tuple[int, ...], value: int):
    where = ', '.join(map(str, position))
    return pytest.raises(ValueError, match=rf'^{op}: {name}\[{where}\] = {re.escape(str(value))} breaks the rule that ')


def same_unchecked(call):
    """`call()` with the checks on and off gives the same tensors (the checks read, never write)."""
    checked = call()
    _index_checks.enable(False)
    try:
        unchecked = call()
    finally:
        _index_checks.enable(True)
    for a, b in zip(checked if isinstance(checked, tuple) else (checked,), unchecked if isinstance(unchecked, tuple) else (unchecked,)):
        if isinstance(a, torch.Tensor):
            assert_bitwise_equal(a, b)


@pytest.mark.parametrize('dtype', [torch.int64, torch.int32])
@pytest.mark.parametrize('value', BAD_VALUES + HUGE_INT64)
def test_counting_ops(checking, dtype, value):
    if dtype == torch.int32 and value in HUGE_INT64:
        pytest.skip('an int64 value')
    idx = routing(dtype)
    same_unchecked(lambda: moe.group_count(idx, E))
    same_unchecked(lambda: moe.aux_fi(idx, E, K))
    bad = spoiled(idx, (3, 1), value)
    with refused('group_count', 'group_idx', (3, 1), value):
        moe.group_count(bad, E)
    with refused('aux_fi', 'topk_idx', (3, 1), value):
        moe.aux_fi(bad, E, K)
    with refused('inplace_unique_group_indices', 'group_indices', (3, 1), value):
        moe.inplace_unique_group_indices(bad, E)
    with refused('get_fused_mapping', 'topk_idx', (3, 1), value):
        moe.get_fused_mapping(bad, E, 0, 1)
    if value >= E:
        with refused('mask_indices_by_tp', 'indices', (3, 1), value):
            moe.mask_indices_by_tp(bad, E, 8, 0, 2)
    else:  # mask_indices_by_tp computes in the index's own type: any negative entry is padding
        moe.mask_indices_by_tp(bad, E, 8, 0, 2)


def test_int64_negatives_of_any_size_are_padding(checking):
    """The kernels narrow an int64 index without wrapping: -2**40 is padding, as -1 is."""
    idx = routing()
    padded = spoiled(idx, (3, 1), -1)
    far = spoiled(idx, (3, 1), -2**40)
    assert_bitwise_equal(moe.group_count(far, E), moe.group_count(padded, E))
    assert_bitwise_equal(moe.aux_fi(far, E, K), moe.aux_fi(padded, E, K))
    for a, b in zip(moe.get_fused_mapping(far, E, 0, 16)[:4], moe.get_fused_mapping(padded, E, 0, 16)[:4]):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize('value', [float('nan'), float('inf'), -float('inf')])
def test_gating_ops_refuse_scores_that_make_a_ranking_nan(checking, value):
    scores = torch.randn(T, E, device='cuda')
    same_unchecked(lambda: moe.topk_gate(scores, K))
    if value != value:  # NaN
        with refused('topk_gate', 'scores', (4, 7), value):
            moe.topk_gate(spoiled(scores, (4, 7), value), K)
    else:  # topk_gate ranks infinities as numbers
        same_unchecked(lambda: moe.topk_gate(spoiled(scores, (4, 7), value), K))
    grouped = scores.view(T, 8, E // 8)
    same_unchecked(lambda: moe.topk_sum_and_topk_group_idx(grouped, 2, 4))
    with refused('topk_sum_and_topk_group_idx', 'scores', (4, 1, 3), value):
        moe.topk_sum_and_topk_group_idx(spoiled(grouped, (4, 1, 3), value), 2, 4)


def test_inplace_unique_and_mask_by_tp_accept_good_indices(checking):
    idx = routing()
    expected = idx.clone()
    moe.inplace_unique_group_indices(expected, E)
    _index_checks.enable(False)
    moe.inplace_unique_group_indices(idx, E)
    _index_checks.enable(True)
    assert_bitwise_equal(idx, expected)
    same_unchecked(lambda: moe.mask_indices_by_tp(idx, E, 8, 0, 2))


def test_get_fused_mapping_with_a_buffer_too_small(checking):
    idx = routing()
    same_unchecked(lambda: moe.get_fused_mapping(idx, E, 0, 16, True))
    used = sum(moe.get_fused_mapping(idx, E, 0, 16)[-1])
    moe.get_fused_mapping(idx, E, used, 16)
    with pytest.raises(ValueError, match=rf'get_fused_mapping: num_expanded_tokens = {used - 1} is too small for this routing'):
        moe.get_fused_mapping(idx, E, used - 1, 16)


def fused_layout(alignment: int = 16):
    pos_to_expert, _, pos_to_token_topk, token_topk_to_pos, *_ = moe.get_fused_mapping(routing(), E, 0, alignment)
    return pos_to_expert, pos_to_token_topk, token_topk_to_pos


@pytest.mark.parametrize('offset', [0, 1, 2**31 - 1])
def test_fused_layout_ops(checking, offset):
    pos_to_expert, _, t2p = fused_layout()
    n = pos_to_expert.shape[0]
    bad_value = min(n + offset, 2**31 - 1)
    bad = spoiled(t2p, (2, 1), bad_value)
    x = torch.randn(T, 7168, device='cuda', dtype=torch.bfloat16)
    sf = torch.rand(T, 7168 // 128, device='cuda')
    same_unchecked(lambda: moe.expand_to_fused(x, t2p, pos_to_expert))
    same_unchecked(lambda: moe.expand_to_fused_with_sf((x, sf), 128, t2p, pos_to_expert))
    with refused('expand_to_fused', 'token_topk_to_pos', (2, 1), bad_value):
        moe.expand_to_fused(x, bad, pos_to_expert)
    with refused('expand_to_fused_with_sf', 'token_topk_to_pos', (2, 1), bad_value):
        moe.expand_to_fused_with_sf((x, sf), 128, bad, pos_to_expert)
    fused = moe.expand_to_fused(x, t2p, pos_to_expert)
    weights = torch.rand(T, K, device='cuda')
    same_unchecked(lambda: moe.reduce_fused(fused, weights, t2p))
    with refused('reduce_fused', 'token_topk_to_pos', (2, 1), bad_value):
        moe.reduce_fused(fused, weights, bad)


def test_swiglu_forward_pos_to_token_topk(checking):
    pos_to_expert, pos_to_token_topk, _ = fused_layout()
    n = pos_to_expert.shape[0]
    x = torch.randn(n, 2 * 2048, device='cuda', dtype=torch.bfloat16)
    weights = torch.rand(T, K, device='cuda')
    written = pos_to_expert >= 0  # rows of pos_to_expert < 0 are not written (torch.empty's bytes stay)

    def rows_written():
        out, sf = quant.swiglu_forward_and_per_token_cast(x, 'e4m3', 128, pos_to_token_topk, weights, pos_to_expert)
        return out[written], sf[written]
    same_unchecked(rows_written)
    first_valid = int((pos_to_token_topk >= 0).int().argmax())
    for value in (T * K, 2**31 - 1):
        with refused('swiglu_forward_and_per_token_cast', 'pos_to_token_topk', (first_valid,), value):
            quant.swiglu_forward_and_per_token_cast(x, 'e4m3', 128, spoiled(pos_to_token_topk, (first_valid,), value), weights, pos_to_expert)


def test_swiglu_backward_pos_to_token_topk(checking):
    from tile_kernels_aot import reference

    pos_to_expert, pos_to_token_topk, t2p = fused_layout(alignment=128)  # as tests/gpu/test_swiglu.py's backward cases
    n, hidden = pos_to_expert.shape[0], 2048
    x = reference.cast(torch.randn(n, 2 * hidden, device='cuda', dtype=torch.bfloat16), 'e4m3', (1, 128))
    grad_out = torch.randn(n, hidden, device='cuda', dtype=torch.bfloat16)
    weights = torch.rand(T, K, device='cuda')
    same_unchecked(lambda: quant.swiglu_backward_and_per_token_cast(x, grad_out, weights, pos_to_token_topk, t2p, 128))
    first_valid = int((pos_to_token_topk >= 0).int().argmax())
    for value in (T * K, 2**31 - 1):
        with refused('swiglu_backward_and_per_token_cast', 'pos_to_token_topk', (first_valid,), value):
            quant.swiglu_backward_and_per_token_cast(x, grad_out, weights, spoiled(pos_to_token_topk, (first_valid,), value), t2p, 128)


def test_per_channel_cast_fused_pos_to_token(checking):
    x = torch.randn(T, 7168, device='cuda', dtype=torch.bfloat16)
    pos = torch.randint(-1, T, (256,), device='cuda', dtype=torch.int32)
    same_unchecked(lambda: quant.per_channel_cast_fused(x, 'e4m3', 128, pos_to_token=pos))
    for value in (T, 2**31 - 1):
        with refused('per_channel_cast_fused', 'pos_to_token', (17,), value):
            quant.per_channel_cast_fused(x, 'e4m3', 128, pos_to_token=spoiled(pos, (17,), value))


def test_top2_sum_gate_index_inputs(checking):
    from tile_kernels_aot._select import prebuilt_specs

    spec = prebuilt_specs('moe.top2_sum_gate', 0)[0]
    e, k = spec['num_experts'], spec['num_topk']
    logits = torch.randn(T, e, device='cuda')
    bias = torch.zeros(e, device='cuda')
    args = (logits, bias, k, spec['num_topk_groups'], spec['num_groups'], False, 0, 1.0, 0, 1, 0, 1, 'sigmoid')
    fixed = torch.zeros(T, dtype=torch.bool, device='cuda')
    fixed[5] = True
    unmapped = torch.randint(0, e, (T, k), device='cuda')
    routed = torch.ones(T, dtype=torch.bool, device='cuda')
    same_unchecked(lambda: moe.top2_sum_gate(*args, fix_routing_mask=fixed, unmapped_topk_idx=unmapped.clone()))
    for value in (e, -1, 2**40):
        bad = spoiled(unmapped, (5, 2), value)
        with refused('top2_sum_gate', 'unmapped_topk_idx', (5, 2), value):
            moe.top2_sum_gate(*args, fix_routing_mask=fixed, unmapped_topk_idx=bad)
        moe.top2_sum_gate(*args, fix_routing_mask=fixed, unmapped_topk_idx=spoiled(unmapped, (6, 2), value))  # row 6 is not fixed
        routed[5] = False  # a masked-out row reads nothing
        moe.top2_sum_gate(*args, mask=routed, fix_routing_mask=fixed, unmapped_topk_idx=bad)
        routed[5] = True
    extra = 2
    physical_map = torch.randint(0, e, (e, extra + 1), device='cuda', dtype=torch.int32)
    counts = torch.randint(1, extra + 2, (e,), device='cuda', dtype=torch.int32)
    same_unchecked(lambda: moe.top2_sum_gate(*args, to_physical_map=physical_map, logical_count=counts))
    for value in (0, extra + 2, -5):
        with refused('top2_sum_gate', 'logical_count', (9,), value):
            moe.top2_sum_gate(*args, to_physical_map=physical_map, logical_count=spoiled(counts, (9,), value))
    for value in (float('nan'), float('inf')):
        with refused('top2_sum_gate', 'logits', (3, 4), value):
            moe.top2_sum_gate(spoiled(logits, (3, 4), value), *args[1:])
        routed[3] = False  # a masked-out row is not scored
        moe.top2_sum_gate(spoiled(logits, (3, 4), value), *args[1:], mask=routed)
        routed[3] = True
        with refused('top2_sum_gate', 'bias', (4,), value):
            moe.top2_sum_gate(logits, spoiled(bias, (4,), value), *args[2:])


def test_engram_hash_vocab_sizes(checking):
    from tile_kernels_aot import engram
    from tile_kernels_aot._select import prebuilt_specs

    spec = prebuilt_specs('engram.engram_hash', 0)[0]
    n, m = spec['max_ngram_size'], spec['tables_per_ngram']
    ids = torch.randint(0, 2**20, (T, n), device='cuda', dtype=torch.int32)
    multipliers = torch.randint(1, 2**40, (2, n), device='cuda', dtype=torch.int64)
    vocab = torch.randint(1000, 5000, (2, n - 1, m), device='cuda', dtype=torch.int32)
    offsets = torch.zeros(2, (n - 1) * m, device='cuda', dtype=torch.int32)
    same_unchecked(lambda: engram.engram_hash(ids, multipliers, vocab, offsets))
    for value in (0, -3):
        with refused('engram_hash', 'vocab_sizes', (1, 0, 0), value):
            engram.engram_hash(ids, multipliers, spoiled(vocab, (1, 0, 0), value), offsets)


def test_with_the_checks_off_the_helpers_are_not_called(monkeypatch):
    monkeypatch.setattr(_index_checks, 'enabled', False)
    monkeypatch.setattr(_index_checks, 'below', lambda *a, **k: pytest.fail('checked with the checks off'))
    monkeypatch.setattr(_index_checks, 'within', lambda *a, **k: pytest.fail('checked with the checks off'))
    idx = routing()
    moe.group_count(idx, E)
    pos_to_expert, _, t2p = fused_layout()
    moe.expand_to_fused(torch.randn(T, 7168, device='cuda', dtype=torch.bfloat16), t2p, pos_to_expert)
