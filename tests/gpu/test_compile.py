"""torch.compile(fullgraph=True, dynamic=True) of the MoE routing block (top2_sum_gate -> get_fused_mapping ->
expand_to_fused -> per_token_cast -> reduce_fused): one graph for two token counts, results bit for bit the eager ones;
and of the ops that write their inputs, which must write them in the compiled graph too."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.custom_ops import mapping, routing_block, routing_inputs, writes_inputs
from tests.gpu.helpers import assert_bitwise_equal

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
def test_routing_block_compiles_without_graph_breaks(backend):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(routing_block, fullgraph=True, dynamic=True, backend=counter)
    for num_tokens in (100, 4001):
        inputs = routing_inputs(num_tokens, 'cuda')
        expected = routing_block(*inputs)
        actual = compiled(*inputs)
        for a, e in zip(actual, expected):
            assert_bitwise_equal(a, e)
    assert counter.frame_count == 1  # the second token count reuses the first graph
    torch._dynamo.reset()


@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
def test_ops_that_write_inputs_write_them_when_compiled(backend):
    torch._dynamo.reset()
    compiled = torch.compile(writes_inputs, fullgraph=True, dynamic=True, backend=backend)
    for num_tokens in (100, 300):
        maps = [m.cuda() for m in mapping(num_tokens)[:4]]
        num_expanded = maps[0].shape[0]
        args = (torch.randint(-1, 16, (num_tokens, 8), device='cuda'), torch.randn(num_expanded, 128, device='cuda').bfloat16(),
                torch.rand(num_tokens, 4, device='cuda'), maps[3], torch.empty(num_tokens, 128, dtype=torch.bfloat16, device='cuda'),
                torch.randn(num_tokens, 64, device='cuda'), torch.randn(64, device='cuda'),
                torch.empty(num_tokens, 6, dtype=torch.int64, device='cuda'), torch.randn(num_expanded, 512, device='cuda').bfloat16() * 4,
                torch.zeros(3, dtype=torch.int64, device='cuda'))
        eager_args = [a.clone() for a in args]
        expected = writes_inputs(*eager_args)
        actual = compiled(*args)
        for a, e in zip((*actual, *args), (*expected, *eager_args)):
            assert_bitwise_equal(a, e)
    torch._dynamo.reset()
