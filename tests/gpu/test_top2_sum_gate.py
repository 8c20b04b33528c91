"""top2_sum_gate against the reference: indices and unmapped indices bit for bit (in rank order, which is
stricter than upstream's per-row sort), weights to float rounding, on inputs whose candidate scores are
far enough apart that the ranking does not depend on how exp rounds."""

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu

SCORING = tile_kernels_aot.moe.SCORING_FUNCS
NUM_EXTRA = 32  # replicas beyond one per logical expert, as upstream's test
GROUP_GAP, EXPERT_GAP = 1e-6, 2e-6  # upstream's margins


def _ranking(logits, bias, scoring):
    scores = {'sigmoid': torch.sigmoid, 'softmax': lambda x: x, 'sqrtsoftplus': lambda x: torch.nn.functional.softplus(x).sqrt()}[scoring](logits)
    return scores + bias


def _ambiguous_rows(logits, bias, spec, scoring):
    """Rows where a kept group or a top-k expert is within the margins of the next candidate."""
    e, k, g, tg = spec['num_experts'], spec['num_topk'], spec['num_groups'], spec['num_topk_groups']
    ranking = _ranking(logits, bias, scoring)
    bad = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    if g:
        sums = ranking.view(-1, g, e // g).topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
        bad |= sums[:, tg - 1] - sums[:, tg] <= GROUP_GAP
        kept = reference.topk_sum_and_topk_group_idx(ranking.view(-1, g, e // g), 2, tg)
        keep = torch.zeros_like(sums, dtype=torch.bool).scatter_(1, kept, True)
        ranking = ranking.masked_fill(~keep.repeat_interleave(e // g, dim=1), float('-inf'))
    top = ranking.topk(k + 1, dim=-1).values  # the (k+1)-th counts too: it must not tie the k-th
    return bad | ((top[:, :-1] - top[:, 1:]) <= EXPERT_GAP).any(dim=1)


def gate_inputs(num_rows, spec, scoring):
    """Normal logits and bias, with every ambiguous row drawn again (upstream redraws the whole batch)."""
    e = spec['num_experts']
    bias = torch.randn(e, device='cuda')
    logits = torch.randn(num_rows, e, device='cuda')
    for _ in range(100):
        bad = _ambiguous_rows(logits, bias, spec, scoring)
        if not bad.any():
            return logits, bias
        logits[bad] = torch.randn(int(bad.sum()), e, device='cuda')
    raise AssertionError('could not draw unambiguous logits')


def shared_count(spec):
    k, e = spec['num_topk'], spec['num_experts']
    return next((s for s in (2, 1) if k % s == 0 and e % (k // s) == 0 and k + s <= 32), 0)


def call_both(args, make_kwargs):
    kwargs, kwargs_ref = make_kwargs(), make_kwargs()
    poison_allocator(((args[0].shape[0], args[2] + (args[6] if args[5] else 0)), torch.int64))
    out = tile_kernels_aot.moe.top2_sum_gate(*args, **kwargs)
    expected = reference.top2_sum_gate(*args, **kwargs_ref)
    return out, expected, kwargs, kwargs_ref


def check_same(out, expected, kwargs, kwargs_ref):
    assert_bitwise_equal(out[0], expected[0])
    assert out[1].shape == expected[1].shape
    torch.testing.assert_close(out[1], expected[1], rtol=1e-5, atol=1e-8)
    if kwargs.get('unmapped_topk_idx') is not None:
        assert_bitwise_equal(kwargs['unmapped_topk_idx'], kwargs_ref['unmapped_topk_idx'])


@pytest.mark.parametrize('scoring', SCORING)
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
@pytest.mark.parametrize('spec', installed_specs('moe.top2_sum_gate'))
def test_plain_routing(spec, num_tokens, scoring):
    """No optional tensors, one rank: the routing itself."""
    logits, bias = gate_inputs(num_tokens, spec, scoring)
    args = (logits, bias, spec['num_topk'], spec['num_topk_groups'], spec['num_groups'], False, 0, 2.5, 0, 1, 0, 1, scoring)
    check_same(*call_both(args, dict))


@pytest.mark.parametrize('scoring', SCORING)
@pytest.mark.parametrize('num_tokens', (1, 63, 4001))
@pytest.mark.parametrize('spec', installed_specs('moe.top2_sum_gate'))
def test_everything_upstream_has(spec, num_tokens, scoring):
    """Padded (masked) rows, fixed routing on some rows, shared experts through a random replica map,
    EP 4 x TP 2 masking from both TP ranks, and a strided unmapped_topk_idx."""
    e, k = spec['num_experts'], spec['num_topk']
    num_rows = num_tokens + 10
    logits, bias = gate_inputs(num_rows, spec, scoring)
    num_shared = shared_count(spec)
    num_logical = e + num_shared
    generator = torch.Generator(device='cuda').manual_seed(num_rows)
    physical_map = torch.randint(0, e + NUM_EXTRA, (num_logical, NUM_EXTRA + 1), device='cuda', dtype=torch.int32, generator=generator)
    counts = torch.randint(1, NUM_EXTRA + 2, (num_logical,), device='cuda', dtype=torch.int32, generator=generator)
    fixed = torch.rand(num_rows, device='cuda', generator=generator) < 0.3
    fixed_idx = torch.randint(0, e, (num_rows, k), device='cuda', generator=generator)
    routed = torch.ones(num_rows, dtype=torch.bool, device='cuda')
    routed[-10:] = False

    for use_map in (False, True):
        for tp_rank in (0, 1):
            def make_kwargs():
                unmapped = torch.full((num_rows, k + 3), 7, dtype=torch.int64, device='cuda')[:, 1:k + 1]
                unmapped.copy_(fixed_idx)
                kwargs = dict(mask=routed, fix_routing_mask=fixed, unmapped_topk_idx=unmapped)
                if use_map:
                    kwargs.update(to_physical_map=physical_map, logical_count=counts)
                return kwargs
            shared = use_map and num_shared > 0
            args = (logits, bias, k, spec['num_topk_groups'], spec['num_groups'], shared, num_shared, 1.5, 1, 4, tp_rank, 2, scoring)
            check_same(*call_both(args, make_kwargs))


@pytest.mark.parametrize('spec', installed_specs('moe.top2_sum_gate'))
def test_equal_scores_keep_expert_order(spec):
    """All-zero logits and bias: every score ties, so the lowest groups and within them the lowest ids
    win, in order (upstream's stability check), and the weights are equal."""
    e, k = spec['num_experts'], spec['num_topk']
    logits, bias = torch.zeros(70, e, device='cuda'), torch.zeros(e, device='cuda')
    idx, weights = tile_kernels_aot.moe.top2_sum_gate(logits, bias, k, spec['num_topk_groups'], spec['num_groups'], False, 0, 1.0, 0, 1, 0, 1, 'sigmoid')
    assert_bitwise_equal(idx, torch.arange(k, device='cuda').expand(70, k).contiguous())
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / k))


def test_bad_input_is_rejected_before_launch():
    gate = tile_kernels_aot.moe.top2_sum_gate
    logits, bias = torch.randn(8, 256, device='cuda'), torch.randn(256, device='cuda')
    base = (logits, bias, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, 'sigmoid')

    def call(*changes, **kwargs):
        args = list(base)
        for i, v in changes:
            args[i] = v
        return gate(*args, **kwargs)

    with pytest.raises(ValueError, match='scoring_func'):
        call((12, 'identity'))
    with pytest.raises(TypeError, match='logits must be float32'):
        call((0, logits.half()))
    with pytest.raises(ValueError, match='contiguous'):
        call((0, torch.randn(256, 8, device='cuda').t()))
    with pytest.raises(ValueError, match='bias'):
        call((1, bias[:128]))
    with pytest.raises(ValueError, match='num_topk must be in'):
        call((2, 33))
    with pytest.raises(ValueError, match='both be 0'):
        call((3, 0))
    with pytest.raises(ValueError, match='num_groups must divide'):
        call((4, 7))
    with pytest.raises(ValueError, match='tp_rank must be in'):
        call((10, 2))
    with pytest.raises(ValueError, match='extra replicas'):
        call((5, True), (6, 2))
    with pytest.raises(ValueError, match='fix_routing_mask needs unmapped_topk_idx'):
        call(fix_routing_mask=torch.ones(8, dtype=torch.bool, device='cuda'))
    with pytest.raises(ValueError, match='given together'):
        call(logical_count=torch.ones(256, dtype=torch.int32, device='cuda'))
    with pytest.raises(ValueError, match='mask must have shape'):
        call(mask=torch.ones(9, dtype=torch.bool, device='cuda'))
    with pytest.raises(ValueError, match='must be on a CUDA device'):
        call((1, bias.cpu()))
