"""torch.compile of the mHC and Engram ops without a GPU: an mHC layer step (modeling.mhc's mhc_pre -> a sublayer ->
mhc_post) traces into one graph of custom ops for two token counts, with grad off (the fused pre step) and on (forward
and backward graphs, the backward run on meta tensors), and so does the Engram gate's autograd op. The fakes'
layouts against the references are checked with the other ops' in test_custom_ops.py (the cases are shared)."""

from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.utils import _pytree as pytree

from tests.fixtures.custom_ops import (
    ENGRAM_HIDDEN, MHC, MHC_ENGRAM_CASES, MHC_ENGRAM_WRITING, MHC_HIDDEN, OpCalls, engram_gate_inputs, engram_gate_step, mhc_layer_inputs,
    mhc_layer_step,
)
from tile_kernels_aot import _custom_ops, mhc
from tile_kernels_aot.modeling.mhc.ops import STASH

MHC_FORWARD = {'mhc_fn_normw_merge_fwd', 'mhc_pre_norm_fn_fwd', 'mhc_pre_split_mixes_fwd', 'mhc_sinkhorn_fwd', 'mhc_pre_apply_mix_fwd',
               'mhc_post_fwd'}
MHC_BACKWARD = {'mhc_post_bwd', 'mhc_pre_apply_mix_bwd', 'mhc_sinkhorn_bwd', 'mhc_pre_split_mixes_bwd', 'mhc_pre_norm_fn_bwd',
                'mhc_fn_normw_merge_bwd'}


class Graphs:
    """An AOTAutograd backend that keeps the forward and backward graphs it is given and runs them as they are."""

    def __init__(self):
        self.forward, self.backward = [], []
        self.backend = aot_autograd(fw_compiler=self._keep(self.forward), bw_compiler=self._keep(self.backward))

    @staticmethod
    def _keep(graphs: list):
        def compiler(gm, example_inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)
        return compiler


def custom_ops(gm) -> set[str]:
    """The tile_kernels_aot ops a graph calls, directly or through auto_functionalized (the ops that write inputs)."""
    names = set()
    for node in gm.graph.nodes:
        if node.op != 'call_function':
            continue
        target = node.target
        if isinstance(target, torch._ops.HigherOrderOperator) and target.name().startswith('auto_functionalized'):
            target = node.args[0]
        if isinstance(target, torch._ops.OpOverload) and target.namespace == _custom_ops.NAMESPACE:
            names.add(target._schema.name.split('::')[1])
    return names


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_mhc_layer_step_without_grad_is_one_graph_on_meta(fresh_dynamo):
    graphs = Graphs()
    compiled = torch.compile(mhc_layer_step, fullgraph=True, dynamic=True, backend=graphs.backend)
    with torch.no_grad():
        for num_tokens in (100, 300):
            x, *rest = mhc_layer_inputs(num_tokens, 'meta')
            out = compiled(x, *rest)
            assert _layout(out) == _layout(x)
            if num_tokens == 100:
                num_graphs = len(graphs.forward)
    assert len(graphs.forward) == num_graphs  # the second token count reuses the graph of the first
    assert custom_ops(graphs.forward[-1]) == {'mhc_pre_big_fuse', 'mhc_post_fwd'}


def test_mhc_layer_step_with_grad_is_one_graph_forward_and_backward_on_meta(fresh_dynamo):
    graphs = Graphs()
    compiled = torch.compile(mhc_layer_step, fullgraph=True, dynamic=True, backend=graphs.backend)
    for num_tokens in (100, 300):
        inputs = mhc_layer_inputs(num_tokens, 'meta', requires_grad=True)
        out = compiled(*inputs)
        assert _layout(out) == _layout(inputs[0])
        out.float().square().mean().backward()
        for leaf in inputs[:5]:
            assert leaf.grad is not None and _layout(leaf.grad) == _layout(leaf)
        # The compiled backward sums the residual's gradients itself: nothing is left on the residual's storage.
        assert not hasattr(inputs[0].untyped_storage(), STASH)
        if num_tokens == 100:
            num_graphs = len(graphs.forward), len(graphs.backward)
    assert (len(graphs.forward), len(graphs.backward)) == num_graphs
    assert custom_ops(graphs.forward[-1]) == MHC_FORWARD
    assert custom_ops(graphs.backward[-1]) == MHC_BACKWARD


def test_engram_gate_step_is_one_graph_forward_and_backward(fresh_dynamo):
    """The backward graph is traced with the forward (on fake tensors) but not run here: engram_gate_bwd's weight-gradient
    partial count is an unbacked size, which meta tensors cannot hold."""
    graphs = Graphs()
    compiled = torch.compile(engram_gate_step, fullgraph=True, dynamic=True, backend=graphs.backend)
    for num_tokens in (100, 300):
        inputs = engram_gate_inputs(num_tokens, 'meta', requires_grad=True)
        out = compiled(*inputs)
        assert _layout(out) == _layout(inputs[0])
        if num_tokens == 100:
            num_graphs = len(graphs.forward), len(graphs.backward)
    assert (len(graphs.forward), len(graphs.backward)) == num_graphs == (1, 1)
    assert custom_ops(graphs.forward[-1]) == {'fused_weight', 'engram_gate_fwd'}
    assert custom_ops(graphs.backward[-1]) == {'engram_gate_bwd', 'grad_w_reduce'}


def _post_bwd_inputs(num_tokens: int) -> tuple:
    meta = {'device': 'meta'}
    return (torch.empty(num_tokens, MHC_HIDDEN, dtype=torch.bfloat16, **meta), torch.empty(num_tokens, MHC, MHC_HIDDEN, dtype=torch.bfloat16, **meta),
            torch.empty(num_tokens, MHC, 1, **meta), torch.empty(num_tokens, MHC, MHC, **meta),
            torch.empty(num_tokens, MHC, MHC_HIDDEN, dtype=torch.bfloat16, **meta))


def test_mhc_post_bwd_stash_stays_outside_the_op(fresh_dynamo):
    """The op is pure; the fuse_grad_acc stash is set by the Python wrapper, which dynamo cannot trace: one graph without
    it, a graph break (refused under fullgraph=True) with it, and the stash still set after the graph."""
    args = _post_bwd_inputs(64)
    grads = torch.compile(mhc.mhc_post_bwd, fullgraph=True, dynamic=True, backend='aot_eager')(*args, fuse_grad_acc=False)
    assert [_layout(g) for g in grads] == [_layout(a) for a in args[:4]]
    assert not hasattr(args[1].untyped_storage(), STASH)
    with pytest.raises(torch._dynamo.exc.Unsupported, match='setattr'):
        torch.compile(mhc.mhc_post_bwd, fullgraph=True, dynamic=True, backend='aot_eager')(*args, fuse_grad_acc=True)
    torch._dynamo.reset()
    grads = torch.compile(mhc.mhc_post_bwd, dynamic=True, backend='aot_eager')(*args, fuse_grad_acc=True)
    assert getattr(args[1].untyped_storage(), STASH) is grads[1]


def test_engram_gate_fwd_without_saving_is_one_op(fresh_dynamo):
    graphs = Graphs()
    fn = torch.compile(lambda *a: _custom_ops.engram_gate_fwd(*a, save_for_backward=False), fullgraph=True, dynamic=True,
                       backend=graphs.backend)
    x = torch.empty(37, 4, ENGRAM_HIDDEN, dtype=torch.bfloat16, device='meta')
    out = fn(x, x, torch.empty(37, ENGRAM_HIDDEN, dtype=torch.bfloat16, device='meta'), torch.empty(4, ENGRAM_HIDDEN, device='meta'), 1e-6, 0.1)
    assert _layout(out[0]) == _layout(x) and out[1:] == (None, None, None, None)
    assert custom_ops(graphs.forward[-1]) == {'engram_gate_fwd'}


@pytest.mark.parametrize('case', MHC_ENGRAM_CASES, ids=lambda c: c.name)
def test_the_ops_kernel_gets_the_public_arguments(case):
    """Each case's op, run on CPU tensors, reaches its public function with arguments that pass every check up to the
    device (the last one): the op's arguments convert back to the public signature, and the cases are valid calls."""
    with OpCalls() as recorded, pytest.raises(ValueError, match=rf'^{case.name.split("-")[0]}: \w+(\[\d+\])? must be on a CUDA device'):
        case.op(*case.args(case.tokens[0]))
    assert len(recorded.calls) == 1


@pytest.mark.parametrize('case', MHC_ENGRAM_WRITING, ids=lambda c: c.name)
def test_ops_that_write_inputs_compile_through_aot_autograd_on_meta(case, fresh_dynamo):
    """AOTAutograd functionalises them (auto_functionalized, Tensor[] lists included) and writes the results back."""
    graphs = Graphs()
    compiled = torch.compile(lambda *args: case.op(*args), fullgraph=True, dynamic=True, backend=graphs.backend)
    for num_tokens in case.tokens[:2]:
        args = pytree.tree_map_only(torch.Tensor, lambda t: t.to('meta'), case.args(num_tokens))
        compiled(*args)
    assert len(graphs.forward) == 1
    assert custom_ops(graphs.forward[0]) == {case.name.replace('-out', '_out')}


def test_mhc_embedding_and_head_compile_forward_and_backward_on_meta(fresh_dynamo):
    """expand_from_embedding and mhc_head (the padded fn, head_compute_mix) through the same ops, grad on."""
    from tile_kernels_aot.modeling import mhc as modeling

    def model(embedding, fn, scale, base):
        return modeling.mhc_head(modeling.expand_from_embedding(embedding, MHC), fn, scale, base)

    graphs = Graphs()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=graphs.backend)
    meta = {'device': 'meta', 'requires_grad': True}
    for num_tokens in (40, 72):
        leaves = (torch.empty(num_tokens, 2, MHC_HIDDEN, dtype=torch.bfloat16, **meta), torch.empty(MHC, MHC * MHC_HIDDEN, **meta),
                  torch.empty(1, **meta), torch.empty(MHC, **meta))
        out = compiled(*leaves)
        assert _layout(out) == _layout(leaves[0])
        out.float().sum().backward()
        assert [_layout(t.grad) for t in leaves] == [_layout(t) for t in leaves]
    assert (len(graphs.forward), len(graphs.backward)) == (1, 1)
    assert custom_ops(graphs.forward[0]) == {'expand_to_mhc_fwd', 'mhc_pre_norm_fn_fwd', 'mhc_head_compute_mix_fwd', 'mhc_pre_apply_mix_fwd'}
    assert custom_ops(graphs.backward[0]) == {'expand_to_mhc_bwd', 'mhc_pre_norm_fn_bwd', 'mhc_head_compute_mix_bwd', 'mhc_pre_apply_mix_bwd'}
