"""torch.compile(fullgraph=True, dynamic=True) of an mHC layer step (modeling.mhc: mhc_pre -> a sublayer -> mhc_post),
forward with grad off and forward and backward with grad on, and of an Engram gate step (modeling.engram.engram_gate),
forward and backward: one graph for two token counts, results equal to eager; and of each op that writes a given
tensor, which must write it in the compiled graph too. (opcheck of every mHC and Engram op runs with the others' in
test_custom_ops.py: the cases are shared.)

Eager, mhc_post's backward leaves the residual's gradient on its storage and the pre ops add theirs into it in place;
compiled, each op returns its own and the graph sums them (modeling.mhc.ops). The residual's gradient is therefore
compared within bf16 rounding; every other result bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

from tests.fixtures.custom_ops import MHC_ENGRAM_WRITING, engram_gate_inputs, engram_gate_step, mhc_layer_inputs, mhc_layer_step
from tests.gpu.helpers import assert_bitwise_equal

pytestmark = pytest.mark.gpu

TOKEN_COUNTS = (100, 4001)


def _eager_copies(inputs: list) -> list:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]


@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
@pytest.mark.parametrize('grad', [False, True], ids=['no_grad', 'grad'])
def test_mhc_layer_step_compiles_without_graph_breaks(backend, grad):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(mhc_layer_step, fullgraph=True, dynamic=True, backend=counter)
    for num_tokens in TOKEN_COUNTS:
        inputs = mhc_layer_inputs(num_tokens, 'cuda', requires_grad=grad)
        eager_inputs = _eager_copies(inputs)
        with torch.set_grad_enabled(grad):
            expected = mhc_layer_step(*eager_inputs)
            actual = compiled(*inputs)
        assert_bitwise_equal(actual, expected)
        if grad:
            out_grad = torch.randn_like(expected)
            expected.backward(out_grad)
            actual.backward(out_grad)
            torch.testing.assert_close(inputs[0].grad.float(), eager_inputs[0].grad.float(), atol=6e-2, rtol=2e-2)
            for leaf, eager_leaf in zip(inputs[1:5], eager_inputs[1:5]):  # fn, scale, base, norm_weight
                assert_bitwise_equal(leaf.grad, eager_leaf.grad)
        if num_tokens == TOKEN_COUNTS[0]:
            frames = counter.frame_count
    assert counter.frame_count == frames  # the second token count reuses the first graph
    torch._dynamo.reset()


@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
def test_engram_gate_step_compiles_without_graph_breaks(backend):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(engram_gate_step, fullgraph=True, dynamic=True, backend=counter)
    for num_tokens in TOKEN_COUNTS:
        inputs = engram_gate_inputs(num_tokens, 'cuda', requires_grad=True)
        eager_inputs = _eager_copies(inputs)
        expected = engram_gate_step(*eager_inputs)
        actual = compiled(*inputs)
        assert_bitwise_equal(actual, expected)
        out_grad = torch.randn_like(expected)
        expected.backward(out_grad)
        actual.backward(out_grad)
        for leaf, eager_leaf in zip(inputs, eager_inputs):
            assert_bitwise_equal(leaf.grad, eager_leaf.grad)
        if num_tokens == TOKEN_COUNTS[0]:
            frames = counter.frame_count
    assert counter.frame_count == frames
    torch._dynamo.reset()


@pytest.mark.parametrize('backend', ['aot_eager', 'inductor'])
@pytest.mark.parametrize('case', MHC_ENGRAM_WRITING, ids=lambda c: c.name)
def test_ops_that_write_inputs_write_them_when_compiled(case, backend):
    torch._dynamo.reset()
    compiled = torch.compile(lambda *args: case.op(*args), fullgraph=True, dynamic=True, backend=backend)
    for num_tokens in case.tokens[:2]:
        args = pytree.tree_map_only(torch.Tensor, lambda t: t.cuda(), case.args(num_tokens))
        eager_args = pytree.tree_map_only(torch.Tensor, torch.clone, args)
        expected = case.op(*eager_args)
        actual = compiled(*args)
        for a, e in zip(pytree.tree_leaves((actual, args)), pytree.tree_leaves((expected, eager_args))):
            if isinstance(a, torch.Tensor):
                assert_bitwise_equal(a, e)
            else:
                assert a == e
    torch._dynamo.reset()
