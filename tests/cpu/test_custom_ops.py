"""The torch.library custom ops without a GPU: every public op has one, the fake implementations give the outputs the
references give (shapes, dtypes and strides, the column-major scale factors' padded strides included) for a symbolic
token count, and torch.compile traces the MoE routing block into one graph on meta tensors.

A fake op runs on fake CPU tensors of symbolic sizes here: a CPU-only torch cannot slice a fake CUDA tensor (views
ask for a CUDA device guard), and the fakes allocate on their inputs' device, so the device adds nothing to check."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.utils import _pytree as pytree

from tests.fixtures.custom_ops import (
    ALIGNMENT, CASES, HIDDEN, NUM_EXPERTS, NUM_TOPK, OpCalls, Unbacked, routing_block, routing_inputs, writes_inputs,
)
from tile_kernels_aot import _custom_ops, engram, mhc, moe, quant, reference, transpose

# Public names that are no ops: helpers the GPU tests and benchmarks use, and a type.
NOT_OPS = {'quant.per_token_cast_spec', 'quant.QuantTensor', 'transpose.address_bits', 'transpose.spec_for', 'engram.partial_tokens'}
MODULES = {'moe': moe, 'quant': quant, 'transpose': transpose, 'mhc': mhc, 'engram': engram}
# Ops of a public function's out= form, which write their out argument and return nothing.
OUT_OPS = {'reduce_fused_out', 'expand_to_mhc_fwd_out', 'mhc_pre_apply_mix_fwd_out', 'mhc_post_fwd_out'}


def _public_functions() -> set[str]:
    names = {f'quant.{n}' for n in quant.__all__} | {f'mhc.{n}' for n in mhc.__all__}
    for module in (moe, transpose, engram):
        short = module.__name__.rsplit('.', 1)[1]
        names |= {f'{short}.{n}' for n, f in vars(module).items()
                  if inspect.isfunction(f) and f.__module__ == module.__name__ and not n.startswith('_')}
    return names - NOT_OPS


def test_every_public_op_has_a_custom_op():
    assert _public_functions() == set(_custom_ops.PUBLIC) | set(_custom_ops.TRACED_THROUGH)
    for public, name in _custom_ops.PUBLIC.items():
        module, fn_name = public.split('.')
        fn = getattr(MODULES[module], fn_name)
        assert f'_custom_ops.{fn_name}(' in inspect.getsource(fn), f'{public} does not dispatch to its custom op under torch.compile'
        qualname = f'{_custom_ops.NAMESPACE}::{name}'
        for key in ('CUDA', 'CPU', 'Meta'):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key), f'{qualname} has no {key} kernel'


MUTATED = {
    'inplace_unique_group_indices': {'group_indices'}, 'top2_sum_gate': {'unmapped_topk_idx'},
    'swiglu_forward_and_per_token_cast': {'clamped_count'}, 'reduce_fused_out': {'out'},
    'expand_to_mhc_fwd_out': {'out'}, 'mhc_pre_apply_mix_fwd_out': {'out'}, 'mhc_post_fwd_out': {'out'},
    'mhc_pre_apply_mix_bwd': {'x_grad'}, 'mhc_pre_norm_fn_bwd': {'x_grad'}, 'mhc_fn_normw_merge_bwd': {'fn_grad', 'normw_grad'},
    'mhc_multilayer_recompute': {'layer_input_list', 'residual_list'}, 'grad_w_reduce': {'grad_weight_hidden', 'grad_weight_embed'},
}


def test_mutated_arguments_are_declared():
    names = {n for n in torch.ops.tile_kernels_aot if not n.startswith('_')} - {'name'}
    assert set(_custom_ops.PUBLIC.values()) | OUT_OPS <= names
    for name in names:
        schema = getattr(torch.ops.tile_kernels_aot, name).default._schema
        written = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert written == MUTATED.get(name, set()), name
        assert all(r.alias_info is None for r in schema.returns), f'{name} returns an alias of an input'


def test_cpu_tensors_get_the_ops_own_error():
    with pytest.raises(ValueError, match='topk_gate: scores must be on a CUDA device'):
        torch.ops.tile_kernels_aot.topk_gate(torch.randn(4, 8), 2)


def test_eager_calls_do_not_go_through_the_ops():
    with OpCalls() as recorded, pytest.raises(ValueError, match='must be on a CUDA device'):
        moe.topk_gate(torch.randn(4, 8, device='meta'), 2)
    assert recorded.calls == []


def test_a_kernel_run_inside_a_compile_session_takes_the_eager_path(monkeypatch):
    # The public function must not hand the call back to the op (which would recurse).
    monkeypatch.setattr(torch.compiler, '_is_compiling_flag', True)
    assert torch.compiler.is_compiling()
    with pytest.raises(ValueError, match='must be on a CUDA device'):
        torch.ops.tile_kernels_aot.transpose(torch.randn(64, 64))
    assert torch.compiler.is_compiling()


def test_import_stays_light():
    code = 'import sys, tile_kernels_aot; print(sorted(m for m in ("torch._dynamo", "torch._inductor", "tilelang", "tvm") if m in sys.modules))'
    assert subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip() == '[]'


# -- fakes against the references, for a symbolic token count ---------------------------------------------------------

def test_the_cases_call_every_op():
    """The cases the GPU tests opcheck reach every op (run here on fake tensors, where the fakes serve)."""
    called = set()
    for case in CASES:
        args = case.args(case.tokens[0])
        with FakeTensorMode(shape_env=ShapeEnv()) as mode:
            args = pytree.tree_map_only(torch.Tensor, mode.from_tensor, args)
            with OpCalls() as recorded:
                case.op(*args)
        called |= {func._schema.name.split('::')[1] for func, _, _ in recorded.calls}
    assert called == set(_custom_ops.PUBLIC.values()) | OUT_OPS


def _symbolic(args, varying: list[list[bool]], mode: FakeTensorMode):
    tensors = iter(varying)

    def fake(t):
        dims = next(tensors)
        context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC if d else DimDynamic.STATIC for d in dims])
        return mode.from_tensor(t, symbolic_context=context)

    return pytree.tree_map_only(torch.Tensor, fake, args)


def _values(fake_args, args) -> dict:
    """{symbol: value} of the token-dependent sizes of the fake arguments in the real ``args``."""
    values = {}
    for f, t in zip(pytree.tree_leaves(fake_args), pytree.tree_leaves(args)):
        if isinstance(f, torch.Tensor):
            for fs, ts in zip(f.shape, t.shape):
                if isinstance(fs, torch.SymInt):
                    symbol = fs.node.expr
                    assert values.setdefault(symbol, ts) == ts, f'two sizes share the symbol {symbol}: choose other token counts'
    return values


def _at(v, values: dict) -> int | None:
    """v at the token counts of ``values``; None for a size the fake leaves unbacked (a symbol no input has)."""
    if not isinstance(v, torch.SymInt):
        return v
    expr = sympy.sympify(sympy.sympify(v.node.expr).xreplace(values))
    return None if expr.free_symbols else int(expr)


def _layout(out, values=None):
    if isinstance(out, Unbacked):
        return out.layout
    if isinstance(out, torch.Tensor):
        if values is None:
            return tuple(out.shape), tuple(out.stride()), out.dtype
        return tuple(_at(s, values) for s in out.shape), tuple(_at(s, values) for s in out.stride()), out.dtype
    return out


@pytest.mark.parametrize('case', CASES, ids=lambda c: c.name)
def test_fake_matches_reference_for_symbolic_token_counts(case):
    base = case.args(case.tokens[0])
    other = case.args(case.tokens[1])
    varying = [[a != b for a, b in zip(t.shape, u.shape)] for t, u in zip(pytree.tree_leaves(base), pytree.tree_leaves(other))
               if isinstance(t, torch.Tensor)]
    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env) as mode:
        fake_args = _symbolic(base, varying, mode)
        outs = pytree.tree_leaves(case.op(*fake_args), is_leaf=lambda x: x is None)
    specialised = {k: v for k, v in shape_env.replacements.items() if v.is_number}
    assert not specialised, f'the fake fixed token-dependent sizes: {specialised}'
    for t in case.tokens:
        args = case.args(t)
        expected = [_layout(o) for o in pytree.tree_leaves(case.ref(*args), is_leaf=lambda x: x is None)]
        values = _values(fake_args, args)
        assert [_layout(o, values) for o in outs] == expected, f'at {t} tokens'


# -- torch.compile on meta tensors ---------------------------------------------------------------------------------------

def test_routing_block_compiles_to_one_graph_on_meta():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(routing_block, fullgraph=True, dynamic=True, backend=backend)
    for num_tokens in (100, 300):
        out, q, sf = compiled(*routing_inputs(num_tokens, 'meta'))
        num_expanded = reference.fused_num_expanded_tokens(num_tokens, NUM_TOPK, NUM_EXPERTS, ALIGNMENT)
        assert _layout(out) == ((num_tokens, HIDDEN), (HIDDEN, 1), torch.bfloat16)
        assert _layout(q) == ((num_expanded, HIDDEN), (HIDDEN, 1), torch.float8_e4m3fn)
        assert _layout(sf) == ((num_expanded, 1), (1, 1), torch.float32)
    assert len(graphs) == 1  # the second token count reuses the graph of the first
    called = {n.target for n in graphs[0].graph.nodes if n.op == 'call_function'}
    for name in ('top2_sum_gate', 'get_fused_mapping', 'expand_to_fused', 'per_token_cast', 'reduce_fused'):
        packet = getattr(torch.ops.tile_kernels_aot, name)
        assert packet in called or packet.default in called, name
    torch._dynamo.reset()


@pytest.mark.parametrize('backend', ['aot_eager', 'aot_eager_decomp_partition'])
def test_ops_that_write_inputs_compile_through_aot_autograd_on_meta(backend):
    """AOTAutograd functionalises the ops that write their inputs (auto_functionalized) and writes the results back."""
    torch._dynamo.reset()
    meta = {'device': 'meta'}
    for num_tokens in (40, 72):
        args = (torch.empty(num_tokens, 8, dtype=torch.int64, **meta), torch.empty(3 * num_tokens, 128, dtype=torch.bfloat16, **meta),
                torch.empty(num_tokens, 4, **meta), torch.empty(num_tokens, 4, dtype=torch.int32, **meta),
                torch.empty(num_tokens, 128, dtype=torch.bfloat16, **meta), torch.empty(num_tokens, 64, **meta), torch.empty(64, **meta),
                torch.empty(num_tokens, 6, dtype=torch.int64, **meta), torch.empty(num_tokens, 512, dtype=torch.bfloat16, **meta),
                torch.empty(3, dtype=torch.int64, **meta))
        out, sf = torch.compile(writes_inputs, fullgraph=True, dynamic=True, backend=backend)(*args)
        assert _layout(out) == ((num_tokens, 256), (256, 1), torch.float8_e4m3fn)
        assert _layout(sf) == ((num_tokens, 2), (2, 1), torch.float32)
    torch._dynamo.reset()
