"""Launch plans (tile_kernels_aot._plans) without a GPU: ops over a fake binary whose launches are recorded, and the
real topk_gate and per_token_cast over the small build. A replayed call must launch what the op's own checked call
would: the same binary, dims and scalars, each buffer at the address the op would have passed."""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import os
import struct
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tile_kernels_aot import _custom_ops, _index_checks, _launch, _plans, _select, config, moe, quant
from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot.manifest import KernelArg, Launch, entry_from_plain

ENTRY = entry_from_plain({
    'kernel': 'demo.copy', 'key': 'h=64', 'params': {'h': 64}, 'target': 'sm_90a', 'cubin': 'x.cubin', 'sha256': '0' * 64,
    'source': 'x.cu', 'scalars': [{'name': 'num_sms', 'kind': 'int32'}], 'constants': {},
    'buffers': [
        {'name': 'x', 'dtype': 'bfloat16', 'shape': ['num_tokens', 64], 'strides': ['row_stride', 1], 'alignment': 16},
        {'name': 'out', 'dtype': 'float32', 'shape': ['num_tokens', 2], 'strides': [2, 1], 'alignment': 16},
    ],
    'launches': [{'symbol': 'k', 'args': [], 'grid': ['num_tokens', 1, 1], 'block': [128, 1, 1],
                  'dynamic_smem': 0, 'cooperative': False, 'cluster_dims': None, 'pdl': False, 'tma': []}],
})
KERNEL = LoadedKernel(ENTRY, Path('.'))
full_calls = Counter()  # calls that ran an op's own code, by op


@pytest.fixture
def launches(monkeypatch):
    """Every launch, bound and checked, as (kernel name, {buffer: address}, env); nothing reaches a driver."""
    seen = []
    monkeypatch.setattr(LoadedKernel, 'launch', lambda self, device, pointers, env: seen.append((self.entry.kernel, dict(pointers), dict(env))))
    full_calls.clear()
    return seen


@_plans.launch_plan
def demo(x, scale=1.0, mode='empty', out=None):
    full_calls['demo'] += 1
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError('demo: x must be a 2-d tensor')
    extra = None
    raw = None
    if mode == 'retyped':  # the kernel writes bytes the op returns as int32 words, as the packed scale factors are
        raw = torch.empty((x.shape[0], 8), dtype=torch.uint8)
        out = raw.view(torch.float32)
    if out is None:
        out = torch.zeros((x.shape[0], 2)) if mode == 'zeros' else torch.empty((x.shape[0], 2))
    if mode == 'fill':
        out.fill_(scale)
    elif mode == 'torch_op':
        extra = x.view(torch.int16) + 1
    elif mode == 'item':
        scale = float(x[0, 0])
    KERNEL(0, {'x': x, 'out': out}, {'num_sms': config.get_num_sms(0) if config._num_sms else 132})
    if mode == 'transposed':
        return out.T
    if mode == 'tail':  # a view at an offset into what the kernel writes
        return out[1:]
    if mode == 'retyped':
        return raw.view(torch.int32).T
    return (out, extra) if extra is not None else out


@_plans.launch_plan
def pair(x, y):
    """Launches x only; y just takes part in the signature."""
    full_calls['pair'] += 1
    out = torch.empty((x.shape[0], 2))
    KERNEL(0, {'x': x, 'out': out}, {'num_sms': 132})
    return out


@_plans.launch_plan
def outer(x):
    full_calls['outer'] += 1
    return demo(x, 2.0, 'fill')


def aligned(t: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """A contiguous copy of t at `offset` bytes past a 256-byte boundary: a signature holds the low 8 bits of a data
    pointer, and the CPU allocator aligns to 64 bytes only."""
    nbytes = t.numel() * t.element_size()
    buffer = torch.empty(nbytes + 512, dtype=torch.uint8)
    start = -buffer.data_ptr() % 256 + offset
    copy = buffer[start:start + nbytes].view(t.dtype).view(t.shape)
    copy.copy_(t)
    return copy


def in_threads(work, count: int) -> None:
    """Run `work` in `count` threads at once and wait for them all."""
    threads = [threading.Thread(target=work) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def x_of(tokens=3):
    return aligned(torch.randn(tokens, 64).bfloat16())


def key_entries(key_bytes: bytes) -> list[tuple]:
    """The tensor entries in the bytes that end the C extension's signature, as (device, sizes, strides): each its
    device and dims as 4-byte ints, its address bits as an 8-byte one, then its sizes and strides as 8-byte ints."""
    found, at = [], 0
    while at < len(key_bytes):
        device, ndim, _ = struct.unpack_from('=iiq', key_bytes, at)
        dims = struct.unpack_from(f'={2 * ndim}q', key_bytes, at + 16)
        found.append((device, dims[:ndim], dims[ndim:]))
        at += 16 + 16 * ndim
    assert at == len(key_bytes)
    return found


def first_rows(key: tuple) -> int:
    """The first size of a plan key's first argument, a tensor: in the tuple signature makes of it, or in the entries
    that end the C extension's signature where its part is its dtype."""
    return key_entries(key[-1])[0][1][0] if isinstance(key[2], torch.dtype) else key[2][1][0]


def test_the_third_call_of_a_signature_replays_the_second(launches):
    results = []
    for _ in range(4):
        x = x_of()
        results.append((x, demo(x)))
    assert full_calls['demo'] == 2  # the first call and the recorded one; the others replay
    assert type(demo.plans[next(iter(demo.plans))]) is _plans._Plan
    assert [env for _, _, env in launches] == [{'num_tokens': 3, 'row_stride': 64, 'num_sms': 132}] * 4
    for (x, out), (_, pointers, _) in zip(results, launches):
        assert pointers == {'x': x.data_ptr(), 'out': out.data_ptr()}
        assert out.shape == (3, 2) and out.stride() == (2, 1) and out.dtype == torch.float32
    assert len({out.data_ptr() for _, out in results}) == 4  # each call its own output


@pytest.mark.parametrize('change', ['tokens', 'row stride', 'dtype', 'alignment', 'bool for int', 'negative zero', 'num_sms', 'index checks'])
def test_every_part_of_the_signature_separates_plans(launches, change, monkeypatch):
    x = x_of(4)
    args = (x, 0.0)
    for _ in range(3):
        demo(*args)
    assert full_calls['demo'] == 2
    if change == 'tokens':
        args = (x_of(5), 0.0)
    elif change == 'row stride':
        args = (aligned(torch.randn(4, 128).bfloat16())[:, :64], 0.0)
    elif change == 'dtype':
        args = (aligned(x.half()), 0.0)
    elif change == 'alignment':
        args = (aligned(x, 16), 0.0)
    elif change == 'bool for int':
        args = (x, False)
    elif change == 'negative zero':
        args = (x, -0.0)
    elif change == 'num_sms':
        monkeypatch.setattr(config, '_num_sms', 7)
    else:
        monkeypatch.setattr(_index_checks, 'enabled', True)
    with pytest.raises(Exception) if change in ('dtype',) else _nothing():
        demo(*args)
    assert full_calls['demo'] == 3
    assert len(demo.plans) == 2


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_zero_filled_allocations_and_fills_are_repeated(launches):
    for _ in range(4):
        litter = torch.full((3, 2), 7.0)  # freed memory of the output's size, for the allocator to hand out again
        del litter
        assert torch.equal(demo(x_of(), mode='zeros'), torch.zeros(3, 2))
        assert torch.equal(demo(x_of(), 0.25, mode='fill'), torch.full((3, 2), 0.25))
    assert full_calls['demo'] == 4


def test_a_torch_op_is_repeated_on_the_new_arguments(launches):
    for _ in range(4):
        x = x_of()
        out, extra = demo(x, mode='torch_op')
        assert torch.equal(extra, x.view(torch.int16) + 1)
        assert launches[-1][1] == {'x': x.data_ptr(), 'out': out.data_ptr()}
    assert full_calls['demo'] == 2


def test_a_returned_view_is_made_from_the_new_allocation(launches):
    for _ in range(4):
        t = demo(x_of(), mode='transposed')
        assert t.shape == (2, 3) and t.stride() == (1, 2) and t.data_ptr() == launches[-1][1]['out']
    assert full_calls['demo'] == 2


def test_a_returned_view_in_another_dtype_is_made_from_the_new_allocation_without_its_chain(launches):
    for _ in range(4):
        t = demo(x_of(), mode='retyped')
        assert t.dtype == torch.int32 and t.shape == (2, 3) and t.stride() == (1, 2) and t.data_ptr() == launches[-1][1]['out']
    assert full_calls['demo'] == 2
    (plan,) = [p for p in demo.plans.values() if type(p) is _plans._Plan]
    assert [step[0] for step in plan.steps] == [_plans._ALLOC, _plans._LAUNCH]  # no view of the chain is repeated


def test_an_output_passed_in_is_returned_as_itself(launches):
    for _ in range(4):
        out = aligned(torch.empty(3, 2))
        assert demo(x_of(), out=out) is out
        assert launches[-1][1]['out'] == out.data_ptr()
    assert full_calls['demo'] == 2


def test_what_reads_tensor_values_runs_in_full_every_time(launches):
    for _ in range(4):
        demo(x_of(), mode='item')
    assert full_calls['demo'] == 4
    (plan,) = demo.plans.values()
    assert type(plan) is _plans.NotReplayable and 'depends on tensor values' in plan.reason


def test_one_tensor_passed_twice_is_replayed_only_for_calls_that_pass_one_tensor_twice(launches):
    for _ in range(3):
        x = x_of()
        pair(x, x)
    assert full_calls['pair'] == 2
    x, y = x_of(), x_of()
    pair(x, y)  # the signature's plan was recorded with x passed twice: this call runs in full
    assert full_calls['pair'] == 3 and launches[-1][1]['x'] == x.data_ptr()


def test_arguments_that_share_memory_are_not_replayed(launches):
    for _ in range(4):
        x = x_of(4)
        pair(x[:2], x[2:])  # 256 bytes apart: one alignment
    assert full_calls['pair'] == 4
    assert 'share memory' in next(iter(pair.plans.values())).reason


def test_a_failing_call_is_never_remembered(launches):
    for _ in range(3):
        with pytest.raises(ValueError, match='demo: x must be a 2-d tensor'):
            demo(torch.zeros(3))
    assert full_calls['demo'] == 3 and all(plan is None for plan in demo.plans.values())


def test_an_argument_without_a_signature_runs_in_full(launches):
    for _ in range(3):
        demo(x_of(), mode=object())
    assert full_calls['demo'] == 3 and not demo.plans


def test_a_tensor_without_storage_meets_the_ops_own_checks():
    sparse = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (4, 256), check_invariants=False)
    for _ in range(3):
        with pytest.raises(ValueError, match='topk_gate: scores must be contiguous in its last dimension'):
            moe.topk_gate(sparse, 8)


def test_under_another_dispatch_mode_the_op_runs_in_full(launches):
    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watching():
        for _ in range(4):
            demo(x_of())
    assert full_calls['demo'] == 4


def test_a_nested_op_runs_in_full_inside_the_recorded_call_and_its_launch_is_replayed(launches):
    for _ in range(4):
        x = x_of()
        out = outer(x)
        assert torch.equal(out, torch.full((3, 2), 2.0)) and launches[-1][1] == {'x': x.data_ptr(), 'out': out.data_ptr()}
    assert full_calls['outer'] == 2 and full_calls['demo'] == 2  # demo runs inside outer's two full calls only


def test_a_stand_in_is_launched_at_its_address(launches):
    standing = _plans.stand_ins('test stand-in', lambda: {'out': torch.empty(3, 2)})['out']
    assert _plans.stand_ins('test stand-in', lambda: {'out': torch.empty(3, 2)})['out'] is standing  # made once

    @_plans.launch_plan
    def into_standing(x):
        KERNEL(0, {'x': x, 'out': standing}, {'num_sms': 132})

    for _ in range(4):
        into_standing(x_of())
    assert type(next(iter(into_standing.plans.values()))) is _plans._Plan
    assert [pointers['out'] for _, pointers, _ in launches] == [standing.data_ptr()] * 4


@_plans.launch_plan
def tabled(x, rows):
    """Launches with out = a table of the rows' addresses (as float32 pairs: 8 bytes a row)."""
    full_calls['tabled'] += 1
    table = _plans.address_table(rows, x.device)
    KERNEL(0, {'x': x, 'out': table.view(torch.float32).view(-1, 2)}, {'num_sms': 132})
    return table


def test_an_address_table_is_built_from_each_calls_tensors(launches):
    for _ in range(4):
        x, rows = x_of(), [aligned(torch.randn(8)) for _ in range(3)]
        table = tabled(x, rows)
        assert table.tolist() == [t.data_ptr() for t in rows] and launches[-1][1] == {'x': x.data_ptr(), 'out': table.data_ptr()}
    assert full_calls['tabled'] == 2


def test_an_op_keeps_at_most_max_plans_signatures_and_drops_passing_ones_first(launches, monkeypatch):
    monkeypatch.setattr(_plans, 'MAX_PLANS', 3)
    for _ in range(3):
        demo(x_of(1))  # a plan
    for tokens in range(2, 7):  # each seen once
        demo(x_of(tokens))
    assert len(demo.plans) == 3
    assert [first_rows(key) for key in demo.plans] == [1, 5, 6]  # the plan stays; the oldest passing signatures went
    for tokens in (5, 6, 7, 7):
        demo(x_of(tokens))  # 5 and 6 become plans, 7 then replaces the oldest plan
    assert [first_rows(key) for key in demo.plans] == [5, 6, 7]


def test_reset_forgets_the_plans(launches):
    for _ in range(3):
        demo(x_of())
    _select.reset()
    assert not demo.plans


def test_every_public_op_has_a_launch_plan():
    unwrapped = {}
    for qualified in _custom_ops.PUBLIC:
        module, name = qualified.split('.')
        fn = getattr(importlib.import_module(f'tile_kernels_aot.{module}'), name)
        if not hasattr(fn, 'plans'):
            unwrapped[qualified] = fn
    # mhc_post_bwd stashes a gradient on the residual's storage, around _post_bwd, which has a plan.
    assert set(unwrapped) == {'mhc.mhc_post_bwd'}
    assert hasattr(importlib.import_module('tile_kernels_aot.mhc.post')._post_bwd, 'plans')
    assert moe.get_fused_mapping.plans is moe._fused_mapping.plans  # it syncs and trims after _fused_mapping's launch


def test_real_ops_replay_their_launches(built, record_launches):
    launched = record_launches(built / 'build' / 'sm_90a')
    for _ in range(4):
        moe.topk_gate(aligned(torch.randn(5, 256)), 8)
        quant.per_token_cast(aligned(torch.randn(5, 7168).bfloat16()), 'e4m3', 128)
    assert [kernel for kernel, _, _ in launched] == ['moe.topk_gate', 'quant.per_token_cast'] * 4
    assert all(launch == launched[i % 2] for i, launch in enumerate(launched))
    assert [type(p) for p in moe.topk_gate.plans.values()] == [_plans._Plan]
    assert [type(p) for p in quant.per_token_cast.plans.values()] == [_plans._Plan]


def test_threads_replay_one_plan_each_with_its_own_tensors(monkeypatch):
    seen = []
    monkeypatch.setattr(LoadedKernel, 'launch', lambda self, device, pointers, env: seen.append((threading.get_ident(), pointers['x'], pointers['out'])))
    mismatches = []

    def work():
        for _ in range(50):
            x = x_of()
            out = demo(x)
            mine = [(x_ptr, out_ptr) for ident, x_ptr, out_ptr in seen if ident == threading.get_ident()][-1]
            if mine != (x.data_ptr(), out.data_ptr()):
                mismatches.append(mine)

    in_threads(work, 8)
    assert not mismatches and len(seen) == 400
    assert [type(p) for p in demo.plans.values()] == [_plans._Plan]


def test_recording_imports_nothing():
    """A recorded call happens in serving, at an op's second call of a signature: it must not import torch._dynamo and
    sympy, as a TorchDispatchMode does unless it opts out of torch.compile's wrapping."""
    result = subprocess.run([sys.executable, '-c', textwrap.dedent('''
        import sys, torch
        from tile_kernels_aot import _plans
        before = set(sys.modules)
        with _plans._Recorder([]):
            (torch.empty(3).view(3, 1) + 1).zero_()
        print(sorted(set(sys.modules) - before))
    ''')], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[]'


def test_plans_turned_off_run_every_call_in_full(launches, monkeypatch):
    for _ in range(3):
        demo(x_of())
    monkeypatch.setattr(_plans, 'enabled', True)
    _plans.enable(False)
    for _ in range(3):
        demo(x_of())
    assert full_calls['demo'] == 5
    _plans.enable(True)
    demo(x_of())
    assert full_calls['demo'] == 5
    with pytest.raises(TypeError, match='enable: on must be a bool'):
        _plans.enable(1)


@pytest.mark.parametrize('value, expected', [('0', 'False'), ('1', 'True'), ('', 'True'), ('2', "ValueError: TILE_KERNELS_AOT_LAUNCH_PLANS must be 0 or 1, got '2'")])
def test_the_environment_sets_whether_plans_start_on(value, expected):
    result = subprocess.run([sys.executable, '-c', textwrap.dedent('''
        try:
            from tile_kernels_aot import _plans
            print(_plans.enabled)
        except ValueError as exc:
            print(f'ValueError: {exc}')
    ''')], capture_output=True, text=True, env={**os.environ, _plans.PLANS_ENV: value})
    assert result.stdout.strip() == expected, result.stderr


def test_host_python_times_and_checks_replays_over_a_build(built):
    result = subprocess.run([sys.executable, '-m', 'benchmarks.host_python', str(built / 'build' / 'sm_90a'), '--tokens', '5',
                             '--cases', 'per_token_cast-torch.bfloat16-e4m3-128-*,topk_gate'], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stdout + result.stderr
    skipped, timed = result.stdout.splitlines()
    assert skipped.startswith('topk_gate') and 'skipped' in skipped and 'num_experts=64' in skipped  # not in the small build
    assert timed.startswith('per_token_cast') and 'in full' in timed and 'replayed' in timed and 'DIFFER' not in timed


class RecordingDriver:
    """A driver whose launch reads the argument block as cuLaunchKernel would: each parameter's value, by its kind. With
    `native`, it also stands in for the C extension, which takes addresses (tile_kernels_aot._driver_native.launch)."""

    replay_functions = None  # no C functions to replay a plan with: the plans replay in Python

    def __init__(self, kinds: list[str], native: bool) -> None:
        self.kinds = kinds
        self.seen = []
        self.native = self if native else None

    def launch(self, fn, grid, block, smem, stream, params) -> int:
        if isinstance(fn, int):  # the extension's call: the function's handle and the array's address
            fn, params = ctypes.c_void_p(fn), (ctypes.c_void_p * len(self.kinds)).from_address(params)
        types = {'ptr': ctypes.c_uint64, 'int32': ctypes.c_int32}
        values = tuple(types[kind].from_address(params[i]).value for i, kind in enumerate(self.kinds))
        self.seen.append((fn.value, grid, block, smem, stream, values))
        return 0


@pytest.mark.parametrize('native', [True, False], ids=['native', 'ctypes'])
def test_a_replayed_launch_fills_the_argument_block_as_a_full_call_does(monkeypatch, native):
    """Below LoadedKernel.launch: a replay of a plain kernel writes the argument block and calls the driver itself."""
    plain = dict(ENTRY.launches[0].__dict__, args=(KernelArg('x', 'ptr'), KernelArg('out', 'ptr'), KernelArg('num_tokens', 'int32'),
                                                   KernelArg('num_sms', 'int32')), grid=('num_tokens', 1, 1))
    kernel = LoadedKernel(dataclasses.replace(ENTRY, launches=(Launch(**plain),)), Path('.'))
    drv = RecordingDriver(['ptr', 'ptr', 'int32', 'int32'], native)
    monkeypatch.setattr(LoadedKernel, '_load', lambda self, device: (setattr(self, '_driver', drv), [ctypes.c_void_p(0xF00)])[1])
    monkeypatch.setattr(_launch, '_ensure_context', lambda device: setattr(_launch._thread_state, 'device', device))
    monkeypatch.setattr(_launch, '_current_device', lambda: 0)
    monkeypatch.setattr(_launch, '_current_stream', lambda device: 0x5EA)
    through_launch = Counter()
    monkeypatch.setattr(LoadedKernel, 'launch', lambda self, *a: (through_launch.update([1]), LoadedKernel._launch_all(self, *a)))

    @_plans.launch_plan
    def op(x, skip=0):
        out = torch.empty((x.shape[0] - skip, 2))
        kernel(0, {'x': x[skip:], 'out': out}, {'num_sms': 132})
        return out

    calls = []
    for tokens, skip in [(3, 0), (3, 0), (3, 0), (3, 0), (4, 1), (4, 1), (4, 1), (3, 0)]:
        x = x_of(tokens)
        calls.append((x, skip, op(x, skip)))
    assert through_launch[1] == 4  # the two signatures' first and recorded calls; the four replays call the driver directly
    assert len(drv.seen) == 8
    for (x, skip, out), (fn, grid, block, smem, stream, values) in zip(calls, drv.seen):
        rows = x.shape[0] - skip
        assert (fn, grid, block, smem, stream) == (0xF00, (rows, 1, 1), (128, 1, 1), 0, 0x5EA)
        assert values == (x[skip:].data_ptr(), out.data_ptr(), rows, 132)
