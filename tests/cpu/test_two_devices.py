"""The loader's per-device logic with two fake devices and a faked driver (no GPU): a call on the other device than the
current one loads and launches in that device's context and switches back, first calls from threads on both devices at
once load each binary once per device with each device's functions from its own module, and preload(device=0) leaves
device 1 alone. tests/gpu/test_two_gpus.py runs the same on two real GPUs."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

import tile_kernels_aot
from tests.fixtures.threads import run_in_threads
from tile_kernels_aot import _driver, _launch, _preload, _select
from tile_kernels_aot._launch import LoadedKernel

from .test_runtime import ENTRY
from .test_select import fake_device  # noqa: F401  (a fixture)


class FakeDriver:
    """The driver calls the loader makes, against two fake devices. Each thread has a current device (torch's current
    device and the driver's current context are one here, as torch's set_device makes the primary context current)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = threading.local()
        self._handles = itertools.count(1)
        self.loads: list[int] = []  # the current device of each cuModuleLoadData
        self.module_device: dict[int, int] = {}
        self.function_module: dict[int, int] = {}
        self.launches: list[tuple[int, int | None, int]] = []  # (function, current device, stream)
        self.contexts: set[int] = set()  # devices whose context some thread made current

    def current_context_device(self) -> int | None:
        return getattr(self._state, 'device', None)

    def make_current(self, device: int) -> None:
        self._state.device = device
        with self._lock:
            self.contexts.add(device)

    def load_module(self, image: bytes):
        device = self.current_context_device()
        assert device is not None, 'a module load with no current context'
        time.sleep(0.005)  # a slow load: other threads arrive meanwhile
        handle = ctypes.c_void_p(next(self._handles))
        with self._lock:
            self.loads.append(device)
            self.module_device[handle.value] = device
        return handle

    def get_function(self, module, symbol: str):
        handle = ctypes.c_void_p(next(self._handles))
        with self._lock:
            self.function_module[handle.value] = module.value
        return handle

    def device_attribute(self, attribute: int, device: int) -> int:
        return {_driver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: 132}.get(attribute, 1 << 20)

    def set_function_attribute(self, fn, attribute: int, value: int) -> None:
        pass

    def max_active_blocks(self, fn, block_size: int, dynamic_smem: int) -> int:
        return 2

    def launch(self, fn, grid, block, smem, stream, params) -> None:
        with self._lock:
            self.launches.append((fn.value, self.current_context_device(), stream))

    def function_device(self, fn: int) -> int:
        return self.module_device[self.function_module[fn]]


@pytest.fixture
def fake(monkeypatch):
    """Two fake devices: the driver, torch's set_device / device() / current device and stream go to a FakeDriver."""
    drv = FakeDriver()
    monkeypatch.setattr(_driver, 'driver', lambda: drv)
    monkeypatch.setattr(torch.cuda, 'set_device', drv.make_current)

    @contextlib.contextmanager
    def device(index):
        previous = drv.current_context_device()
        drv.make_current(index)
        try:
            yield
        finally:
            drv._state.device = previous

    monkeypatch.setattr(torch.cuda, 'device', device)
    monkeypatch.setattr(_launch, '_current_device', lambda: drv.current_context_device() or 0)  # torch says 0 until set
    monkeypatch.setattr(_launch, '_current_stream', lambda index: 1000 + index)
    monkeypatch.setattr(LoadedKernel, 'image', lambda self: b'a cubin')
    _launch._thread_state.__dict__.clear()
    yield drv
    _launch._thread_state.__dict__.clear()


def call(kernel: LoadedKernel, device: int) -> None:
    x, out = torch.zeros((8, 64), dtype=torch.bfloat16), torch.zeros((8, 2), dtype=torch.float32)
    kernel(device, {'x': x, 'out': out}, {'num_sms': 1})


def test_a_call_runs_in_its_devices_context_whatever_is_current(fake):
    kernel = LoadedKernel(ENTRY, root=Path('unused'))
    for current, target in ((0, 1), (1, 0), (0, 1)):
        fake.make_current(current)
        call(kernel, target)
        assert fake.current_context_device() == current  # switched back
        fn, context, stream = fake.launches[-1]
        assert (fake.function_device(fn), context, stream) == (target, target, 1000 + target)
    assert sorted(fake.loads) == [0, 1]  # the third call found device 1's functions loaded


def test_first_calls_from_threads_on_both_devices(fake):
    kernels = [LoadedKernel(ENTRY, root=Path('unused')) for _ in range(3)]
    barrier = threading.Barrier(16)

    def work(i: int) -> None:
        device = i % 2
        if i // 2 % 2:
            fake.make_current(1 - device)  # the other device current; the rest of the threads have none yet
        barrier.wait()
        for kernel in kernels:
            call(kernel, device)

    run_in_threads(work)
    assert Counter(fake.loads) == {0: 3, 1: 3}  # each binary once per device
    for kernel in kernels:
        assert sorted(kernel._functions) == [0, 1]
        for device, fns in kernel._functions.items():
            assert [fake.function_device(f.value) for f in fns] == [device]
    assert len(fake.launches) == 16 * 3
    assert all(fake.function_device(fn) == context and stream == 1000 + context for fn, context, stream in fake.launches)


def test_preload_of_one_device_leaves_the_other_alone(fake, fake_device, monkeypatch):  # noqa: F811
    fake_device[0] = fake_device[1] = ('NVIDIA H200', (9, 0))
    monkeypatch.setattr(_preload, '_on_device', torch.cuda.device)  # the fake one
    monkeypatch.setattr(_preload, '_visible_devices', lambda: 2)
    loaded = tile_kernels_aot.preload(device=0)
    assert len(loaded) == 3 and fake.loads == [0, 0, 0]
    assert fake.contexts == {0}  # device 1's context never made current
    gate = _select.find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, 0)  # the binary preload loaded
    assert sorted(gate._functions) == [0]
    assert tile_kernels_aot.preload(device=1) == loaded
    assert Counter(fake.loads) == {0: 3, 1: 3} and fake.contexts == {0, 1}
    assert sorted(gate._functions) == [0, 1]
