import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference

from .helpers import TOKEN_COUNTS, assert_bitwise_equal, installed_specs, poison_allocator

pytestmark = pytest.mark.gpu


def run(scores, k):
    poison_allocator(((scores.shape[0], k), torch.int64))
    return tile_kernels_aot.moe.topk_gate(scores, k)


@pytest.mark.parametrize('spec', installed_specs('moe.topk_gate'))
@pytest.mark.parametrize('num_tokens', TOKEN_COUNTS)
def test_topk_gate_bitwise(spec, num_tokens):
    e, k = spec['num_experts'], spec['num_topk']
    scores = torch.randn((num_tokens, e), device='cuda')
    assert_bitwise_equal(run(scores, k), reference.stable_topk(scores, k))


@pytest.mark.parametrize('spec', installed_specs('moe.topk_gate'))
def test_topk_gate_ties_and_infinities(spec):
    e, k = spec['num_experts'], spec['num_topk']
    # Few distinct values: most rows have ties, which must resolve to the lower index.
    scores = torch.randint(0, 3, (4001, e), device='cuda').float()
    scores[::7] = float('-inf')  # all -inf rows: the answer is 0..k-1
    scores[1::7, : e // 2] = float('-inf')
    scores[2::7] = -0.0
    scores[2::7, ::3] = 0.0  # -0.0 and +0.0 compare equal
    assert_bitwise_equal(run(scores, k), reference.stable_topk(scores, k))


@pytest.mark.parametrize('spec', installed_specs('moe.topk_gate'))
def test_topk_gate_strided_rows(spec):
    e, k = spec['num_experts'], spec['num_topk']
    wide = torch.randn((4001, e + 13), device='cuda')
    scores = wide[:, 5:5 + e]
    assert_bitwise_equal(run(scores, k), reference.stable_topk(scores, k))


def test_topk_gate_rejects_bad_input():
    scores = torch.randn((16, 256), device='cuda')
    with pytest.raises(ValueError, match='num_topk'):
        tile_kernels_aot.moe.topk_gate(scores, 0)
    with pytest.raises(ValueError, match='num_topk'):
        tile_kernels_aot.moe.topk_gate(scores[:, :8], 9)
    with pytest.raises(TypeError, match='float32'):
        tile_kernels_aot.moe.topk_gate(scores.bfloat16(), 8)
    with pytest.raises(ValueError, match='last dimension'):
        tile_kernels_aot.moe.topk_gate(scores.t(), 8)
    with pytest.raises(TypeError, match='num_topk must be an int'):
        tile_kernels_aot.moe.topk_gate(scores, 8.0)
