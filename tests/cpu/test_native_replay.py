"""The C extension's replay of simple launch plans (tile_kernels_aot._driver_native.replay, _plans._Plan.native) without a
GPU. The driver's cuLaunchKernel, cuLaunchKernelEx and cuCtxGetCurrent are Python functions behind C function pointers
(ctypes callbacks), so that a launch the extension makes is seen as libcuda would see it: its function, grid, block,
shared memory, stream, the bytes of every argument, and a cuLaunchKernelEx's CUlaunchConfig and launch attributes. A
replay in C must launch what the op's own checked call launches, return what Python's replay would, and leave every
call it does not serve to Python before it allocates anything."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import operator
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

from tests.fixtures import stub_driver
from tile_kernels_aot import _checks, _driver, _index_checks, _launch, _plans, _select, _torch_shim, config, mhc, moe, quant
from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot.errors import CudaDriverError
from tile_kernels_aot.manifest import KernelArg, Launch

from . import test_launch_plans as plans_tests
from .conftest import build_subset
from .test_launch_plans import ENTRY, aligned, demo, first_rows, full_calls, in_threads, key_entries, outer, pair, tabled, x_of

native = _driver.native_extension()


def needs_the_extension() -> None:
    if native is None:
        pytest.fail('tile_kernels_aot._driver_native is not built: `pip install -e .` builds it (it needs a C compiler)')

CONTEXTS = {0xC0: 0, 0xC1: 1}  # context -> its device
SIZES = {'ptr': 8, 'int32': 4, 'int64': 8, 'float32': 4}
LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
CTX_GET_CURRENT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
LAUNCH_KERNEL_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
CONFIG_LAYOUT = struct.Struct('<7I4xQQI4x')  # cuda.h's CUlaunchConfig: grid, block, shared bytes, stream, attrs, numAttrs


def launch_config(address: int) -> tuple:
    """The CUlaunchConfig at `address` as cuLaunchKernelEx reads it: (its fields but the attributes' address, the bytes
    of its CUlaunchAttribute array)."""
    *fields, attrs, num_attrs = CONFIG_LAYOUT.unpack(ctypes.string_at(address, CONFIG_LAYOUT.size))
    return (*fields, num_attrs), ctypes.string_at(attrs, num_attrs * ctypes.sizeof(_driver.CUlaunchAttribute))


class CallbackDriver:
    """The driver calls of the loader and of both replays. Each launch goes into `seen` as (how, function, grid, block,
    shared bytes, stream, each argument as (kind, its bytes), the launch config, the launching thread): how is 'native'
    for the C extension's replay (through the C function pointers of replay_functions), 'python' for Python's replay
    (the extension's launch(), stood in for by self) and 'full' for an op's checked call (Driver.launch, or
    Driver.call of cuLaunchKernelEx, which Python's replay of a launch with attributes makes too); the launch config is
    None for cuLaunchKernel, launch_config() of a cuLaunchKernelEx's. Each thread has a current context: none until
    _ensure_context makes its device's current."""

    MAX_PARAMS = native.MAX_PARAMS if native else 0

    def __init__(self) -> None:
        self.native = self
        self.seen: list[tuple] = []
        self.kinds: dict[int, list[str]] = {}  # function -> its arguments' kinds
        self.num_functions = 0
        self.fail_with = 0  # the CUresult of the next C launches
        self._state = threading.local()
        self._launch = LAUNCH_KERNEL(self._c_launch)
        self._ctx_get_current = CTX_GET_CURRENT(self._c_ctx_get_current)
        self._launch_ex = LAUNCH_KERNEL_EX(self._c_launch_ex)
        self.replay_functions = tuple(ctypes.cast(fn, ctypes.c_void_p).value for fn in (self._launch, self._ctx_get_current, self._launch_ex))

    def make_current(self, context: int) -> None:
        self._state.context = context

    def current_context(self) -> int:
        return getattr(self._state, 'context', 0)

    def current_context_device(self) -> int | None:
        return CONTEXTS.get(self.current_context())

    def _record(self, how, fn, grid, block, smem, stream, params, config=None) -> None:
        arguments = tuple((kind, ctypes.string_at(params[i], SIZES[kind])) for i, kind in enumerate(self.kinds[fn]))
        self.seen.append((how, fn, tuple(grid), tuple(block), smem, stream, arguments, config, threading.get_ident()))

    def _c_launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        self._record('native', fn, (gx, gy, gz), (bx, by, bz), smem, stream or 0, ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)))
        assert extra is None
        return self.fail_with

    def _launch_ex_record(self, how, config: int, fn, params) -> None:
        (gx, gy, gz, bx, by, bz, smem, stream, _), _ = seen = launch_config(config)
        self._record(how, fn, (gx, gy, gz), (bx, by, bz), smem, stream, ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)), seen)

    def _c_launch_ex(self, config, fn, params, extra) -> int:
        self._launch_ex_record('native', config, fn, params)
        assert extra is None
        return self.fail_with

    def call(self, name: str, *args) -> None:
        """Driver.call: cuLaunchKernelEx as _launch_one makes it, through ctypes."""
        assert name == 'cuLaunchKernelEx'
        config, fn, params, extra = args
        assert extra is None
        self._launch_ex_record('full', ctypes.addressof(config._obj), fn.value, ctypes.addressof(params))

    def _c_ctx_get_current(self, out) -> int:
        out[0] = self.current_context() or None
        return 0

    def launch(self, fn, grid, block, smem, stream, params) -> int | None:
        if isinstance(fn, int):  # the extension's launch(): the function's handle and the argument array's address
            self._record('python', fn, grid, block, smem, stream, (ctypes.c_void_p * len(self.kinds[fn])).from_address(params))
            return 0
        self._record('full', fn.value, grid, block, smem, stream, params)
        return None

    def check(self, function: str, code: int) -> None:
        if code:
            raise CudaDriverError(function, code, 'CUDA_ERROR_TEST', 'a test error')

    # -- loading, for the real ops' binaries --

    def load_module(self, image: bytes):
        return ctypes.c_void_p(1)

    def get_function(self, module, symbol: str):
        self.num_functions += 1  # a new function each: the caller that knows the launch sets its kinds
        return ctypes.c_void_p(0xF00 + self.num_functions - 1)

    def device_attribute(self, attribute: int, device: int) -> int:
        return 1 << 20

    def set_function_attribute(self, fn, attribute: int, value: int) -> None:
        pass


def hows(drv: CallbackDriver) -> list[str]:
    return [how for how, *_ in drv.seen]


REAL_LOAD = LoadedKernel._load
PLAIN = dataclasses.replace(ENTRY, launches=(Launch(**dict(
    ENTRY.launches[0].__dict__, args=(KernelArg('x', 'ptr'), KernelArg('num_tokens', 'int32'), KernelArg('out', 'ptr'), KernelArg('num_sms', 'int32')),
    grid=('num_tokens', 1, 1), block=(128, 2, 1), dynamic_smem=96)),))


@pytest.fixture
def drv(monkeypatch) -> CallbackDriver:
    """test_launch_plans' demo ops over a plain kernel of four arguments (x, num_tokens, out, num_sms), loaded on device 0
    through a CallbackDriver; torch's stream of device 0 is 0x5EA."""
    needs_the_extension()
    drv = CallbackDriver()
    kernel = LoadedKernel(PLAIN, Path('.'))

    def load(self, device):
        self._driver = drv
        fn = drv.get_function(None, 'k')
        drv.kinds[fn.value] = [arg.kind for arg in self.entry.launches[0].args]
        return [fn]

    monkeypatch.setattr(LoadedKernel, '_load', load)
    monkeypatch.setattr(_launch, '_ensure_context', lambda device: (drv.make_current(0xC0 + device), setattr(_launch._thread_state, 'device', device)))
    monkeypatch.setattr(_launch, '_current_device', lambda: 0)
    monkeypatch.setattr(_launch, '_current_stream', lambda device: 0x5EA)
    monkeypatch.setattr(plans_tests, 'KERNEL', kernel)
    _launch._thread_state.__dict__.clear()
    full_calls.clear()
    yield drv
    _launch._thread_state.__dict__.clear()


def addresses(record: tuple, values: list[int]) -> tuple:
    """A launch record with each pointer argument replaced by its position in `values` (a call's tensors' addresses;
    'elsewhere' for another address), each other argument by its bytes."""
    _, fn, grid, block, smem, stream, arguments, config, _ = record
    pointers = [int.from_bytes(b, 'little') if kind == 'ptr' else None for kind, b in arguments]
    return fn, grid, block, smem, stream, config, tuple(b if p is None else values.index(p) if p in values else 'elsewhere'
                                                        for p, (_, b) in zip(pointers, arguments))


def native_plans(op) -> list:
    return [plan.native is not None for plan in op.plans.values() if type(plan) is _plans._Plan]


def test_a_simple_plan_is_replayed_in_c_and_launches_what_the_full_call_does(drv):
    calls = []
    for _ in range(5):
        x = x_of(3)
        calls.append((x, demo(x)))
    assert full_calls['demo'] == 2 and hows(drv) == ['full', 'full', 'native', 'native', 'native']
    assert native_plans(demo) == [True]
    expected = (0xF00, (3, 1, 1), (128, 2, 1), 96, 0x5EA, None, (0, (3).to_bytes(4, 'little'), 1, (132).to_bytes(4, 'little')))
    for (x, out), record in zip(calls, drv.seen):
        assert addresses(record, [x.data_ptr(), out.data_ptr()]) == expected
        assert out.shape == (3, 2) and out.stride() == (2, 1) and out.dtype == torch.float32
    assert len({out.data_ptr() for _, out in calls}) == 5  # each call its own output


@_plans.launch_plan
def skipping(x, skip):
    """Launches a view of its argument, `skip` rows in."""
    out = torch.empty((x.shape[0] - skip, 2))
    plans_tests.KERNEL(0, {'x': x[skip:], 'out': out}, {'num_sms': 132})
    return out


@_plans.launch_plan
def listed(xs, scale):
    """Launches the first of a list of tensors."""
    out = torch.empty((xs[0].shape[0], 2))
    plans_tests.KERNEL(0, {'x': xs[0], 'out': out}, {'num_sms': 132})
    return out


@pytest.mark.parametrize('case', ['zeros', 'second argument', 'offset', 'list argument', 'zero tokens'])
def test_other_simple_plans_are_replayed_in_c(drv, case):
    for _ in range(4):
        litter = torch.full((4, 2), 7.0)  # freed memory of the output's size, for the allocator to hand out again
        del litter
        x, y = x_of(4), x_of(4)
        if case == 'zeros':
            out = demo(x, 1.0, 'zeros')
            assert torch.equal(out, torch.zeros(4, 2))
            values = [x.data_ptr(), out.data_ptr()]
        elif case == 'second argument':
            out = pair(y, x)
            values = [y.data_ptr(), out.data_ptr()]
        elif case == 'offset':  # a buffer at an offset into an argument
            out = skipping(x, 1)
            values = [x[1:].data_ptr(), out.data_ptr()]
        elif case == 'list argument':
            out = listed([y, x], (0.5, -0.0))
            values = [y.data_ptr(), out.data_ptr()]
        else:
            out = demo(x[:0])  # an empty grid: the op launches nothing
            assert out.shape == (0, 2)
            continue
        assert addresses(drv.seen[-1], values)[-1][0::2] == (0, 1)
    assert hows(drv) == ([] if case == 'zero tokens' else ['full', 'full', 'native', 'native'])
    assert native_plans({'second argument': pair, 'offset': skipping, 'list argument': listed}.get(case, demo)) == [case != 'zero tokens']


@_plans.launch_plan
def shapes(x, mode):
    """Results of every shape the C replay builds: a tuple, a list, None (an op that writes its argument), the argument."""
    out = torch.empty((x.shape[0], 2))
    plans_tests.KERNEL(0, {'x': x, 'out': out}, {'num_sms': 132})
    if mode == 'tuple':
        return out, x, None
    if mode == 'list':
        return [out, (None, x)]
    if mode == 'none':
        return None
    return x


@pytest.mark.parametrize('mode', ['tuple', 'list', 'none', 'argument'])
def test_a_simple_plan_returns_its_tensors_as_the_op_does(drv, mode):
    for _ in range(4):
        x = x_of()
        result = shapes(x, mode)
        out = torch.empty(0)
        if mode == 'tuple':
            assert type(result) is tuple and len(result) == 3 and result[1] is x and result[2] is None
            out = result[0]
        elif mode == 'list':
            assert type(result) is list and len(result) == 2 and result[1] == (None, x) and result[1][1] is x
            out = result[0]
        else:
            assert result is (None if mode == 'none' else x)
        if mode in ('tuple', 'list'):
            assert addresses(drv.seen[-1], [x.data_ptr(), out.data_ptr()])[-1][0::2] == (0, 1)
    assert hows(drv)[2:] == ['native', 'native'] and native_plans(shapes) == [True]


def layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype


@pytest.mark.parametrize('mode, view', [('transposed', ((2, 3), (1, 2), 0, torch.float32)), ('retyped', ((2, 3), (1, 2), 0, torch.int32))])
def test_a_returned_view_is_made_in_c_as_python_makes_it(drv, monkeypatch, mode, view):
    """demo returns out.T, or the int32 words of the uint8 bytes it launches, transposed (as the packed scale factors):
    the C replay makes the view from the call's allocation, as Python's replay does."""
    calls = []
    for _ in range(4):
        x = x_of()
        calls.append((x, demo(x, 1.0, mode)))
    (number, base, dtype, *rest), = next(iter(demo.plans.values())).native[2]
    assert base == 1 and number > base  # the view is made from the call's one allocation, tensor 1 after x
    assert (dtype, *rest) == ((None, torch.int32)[mode == 'retyped'], *view[:3])
    monkeypatch.setattr(_plans, '_native_replay', None)  # as without the extension: Python's replay
    x = x_of()
    calls.append((x, demo(x, 1.0, mode)))
    assert hows(drv) == ['full', 'full', 'native', 'native', 'python']
    for (x, out), record in zip(calls, drv.seen):
        storage = out.untyped_storage()
        assert layout(out) == view and storage.nbytes() == 3 * 8
        assert addresses(record, [x.data_ptr(), storage.data_ptr()])[-1][0::2] == (0, 1)  # the storage the kernel wrote
    assert len({out.untyped_storage().data_ptr() for _, out in calls}) == 5


@pytest.mark.parametrize('call, why', [
    (lambda x: demo(x, 0.5, 'fill'), 'a torch op'),
    (lambda x: demo(x, 1.0, 'torch_op'), 'a torch op'),
    (lambda x: pair(x, x), 'one tensor passed twice'),
    (lambda x: outer(x), 'a nested op (a torch op)'),
    (lambda x: tabled(x, [aligned(torch.randn(8)) for _ in range(3)]), 'an address table'),
])
def test_other_plans_replay_in_python(drv, call, why):
    for _ in range(4):
        call(x_of())
    assert hows(drv) == ['full', 'full', 'python', 'python'], why
    assert [native for op in (demo, pair, outer, tabled) for native in native_plans(op)] == [False]


@pytest.fixture
def shim(monkeypatch):
    """torch's C shim bound to the extension with a steal that counts its calls (one per replayed allocation); unbound
    again, as _plans binds it, after the test."""
    functions = _torch_shim.functions()
    if functions is None:
        pytest.fail(f'torch {torch.__version__} lacks the AOTInductor shim functions _torch_shim looks up')
    *addresses, steal = functions
    steals = Counter()

    def counting(capsule):
        steals['tensors'] += 1
        return steal(capsule)

    native.bind_shim(*addresses, counting)
    yield steals, addresses
    native.bind_shim(*functions)


@pytest.mark.parametrize('mode', ['empty', 'zeros'])
def test_a_replayed_allocation_goes_through_torchs_shim_and_has_one_owner(drv, shim, mode):
    steals, _ = shim
    outs = []
    for _ in range(5):
        litter = torch.full((4, 2), 7.0)  # freed memory of the output's size, for the allocator to hand out again
        del litter
        x = x_of(4)
        out = demo(x, 1.0, mode)
        assert addresses(drv.seen[-1], [x.data_ptr(), out.data_ptr()])[-1][0::2] == (0, 1)  # launched where it lives
        outs.append(out)
    assert hows(drv) == ['full', 'full', 'native', 'native', 'native'] and steals['tensors'] == 3
    for out in outs[2:]:
        assert type(out) is torch.Tensor and layout(out) == ((4, 2), (2, 1), 0, torch.float32)
        assert out._use_count() == 1  # the shim's handle was dropped: the caller's is the only reference
        if mode == 'zeros':
            assert torch.equal(out, torch.zeros(4, 2))
    assert len({out.data_ptr() for out in outs}) == 5


@pytest.mark.parametrize('mode, view', [('transposed', ((2, 3), (1, 2), 0, torch.float32)), ('tail', ((2, 2), (2, 1), 2, torch.float32))])
@pytest.mark.parametrize('shimmed', [True, False], ids=['shim', 'torch Python API'])
def test_a_returned_view_of_a_shim_allocation_is_made_by_the_shim(drv, shim, monkeypatch, shimmed, mode, view):
    """demo returns out.T or out[1:]: through the shim (the view's handle dropped once it is a tensor), or, where the
    shim did not allocate its base, through as_strided; either way the view Python's replay makes, over the memory the
    launch wrote, of its own."""
    steals, _ = shim
    if not shimmed:
        monkeypatch.setattr(_torch_shim, 'allocation', lambda *args: None)
    outs = []
    for _ in range(4):
        x = x_of()
        out = demo(x, 1.0, mode)
        storage = out.untyped_storage()
        assert layout(out) == view and storage.nbytes() == 3 * 8
        assert addresses(drv.seen[-1], [x.data_ptr(), storage.data_ptr()])[-1][0::2] == (0, 1)
        outs.append(out)
    assert hows(drv)[2:] == ['native', 'native'] and steals['tensors'] == (4 if shimmed else 0)
    for out in outs[2:]:
        assert out._use_count() == 1 and (out._base is None) == shimmed  # the shim's is not an autograd view
    assert len({out.untyped_storage().data_ptr() for out in outs}) == 4


def test_without_the_shim_a_replay_allocates_through_torchs_python_api(drv, shim, monkeypatch):
    steals, _ = shim
    monkeypatch.setattr(_torch_shim, 'allocation', lambda *args: None)  # as where the shim does not serve the dtype
    for _ in range(4):
        out = demo(x_of(3), 1.0, 'zeros')
        assert torch.equal(out, torch.zeros(3, 2)) and out._use_count() == 1
    assert hows(drv)[2:] == ['native', 'native'] and steals['tensors'] == 0
    assert next(iter(demo.plans.values())).native[0][0][3] is None


def test_a_failing_shim_leaves_the_allocation_to_torchs_python_api(drv, shim, monkeypatch):
    """aoti_torch_empty_strided returning an error (as on an out-of-memory device): the replay allocates through torch's
    Python API, which raises what torch raises or, here, allocates."""
    _, (_, *others) = shim
    failing = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * 7)(lambda *args: 1)
    native.bind_shim(ctypes.cast(failing, ctypes.c_void_p).value, *others, lambda capsule: pytest.fail('stole'))
    calls = []
    for _ in range(4):
        x = x_of(3)
        calls.append((x, demo(x)))
    assert hows(drv)[2:] == ['native', 'native']
    for (x, out), record in zip(calls, drv.seen):
        assert addresses(record, [x.data_ptr(), out.data_ptr()])[-1][0::2] == (0, 1) and out._use_count() == 1


@pytest.mark.parametrize('spec', [b'', b'\x00' * 39, struct.pack('=5q', 17, 6, 0, -1, 0), struct.pack('=7q', 2, 6, 0, -1, 0, 1, 1)],
                         ids=['empty', 'short', 'too many dims', 'sizes without strides'])
def test_a_malformed_allocation_spec_is_a_system_error(drv, shim, spec):
    for _ in range(2):
        demo(x_of(3))
    plan = next(iter(demo.plans.values()))
    (allocation,), *rest = plan.native
    plan.native = (((*allocation[:3], spec),), *rest)
    with pytest.raises(SystemError, match="an allocation's shim spec"):
        demo(x_of(3))


def test_the_shim_serves_a_dtype_and_device_only_once_a_tensor_made_through_it_matches(monkeypatch):
    cpu = torch.device('cpu')
    spec = _torch_shim.allocation(torch.bfloat16, cpu, (2, 3), (1, 2), True)
    assert struct.unpack('=9q', spec) == (2, *_torch_shim._codes(torch.bfloat16, cpu), 1, 2, 3, 1, 2)
    assert _torch_shim.allocation(torch.float32, cpu, (1,) * 17, (1,) * 17, False) is None  # over MAX_DIMS
    assert _torch_shim.MAX_DIMS == native.MAX_DIMS
    _torch_shim._codes.cache_clear()
    monkeypatch.setattr(_torch_shim, '_made', lambda lib, codes: torch.empty(0, dtype=torch.float64))
    assert _torch_shim.allocation(torch.float32, cpu, (2,), (1,), False) is None  # the shim's float32 code made float64
    monkeypatch.setattr(_torch_shim, '_made', lambda lib, codes: None)  # the shim's error
    _torch_shim._codes.cache_clear()
    assert _torch_shim.allocation(torch.float32, cpu, (2,), (1,), False) is None
    monkeypatch.undo()
    _torch_shim._codes.cache_clear()
    assert _torch_shim.allocation(torch.float32, cpu, (2,), (1,), False) is not None


class Subclass(torch.Tensor):
    pass


def test_python_gets_the_signature_c_made(drv, monkeypatch):
    made = Counter()
    monkeypatch.setattr(_plans, 'signature', lambda *a, signature=_plans.signature: (made.update([1]), signature(*a))[1])
    for _ in range(4):
        demo(x_of(), 0.5, 'fill')  # not simple: Python replays it with C's signature
    demo(x_of())
    demo(x_of())
    drv.make_current(0)
    demo(x_of())  # a simple plan, and no context current: Python replays it with C's signature
    assert made[1] == 0 and hows(drv) == ['full', 'full', 'python', 'python', 'full', 'full', 'python']
    demo(x_of(), scale=0.5)  # keyword arguments: keyed in C too
    assert made[1] == 0


SIGNED_CALLS = [(x, *rest) for x in [x_of(4)] for rest in [(), (3, True, 'a', None, torch.float16), (0.0,), (-0.0,), (float('inf'),),
                                                            (x[1:], x.T, x[:, ::2]), (aligned(x, 16).half(),), ([1, 2],),
                                                            ((1, (2.0, [x[1:]]), []),), ([x, x[2:]], x.T)]] + [(), (7,)]
SIGNED_KEYWORDS = [{}, {'scale': 0.5}, {'y': x_of(4).T, 'flag': True, 'mode': None}, {'n': 3, 'xs': [x_of(4)[1:], (2, x_of(4))]},
                   {'flag': True, 'n': 3}, {'n': 3, 'flag': True}]


@pytest.fixture
def exchange_unbound():
    """The extension without torch's DLPack exchange API, as on a torch before 2.10; bound again after the test."""
    native.bind_exchange(None)
    yield
    native.bind_exchange(_plans._exchange or None)


def test_without_the_exchange_api_the_signature_is_the_one_python_makes(drv, exchange_unbound):
    for args in SIGNED_CALLS:
        for kwargs in SIGNED_KEYWORDS:
            for num_sms, checks in [(None, False), (7, True)]:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setattr(config, '_num_sms', num_sms)
                    patch.setattr(_index_checks, 'enabled', checks)
                    tensors, c_tensors = [], []
                    assert native.signature(args, kwargs, num_sms, checks, c_tensors) == _plans.signature(args, kwargs, tensors)
                    assert c_tensors == tensors and all(map(operator.is_, c_tensors, tensors)), (args, kwargs)
    for unkeyed, kwargs in [((torch.nn.Parameter(x_of().float()),), {}), ((x_of(), object()), {}), ((x_of(), [1, {}]), {}),
                            (((x_of().float() * 1).as_subclass(Subclass),), {}), ((x_of(),), {'p': torch.nn.Parameter(x_of().float())}),
                            ((x_of(),), {'o': object()})]:
        tensors = []
        assert native.signature(unkeyed, kwargs, None, False, tensors) is None and tensors == []  # Python keys these, and replays them


def signed_tensors() -> list:
    """Argument tensors whose signatures differ in one thing each, and some that share one (equal metadata and address
    bits at other addresses)."""
    x = x_of(4)
    return [x, x_of(4), x[1:], x[:, 1:], x.T, x[:, ::2], x[:0], x[0], x.unsqueeze(1), x[:, :1], x.expand(2, 4, 64), x.view(torch.int16),
            aligned(x, 16), aligned(x.float()), aligned(x.float(), 64).view(torch.int32), aligned(x.half()),
            aligned(torch.ones(4, 64, dtype=torch.bool)), aligned(x.view(torch.uint8)), aligned(x.view(torch.uint8)).view(torch.int8),
            aligned(x.view(torch.uint8)).view(torch.uint4), aligned(x.view(torch.uint8)).view(torch.int4),
            aligned(x.view(torch.uint8)).view(torch.float8_e4m3fn), aligned(x.view(torch.uint8)).view(torch.float8_e5m2),
            aligned(x.view(torch.uint8)).view(torch.float8_e8m0fnu), aligned(x.view(torch.uint8)).view(torch.float4_e2m1fn_x2),
            aligned(x.view(torch.uint8)).view(torch.bits8), torch.tensor(1.5), torch.tensor(2.5), torch.tensor(1, dtype=torch.int64),
            torch.zeros(3, 5, dtype=torch.complex64), torch.empty(3, 5, device='meta'), aligned(torch.zeros([1] * 17))]


def read_through_the_api(t: torch.Tensor) -> bool:
    """Whether a signature reads `t` through torch's DLPack exchange API: not a dtype DLPack has no type for, nor a
    device other than CPU or CUDA, nor more dims than a signature's entry holds."""
    try:
        t.__dlpack__()
    except (BufferError, RuntimeError, TypeError):
        return False
    return t.device.type in ('cpu', 'cuda') and t.ndim <= native.MAX_DIMS


def test_with_the_exchange_api_two_calls_have_equal_signatures_where_python_makes_equal_ones(drv):
    if _plans._exchange is None:
        pytest.skip(f'torch {torch.__version__} has no DLPack exchange API (torch.Tensor.__dlpack_c_exchange_api__, 2.10 on)')
    tensors = signed_tensors()
    assert 0 < sum(map(read_through_the_api, tensors)) < len(tensors)
    calls = [((t, *rest), kwargs) for t in tensors for rest in [(), (3,), (t,)] for kwargs in [{}, {'y': t}]]
    calls += [(args, kwargs) for args in SIGNED_CALLS for kwargs in SIGNED_KEYWORDS]
    python, c = [], []
    for args, kwargs in calls:
        tensors, c_tensors = [], []
        python.append(_plans.signature(args, kwargs, tensors))
        c.append(native.signature(args, kwargs, None, False, c_tensors))
        assert len(c_tensors) == len(tensors) and all(map(operator.is_, c_tensors, tensors))
        assert len(key_entries(c[-1][-1])) == sum(map(read_through_the_api, tensors))
    equal_pairs = 0
    for i in range(len(calls)):
        for j in range(len(calls)):
            assert (c[i] == c[j]) == (python[i] == python[j]), (calls[i], calls[j])
            equal_pairs += i != j and c[i] == c[j]
    assert equal_pairs >= 6  # the list holds calls of equal signatures, not only different ones
    x = x_of(4)
    keys = {native.signature(args, {}, None, False, []) for args in [(x, 1), (x, True), (x, 1.0), (x, 0.0), (x, -0.0), (x, False)]}
    assert len(keys) == 6  # equal values of other types, and 0.0 and -0.0, are other signatures
    keys = {native.signature((x,), kwargs, None, False, []) for kwargs in [{'a': 1}, {'b': 1}, {'a': True}, {'a': 1, 'b': 2}, {'b': 2, 'a': 1}]}
    assert len(keys) == 5  # a keyword's name is part of it, and so is the keywords' order
    keys = [native.signature(args, {}, None, False, []) for args in [(x.dtype,), (x,), (torch.float16, x), (x, torch.float16)]]
    assert len(set(keys)) == 4  # a dtype argument and a tensor of that dtype are told apart


def test_bind_exchange_takes_only_a_version_1_api(exchange_unbound):
    api = (ctypes.c_uint64 * 8)(2)  # a DLPackExchangeAPI of version 2.0
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype, capsule.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
    with pytest.raises(ValueError, match='exchange API 2.0'):
        native.bind_exchange(capsule(ctypes.addressof(api), b'dlpack_exchange_api', None))
    with pytest.raises(ValueError, match='incorrect name'):
        native.bind_exchange(torch.Tensor.__dlpack__(x_of()))  # a capsule of another name
    x = x_of()
    assert native.signature((x,), {}, config._num_sms, _index_checks.enabled, []) == _plans.signature((x,), {}, [])  # still unbound


def test_the_sm_count_and_the_index_checks_are_part_of_the_signature(drv, monkeypatch):
    for _ in range(3):
        demo(x_of())
    monkeypatch.setattr(config, '_num_sms', 7)
    demo(x_of())
    monkeypatch.setattr(config, '_num_sms', None)
    monkeypatch.setattr(_index_checks, 'enabled', True)
    demo(x_of())
    assert full_calls['demo'] == 4 and hows(drv) == ['full', 'full', 'native', 'full', 'full']


class Allocations(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty_strided.default)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('context', [0xC1, 0], ids=['another device', 'no context'])
def test_another_context_leaves_the_call_to_python_before_anything_is_allocated(drv, context):
    for _ in range(3):
        demo(x_of())
    drv.make_current(context)
    x = x_of()
    with Allocations() as allocations:
        out = demo(x)
    assert allocations.count == 1  # Python's replay's own: the C replay allocated nothing before it left
    assert hows(drv) == ['full', 'full', 'native', 'python'] and full_calls['demo'] == 2
    assert addresses(drv.seen[-1], [x.data_ptr(), out.data_ptr()])[-1][0::2] == (0, 1)


def test_a_new_thread_replays_in_python_until_its_context_is_current(drv):
    for _ in range(3):
        demo(x_of())
    seen = []

    def work():
        for _ in range(2):
            x = x_of()
            seen.append((x, demo(x)))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert hows(drv) == ['full', 'full', 'native', 'full', 'native']  # Python's replay makes the context current first
    for (x, out), record in zip(seen, drv.seen[3:]):
        assert addresses(record, [x.data_ptr(), out.data_ptr()])[-1][0::2] == (0, 1)


def test_a_failed_launch_raises_the_drivers_error(drv):
    for _ in range(3):
        demo(x_of())
    drv.fail_with = 700
    with pytest.raises(CudaDriverError, match='CUDA_ERROR_TEST') as info:
        demo(x_of())
    assert (info.value.function, info.value.code) == ('cuLaunchKernel', 700)
    drv.fail_with = 0
    demo(x_of())
    assert hows(drv) == ['full', 'full', 'native', 'native', 'native']


ATTRIBUTES = {  # a launch's attributes, and the CUlaunchAttribute of each as cuda.h lays it out
    'pdl': ({'pdl': True}, struct.pack('<i4xi60x', _driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1)),
    'cluster': ({'cluster_dims': (2, 1, 1)}, struct.pack('<i4x3I52x', _driver.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, 2, 1, 1)),
    'cooperative': ({'cooperative': True}, struct.pack('<i4xi60x', _driver.CU_LAUNCH_ATTRIBUTE_COOPERATIVE, 1)),
}


def attributed(*names: str) -> LoadedKernel:
    """PLAIN's kernel with the launch attributes `names`, 8 blocks of it resident at once."""
    fields = {k: v for name in names for k, v in ATTRIBUTES[name][0].items()}
    kernel = LoadedKernel(dataclasses.replace(PLAIN, launches=(dataclasses.replace(PLAIN.launches[0], **fields),)), Path('.'))
    kernel._resident_blocks[(0, 'k')] = 8
    return kernel


@pytest.mark.parametrize('names', [('pdl',), ('cluster',), ('cooperative',), ('cooperative', 'cluster', 'pdl')])
def test_a_launch_with_attributes_is_replayed_in_c_through_cuLaunchKernelEx(drv, monkeypatch, names):
    """The C replay's CUlaunchConfig and CUlaunchAttribute array, read as cuda.h lays them out, hold what _launch_one's
    ctypes ones hold: grid, block, shared bytes, stream, and each attribute's id and value."""
    monkeypatch.setattr(plans_tests, 'KERNEL', attributed(*names))
    calls = []
    for _ in range(4):
        x = x_of()
        calls.append([x.data_ptr(), demo(x).data_ptr()])
    assert hows(drv) == ['full', 'full', 'native', 'native'] and native_plans(demo) == [True]
    config = ((3, 1, 1, 128, 2, 1, 96, 0x5EA, len(names)), b''.join(ATTRIBUTES[name][1] for name in names))
    expected = (0xF00, (3, 1, 1), (128, 2, 1), 96, 0x5EA, config, (0, (3).to_bytes(4, 'little'), 1, (132).to_bytes(4, 'little')))
    assert [addresses(record, values) for record, values in zip(drv.seen, calls)] == [expected] * 4
    drv.fail_with = 700
    with pytest.raises(CudaDriverError, match='CUDA_ERROR_TEST') as info:
        demo(x_of())
    assert (info.value.function, info.value.code) == ('cuLaunchKernelEx', 700)


def test_a_cooperative_grid_that_does_not_fit_has_no_native_steps(drv, monkeypatch):
    kernel = attributed('cooperative')
    monkeypatch.setattr(plans_tests, 'KERNEL', kernel)
    demo(x_of(8))  # loads the kernel
    env = {'num_tokens': 8, 'row_stride': 64, 'num_sms': 132}
    assert len(kernel.native_steps(0, (('x', 0, 0), ('out', 1, 0)), env)) == 1
    assert kernel.native_steps(0, (('x', 0, 0), ('out', 1, 0)), {**env, 'num_tokens': 9}) is None  # _launch_one raises


def test_threads_replay_in_c_each_with_its_own_tensors(drv):
    for _ in range(3):
        demo(x_of())
    drv.seen.clear()
    mismatches = []

    def work():
        drv.make_current(0xC0)
        for _ in range(50):
            x = x_of()
            out = demo(x)
            mine = [record for record in drv.seen if record[-1] == threading.get_ident()][-1]
            if out.shape != (3, 2) or addresses(mine, [x.data_ptr(), out.data_ptr()])[-1][0::2] != (0, 1):
                mismatches.append(mine)

    in_threads(work, 8)
    assert not mismatches and hows(drv) == ['native'] * 400


class Spy:
    """Stands in for the C replay and counts its calls, noting any made while a call was being recorded."""

    def __init__(self, replay) -> None:
        self.replay, self.calls, self.while_recording = replay, 0, 0

    def __call__(self, *args):
        self.calls += 1
        self.while_recording += _launch.recording.__dict__.get('active') is not None
        return self.replay(*args)


@pytest.fixture
def spy(drv, monkeypatch) -> Spy:
    spy = Spy(_plans._native_replay)
    monkeypatch.setattr(_plans, '_native_replay', spy)
    return spy


def test_a_call_with_keyword_arguments_is_replayed_in_c(drv, spy):
    calls = []
    for _ in range(4):
        x = x_of(3)
        calls.append((x, demo(x, mode='empty', scale=1.0)))
    assert spy.calls == 4 and hows(drv) == ['full', 'full', 'native', 'native']
    for _ in range(4):  # the same arguments, other keywords: another signature
        x = x_of(3)
        calls.append((x, demo(x, 1.0, mode='empty')))
    assert hows(drv)[4:] == ['full', 'full', 'native', 'native'] and native_plans(demo) == [True, True]
    expected = (0xF00, (3, 1, 1), (128, 2, 1), 96, 0x5EA, None, (0, (3).to_bytes(4, 'little'), 1, (132).to_bytes(4, 'little')))
    for (x, out), record in zip(calls, drv.seen):
        assert addresses(record, [x.data_ptr(), out.data_ptr()]) == expected


def test_a_keyword_tensor_is_launched_where_the_op_launches_it(drv):
    calls = []
    for _ in range(4):
        x, out = x_of(3), aligned(torch.empty(3, 2))
        assert demo(x, out=out) is out
        calls.append((x, out))
    assert hows(drv) == ['full', 'full', 'native', 'native']
    for (x, out), record in zip(calls, drv.seen):
        assert addresses(record, [x.data_ptr(), out.data_ptr()])[-1][0::2] == (0, 1)


def test_under_torch_compile_the_op_runs_as_it_is(drv, spy, monkeypatch):
    for _ in range(3):
        demo(x_of())
    monkeypatch.setattr(_plans, 'is_compiling', lambda: True)
    demo(x_of())
    assert spy.calls == 3 and full_calls['demo'] == 3 and hows(drv) == ['full', 'full', 'native', 'full']


def test_a_recorded_call_never_reaches_the_c_replay(drv, spy):
    for _ in range(4):
        outer(x_of())  # demo runs inside outer's first two calls, the second recorded
    assert spy.while_recording == 0 and spy.calls == 4 + 1  # outer's four, and demo's inside outer's first call


def test_plans_turned_off_or_forgotten_are_not_replayed_in_c(drv, spy, monkeypatch):
    for _ in range(3):
        demo(x_of())
    monkeypatch.setattr(_plans, 'enabled', True)
    _plans.enable(False)
    demo(x_of())
    assert spy.calls == 3 and full_calls['demo'] == 3  # off, the call does not reach C
    _plans.enable(True)
    demo(x_of())
    assert full_calls['demo'] == 3 and hows(drv)[-1] == 'native'
    _select.reset()  # forgets the plans (_plans.clear)
    demo(x_of())
    assert full_calls['demo'] == 4 and hows(drv)[-1] == 'full'


def test_an_evicted_signature_is_not_replayed_in_c(drv, monkeypatch):
    monkeypatch.setattr(_plans, 'MAX_PLANS', 2)
    for _ in range(3):
        demo(x_of(1))
    for tokens in (2, 2, 3, 3):  # two plans more: the first goes
        demo(x_of(tokens))
    assert [first_rows(key) for key in demo.plans] == [2, 3]
    before = full_calls['demo']
    demo(x_of(1))
    assert full_calls['demo'] == before + 1 and hows(drv)[-1] == 'full'


@pytest.mark.parametrize('env, blocked', [({_driver.NATIVE_ENV: '0'}, False), ({}, True)], ids=['NATIVE_LAUNCH=0', 'pure-Python wheel'])
def test_without_the_extension_plans_replay_in_python(env, blocked):
    result = subprocess.run([sys.executable, '-c', textwrap.dedent(f'''
        import sys
        if {blocked}:
            sys.modules['tile_kernels_aot._driver_native'] = None  # as the pure-Python wheel, which lacks it
        from tile_kernels_aot import _driver, _plans
        print(_plans._native_replay, _driver.native_extension())
    ''')], capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['None', 'None']


@pytest.mark.parametrize('value, bound', [('0', False), ('1', True), ('', True)])
def test_torch_shim_switch_chooses_how_the_c_replay_allocates(value, bound):
    result = subprocess.run([sys.executable, '-c', textwrap.dedent('''
        import torch
        from tile_kernels_aot import _plans, _torch_shim
        print(bool(_plans._shim), _torch_shim.functions() is not None)
    ''')], capture_output=True, text=True, check=False, env={**os.environ, _torch_shim.SHIM_ENV: value})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(bound)] * 2


@pytest.fixture
def thread_state():
    _launch._thread_state.__dict__.clear()
    yield
    _launch._thread_state.__dict__.clear()


def test_the_drivers_own_functions_replay_a_plan(monkeypatch, tmp_path, thread_state):
    """Driver.replay_functions are libcuda's: over the stand-in libcuda, a replay reaches its cuLaunchKernel, and the
    stand-in's failure (grid x = 7) raises the driver's named error through Driver.check."""
    needs_the_extension()
    stub = stub_driver.build(tmp_path)
    if stub is None:
        pytest.skip('no C compiler')
    drv = _driver.Driver(stub)
    kernel = LoadedKernel(PLAIN, Path('.'))
    monkeypatch.setattr(LoadedKernel, '_load', lambda self, device: (setattr(self, '_driver', drv), [ctypes.c_void_p(0xF00)])[1])
    monkeypatch.setattr(_launch, '_ensure_context', lambda device: setattr(_launch._thread_state, 'device', device))
    monkeypatch.setattr(_launch, '_current_device', lambda: 0)
    monkeypatch.setattr(_launch, '_current_stream', lambda device: 0x5EA)
    monkeypatch.setattr(plans_tests, 'KERNEL', kernel)
    launches = Counter()
    monkeypatch.setattr(drv, 'launch', lambda *a: launches.update(['full']))  # the checked calls launch nothing
    for tokens in (3, 3, 7, 7):
        demo(x_of(tokens))
    assert launches['full'] == 4 and native_plans(demo) == [True, True]
    demo(x_of(3))
    assert [stub.seen_argument(i) for i in (0, 1, 2, 3, 4, 5, 6, 7, 8, 10)] == [0xF00, 3, 1, 1, 128, 2, 1, 96, 0x5EA, 0]
    with pytest.raises(CudaDriverError, match='CUDA_ERROR_STUB') as info:
        demo(x_of(7))
    assert info.value.function == 'cuLaunchKernel' and launches['full'] == 4


def test_the_drivers_own_cuLaunchKernelEx_replays_a_launch_with_attributes(monkeypatch, tmp_path, thread_state):
    """Over the stand-in libcuda, the C replay's cuLaunchKernelEx gets the CUlaunchConfig and attributes that the checked
    call's, through ctypes, gets; the stand-in's failure (grid x = 7) raises the driver's named error."""
    needs_the_extension()
    stub = stub_driver.build(tmp_path)
    if stub is None:
        pytest.skip('no C compiler')
    drv = _driver.Driver(stub)
    kernel = attributed('cooperative', 'cluster', 'pdl')
    monkeypatch.setattr(LoadedKernel, '_load', lambda self, device: (setattr(self, '_driver', drv), [ctypes.c_void_p(0xF00)])[1])
    monkeypatch.setattr(_launch, '_ensure_context', lambda device: setattr(_launch._thread_state, 'device', device))
    monkeypatch.setattr(_launch, '_current_device', lambda: 0)
    monkeypatch.setattr(_launch, '_current_stream', lambda device: 0x5EA)
    monkeypatch.setattr(plans_tests, 'KERNEL', kernel)
    seen = []
    for _ in range(3):
        demo(x_of(3))
        fields, _ = launch_config(stub.seen_config())  # the stand-in copied the attributes the pointer points to
        seen.append(((fields, ctypes.string_at(stub.seen_attributes(), 72 * fields[-1])), stub.seen_argument(0), stub.seen_argument(10)))
    assert native_plans(demo) == [True]
    config = ((3, 1, 1, 128, 2, 1, 96, 0x5EA, 3), b''.join(ATTRIBUTES[name][1] for name in ('cooperative', 'cluster', 'pdl')))
    assert seen == [(config, 0xF00, 0)] * 3  # two checked calls through ctypes, then the C replay
    with monkeypatch.context() as patch:
        patch.setattr(drv, '_cuLaunchKernelEx', lambda *a: 0)  # the checked calls of grid x = 7 launch nothing
        demo(x_of(7))
        demo(x_of(7))
    with pytest.raises(CudaDriverError, match='CUDA_ERROR_STUB') as info:
        demo(x_of(7))
    assert info.value.function == 'cuLaunchKernelEx' and native_plans(demo) == [True, True]


# -- the real ops over a build ------------------------------------------------------------------------------------

CAST = {'in_dtype': 'bfloat16', 'per_row': False, 'aligned': True, 'vec_bytes': 32}
SPECS = [{'kernel': 'moe.topk_gate', 'params': {'num_experts': 256, 'num_topk': 8}},
         {'kernel': 'moe.normalize_weight', 'params': {'dtype': 'float32'}},
         {'kernel': 'moe.group_count', 'params': {'index_dtype': 'int64'}},  # launched with PDL
         {'kernel': 'moe.aux_fi', 'params': {'index_dtype': 'int64'}},  # launched with PDL
         *({'kernel': 'quant.per_token_cast', 'params': {**CAST, 'fmt': fmt, 'sf_format': sf}}  # returning views
           for fmt, sf in [('e4m3', 'ue8m0'), ('e2m1', 'ue8m0'), ('e4m3', 'f32')]),
         {'kernel': 'mhc.head_compute_mix_bwd', 'params': {'mhc': 4}}]  # two launches


@pytest.fixture(scope='module')
def specs_build(tmp_path_factory) -> Path:
    """sm_90a binaries of SPECS (tilelang + nvcc, no GPU)."""
    pytest.importorskip('tilelang')
    from kernel_src.decl import ARCHS

    root = tmp_path_factory.mktemp('specs')
    specs = root / 'chosen.json'  # build_subset writes its own specs.json
    specs.write_text(json.dumps(SPECS))
    build_subset(root, archs=tuple(a for a in ARCHS if a.target == 'sm_90a'), specs_file=specs, wheels=False)
    return root / 'build' / 'sm_90a'


@pytest.fixture
def real_drv(drv, specs_build, monkeypatch):
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(specs_build))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
    def load(self, device):  # the real load, over the CallbackDriver, which learns the kernel's argument kinds
        functions = REAL_LOAD(self, device)
        for function, launch in zip(functions, self.entry.launches):
            drv.kinds[function.value] = [arg.kind for arg in launch.args]
        return functions

    monkeypatch.setattr(LoadedKernel, '_load', load)
    monkeypatch.setattr(_driver, 'driver', lambda: drv)
    _select.reset()
    yield drv
    _select.reset()


@pytest.mark.parametrize('op', ['topk_gate', 'normalize_weight'])
def test_real_ops_replay_in_c_what_their_checked_calls_launch(real_drv, op):
    drv = real_drv
    calls = []
    for _ in range(5):
        if op == 'topk_gate':
            x = aligned(torch.randn(5, 256))
            result = moe.topk_gate(x, 8)
            tensors = [x, result]
        else:
            x = aligned(torch.rand(5, 8))
            result = moe.normalize_weight(x)
            tensors = [x, *result]
        calls.append([t.data_ptr() for t in tensors])
    fn = getattr(moe, op)
    assert hows(drv) == ['full', 'full', 'native', 'native', 'native'] and native_plans(fn) == [True]
    full = addresses(drv.seen[0], calls[0])
    assert all(addresses(record, values) == full for record, values in zip(drv.seen, calls))


def index_of(tokens: int) -> torch.Tensor:
    return aligned(torch.randint(-1, 64, (tokens, 8)))


def bf16_of(tokens: int) -> torch.Tensor:
    return aligned(torch.randn(tokens, 256).bfloat16())


PACKED = {'use_tma_aligned_col_major_sf': True, 'round_sf': True, 'use_packed_ue8m0': True}
REAL_OPS = {  # op, its positional arguments for a number of tokens, its keyword arguments
    'group_count': (moe.group_count, lambda tokens: (index_of(tokens), 64), {}),
    'aux_fi': (moe.aux_fi, lambda tokens: (index_of(tokens).clamp_(min=0), 64, 8), {}),
    'per_token_cast-e4m3-packed': (quant.per_token_cast, lambda tokens: (bf16_of(tokens), 'e4m3', 32, None, True, True, True), {}),
    'per_token_cast-e2m1-packed': (quant.per_token_cast, lambda tokens: (bf16_of(tokens), 'e2m1', 32, None, True, True, True), {}),
    'per_token_cast-col-major': (quant.per_token_cast, lambda tokens: (bf16_of(tokens), 'e4m3', 128, None, True), {}),
    'per_token_cast-keywords': (quant.per_token_cast, lambda tokens: (bf16_of(tokens), 'e4m3', 32), PACKED),
    'mhc_head_compute_mix_bwd': (mhc.mhc_head_compute_mix_bwd, lambda tokens: (
        aligned(torch.rand(tokens, 2, 4)), aligned(torch.rand(tokens, 2, 4)), aligned(torch.rand(1)), aligned(torch.randn(4))), {}),
}


@pytest.mark.parametrize('case, tokens', [('group_count', 5), ('group_count', 1000), ('aux_fi', 5), ('aux_fi', 1000),
                                          ('per_token_cast-e4m3-packed', 5), ('per_token_cast-e2m1-packed', 5),
                                          ('per_token_cast-col-major', 5), ('per_token_cast-keywords', 5),
                                          ('mhc_head_compute_mix_bwd', 5)])
def test_real_ops_with_launch_attributes_or_returned_views_replay_in_c(real_drv, monkeypatch, case, tokens):
    """group_count and aux_fi launch with PDL (one block writes its outputs, several add to zeroed ones); per_token_cast
    returns views of what it allocates (packed UE8M0 words over the int32 words it allocates, column-major float32), and
    is called with keyword arguments too; mhc_head_compute_mix_bwd's kernel is two launches. Their C replays launch
    what their checked calls launch, through cuLaunchKernelEx with the same config and attributes where the checked
    call uses it, and return tensors laid out as Python's replay and the full call lay them out, over the storage the
    kernel wrote."""
    drv = real_drv
    monkeypatch.setattr(config, '_num_sms', 132)
    op, make, keywords = REAL_OPS[case]
    launches = 2 if case == 'mhc_head_compute_mix_bwd' else 1
    calls = []
    for i in range(5):
        if i == 4:
            monkeypatch.setattr(_plans, '_native_replay', None)  # as without the extension: Python's replay
        args = make(tokens)
        result = op(*args, **keywords)
        outputs = list(result) if isinstance(result, tuple) else [result]
        values = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)] + [t.untyped_storage().data_ptr() for t in outputs]
        calls.append((values, [layout(t) for t in outputs]))
    last = 'python' if launches == 1 and case not in ('group_count', 'aux_fi') else 'full'  # Python's replay of these: Driver.launch
    assert hows(drv) == [how for how in ['full', 'full', 'native', 'native', last] for _ in range(launches)]
    assert native_plans(op) == [True]
    assert all(layouts == calls[0][1] for _, layouts in calls)
    full = [addresses(record, calls[0][0]) for record in drv.seen[:launches]]
    assert [addresses(record, calls[i // launches][0]) for i, record in enumerate(drv.seen)] == full * 5
    full = full[0]
    assert (full[5] is not None) == (case in ('group_count', 'aux_fi'))  # a CUlaunchConfig: cuLaunchKernelEx
    if full[5] is not None:
        assert full[5][1] == ATTRIBUTES['pdl'][1]


def test_a_dispatch_mode_sees_what_a_replayed_call_allocates(drv):
    for _ in range(3):
        demo(x_of())
    with Allocations() as allocations:
        out = demo(x_of())
    assert allocations.count == 1 and out.shape == (x_of().shape[0], 2)  # C's shim would allocate past the mode
    assert hows(drv) == ['full', 'full', 'native', 'python'] and full_calls['demo'] == 2
