"""Launch plans on the GPU: every public op's replayed calls give what its checked calls give, on the representative
inputs of tests/fixtures/custom_ops.py, and a replayed call captures into a CUDA graph."""

from __future__ import annotations

import importlib
import struct

import pytest
import torch
from torch.utils import _pytree as pytree

from tests.fixtures.custom_ops import CASES
from tile_kernels_aot import _custom_ops, _plans, quant

pytestmark = pytest.mark.gpu

_PUBLIC = {op: qualified for qualified, op in _custom_ops.PUBLIC.items()}


def _public(case):
    module, name = _PUBLIC[case.op.__name__].split('.')
    return getattr(importlib.import_module(f'tile_kernels_aot.{module}'), name)


def _fresh(args):
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), args)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of its width, so that == compares bits (NaN == NaN, -0.0 != 0.0)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.dtype.itemsize]) if t.numel() else t


@pytest.mark.parametrize('case', [c for c in CASES if hasattr(_public(c), 'plans')], ids=lambda c: c.name)
def test_replayed_calls_give_what_checked_calls_give(case):
    op = _public(case)
    args = pytree.tree_map_only(torch.Tensor, lambda t: t.cuda(), case.args(case.tokens[0]))
    runs = []
    for _ in range(4):  # in full, in full under the recorder, then replayed twice
        call_args = _fresh(args)
        result = op(*call_args)
        runs.append([t for t in pytree.tree_leaves((result, call_args)) if isinstance(t, torch.Tensor)])
    torch.cuda.synchronize()
    plans = list(op.plans.values())
    assert [type(p) for p in plans] == [_plans._Plan], plans
    for index, (first, second) in enumerate(zip(runs[0], runs[1])):
        # Where the two checked calls agree, the replays must give the same bits; elements they disagree on (a float sum
        # in another order, memory an op leaves unwritten) are not the op's to fix, so not the replay's either.
        settled = _bits(first) == _bits(second)
        for replayed in (runs[2][index], runs[3][index]):
            assert replayed.shape == first.shape and replayed.dtype == first.dtype and replayed.stride() == first.stride()
            differs = (_bits(replayed) != _bits(first)) & settled
            assert not differs.any(), f'{case.name}: tensor {index} differs when replayed at {differs.nonzero()[:4].tolist()}'


@pytest.mark.parametrize('index_dtype', [torch.int64, torch.int32])
def test_a_get_fused_mapping_that_syncs_replays_its_launch_then_trims(index_dtype):
    from tile_kernels_aot import moe, reference

    topk_idx = torch.randint(-1, 64, (37, 8), device='cuda', dtype=index_dtype)
    expected = reference.get_fused_mapping(topk_idx.long(), 64, 0, 16)
    plans = moe._fused_mapping.plans
    for call in range(4):  # in full, recorded, then replayed twice
        *tensors, counts = moe.get_fused_mapping(topk_idx, 64, 0, 16)
        *expected_tensors, expected_counts = expected
        assert counts == expected_counts, call
        for got, want in zip(tensors, expected_tensors, strict=True):
            assert got.shape == want.shape and torch.equal(got.long(), want.long()), call
    signature = _plans.plan_key((topk_idx, 64, 0, 16, False), {}, [])
    assert type(plans[signature]) is _plans._Plan


def test_a_replayed_call_is_captured_in_a_cuda_graph():
    x = torch.randn(64, 7168, device='cuda').bfloat16()
    for _ in range(2):
        quant.per_token_cast(x, 'e4m3', 128)  # the second call records the plan
    expected = quant.per_token_cast(x, 'e4m3', 128)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = quant.per_token_cast(x, 'e4m3', 128)
    x.copy_(torch.randn_like(x.float()).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    fresh = quant.per_token_cast(x, 'e4m3', 128)
    assert torch.equal(captured[0].view(torch.uint8), fresh[0].view(torch.uint8)) and torch.equal(captured[1], fresh[1])
    assert not torch.equal(expected[1], fresh[1])


def _simple_calls():
    """Calls of ops whose plans are simple (allocations and launches of one-launch kernels without tensor maps, returning
    what they allocate or views of it): the C extension replays them. group_count and aux_fi launch with PDL, through
    cuLaunchKernelEx (one block for 37 tokens, several adding to zeroed outputs for 4096); per_token_cast with packed
    UE8M0 scale factors returns int32 words over the bytes its kernel writes, transposed."""
    from tile_kernels_aot import moe

    scores, weights, x = torch.randn(37, 256, device='cuda'), torch.rand(37, 8, device='cuda'), torch.randn(37, 7168, device='cuda').bfloat16()
    few, many = (torch.randint(-1, 64, (tokens, 8), device='cuda') for tokens in (37, 4096))
    return [(moe.topk_gate, (scores, 8)), (moe.normalize_weight, (weights,)), (quant.per_token_cast, (x, 'e4m3', 128)),
            (moe.group_count, (few, 64)), (moe.group_count, (many, 64)),
            (moe.aux_fi, (few.clamp(min=0), 64, 8)), (moe.aux_fi, (many.clamp(min=0), 64, 8)),
            (quant.per_token_cast, (x, 'e4m3', 32, None, True, True, True)), (quant.per_token_cast, (x, 'e2m1', 32, None, True, True, True))]


def test_simple_plans_replay_in_c_and_give_what_checked_calls_give():
    if _plans._native_replay is None:
        pytest.skip('the runtime C extension is not installed, or TILE_KERNELS_AOT_NATIVE_LAUNCH=0')
    for op, args in _simple_calls():
        op.plans.clear()
        results = [op(*args) for _ in range(4)]  # in full, recorded, then replayed in C
        native_replay, _plans._native_replay = _plans._native_replay, None
        try:
            results.append(op(*args))  # replayed in Python
        finally:
            _plans._native_replay = native_replay
        torch.cuda.synchronize()
        assert [p.native is not None for p in op.plans.values()] == [True], op.__name__
        first = [t for t in pytree.tree_leaves(results[0]) if isinstance(t, torch.Tensor)]
        for result in results[1:]:
            tensors = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
            layout = [(t.shape, t.stride(), t.storage_offset(), t.dtype, t.device) for t in tensors]
            assert layout == [(t.shape, t.stride(), t.storage_offset(), t.dtype, t.device) for t in first], op.__name__
            assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(tensors, first)), op.__name__
        assert len({t.data_ptr() for result in results[2:] for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)}) == 3 * len(first)


def test_a_replay_in_c_allocates_through_torchs_shim_and_leaves_its_outputs_to_the_caller():
    """The C replay's allocations and same-dtype views come from torch's C shim (_torch_shim) on the GPU too; each output
    it returns has the caller as its only owner, and 200 replayed calls whose results are dropped leave the memory
    torch has allocated where it was."""
    if _plans._native_replay is None:
        pytest.skip('the runtime C extension is not installed, or TILE_KERNELS_AOT_NATIVE_LAUNCH=0')
    assert _plans._shim, f'torch {torch.__version__} lacks the AOTInductor shim functions _torch_shim looks up'
    for op, args in _simple_calls():
        op.plans.clear()
        for _ in range(3):
            result = op(*args)
        (plan,) = op.plans.values()
        allocations, _, views, _ = plan.native
        assert all(spec is not None for *_, spec in allocations), op.__name__
        outputs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        assert outputs and all(t._use_count() == 1 for t in outputs), op.__name__
        # a view of an allocation's own dtype comes from the shim, which makes no autograd view; one of another dtype
        # comes from torch's view(dtype).as_strided(...), which does
        assert sum(t._base is not None for t in outputs) == sum(dtype is not None for _, _, dtype, *_ in views), op.__name__
        del result, outputs
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        for _ in range(200):
            op(*args)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == before, op.__name__


def test_a_replay_in_c_is_captured_in_a_cuda_graph_and_runs_on_a_side_stream():
    from tile_kernels_aot import moe

    scores = torch.randn(64, 256, device='cuda')
    for _ in range(3):
        moe.topk_gate(scores, 8)  # the third call replays in C
    assert [p.native is not None for p in moe.topk_gate.plans.values()] == [_plans._native_replay is not None]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe.topk_gate(scores, 8)
    scores.copy_(torch.randn_like(scores))
    graph.replay()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = moe.topk_gate(scores, 8)
    torch.cuda.current_stream().wait_stream(side)
    expected = moe.topk_gate.__wrapped__(scores, 8)  # the op's own checked call
    torch.cuda.synchronize()
    assert torch.equal(captured, expected) and torch.equal(on_side, expected)


def test_a_new_thread_replays_a_plan_recorded_on_another():
    import threading

    from tile_kernels_aot import moe

    weights = torch.rand(16, 8, device='cuda')
    for _ in range(3):
        expected = moe.normalize_weight(weights)
    got = []
    thread = threading.Thread(target=lambda: got.extend(moe.normalize_weight(weights) for _ in range(2)))
    thread.start()
    thread.join()
    torch.cuda.synchronize()
    assert len(got) == 2 and all(torch.equal(a, b) for result in got for a, b in zip(result, expected))


def test_the_c_signature_reads_cuda_tensors_through_torchs_dlpack_exchange_api():
    """On the GPU the extension's signature reads a CUDA tensor through torch's DLPack exchange API (its entry holds
    the tensor's device index), and two calls have equal C signatures exactly where they have equal Python ones."""
    if _plans._native is None or _plans._exchange is None:
        pytest.skip('the runtime C extension is not installed, or torch has no DLPack exchange API (2.10 on)')
    x = torch.randn(64, 128, device='cuda')
    tensors = [x, torch.randn(64, 128, device='cuda'), x[1:], x.T, x[:, ::2], x.bfloat16(), x.view(torch.int32), x.view(torch.uint8),
               x[:0], x.cpu()]
    calls = [(t, *rest) for t in tensors for rest in [(), (3,), (t,)]]
    python, c = [], []
    for args in calls:
        tensors_in, c_tensors = [], []
        python.append(_plans.signature(args, {}, tensors_in))
        c.append(_plans._native.signature(args, {}, None, False, c_tensors))
        assert isinstance(c[-1][2], torch.dtype) and list(map(id, c_tensors)) == list(map(id, tensors_in))  # read through the API
        assert struct.unpack_from('=i', c[-1][-1])[0] == args[0].get_device()
    for i in range(len(calls)):
        for j in range(len(calls)):
            assert (c[i] == c[j]) == (python[i] == python[j]), (i, j)
