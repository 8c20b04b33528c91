"""torch.compile(fullgraph=True, dynamic=True) of the MoE routing block (top2_sum_gate -> get_fused_mapping ->
expand_to_fused -> per_token_cast -> reduce_fused): one graph for two token counts, results bit for bit the eager ones."""

from __future__ import annotations

import pytest
import torch

from tests.fixtures.custom_ops import routing_block, routing_inputs
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
