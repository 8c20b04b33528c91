"""Per-device loading on two GPUs: ops on the device of their tensors whatever the current device is, first calls from
threads on both devices at once (one module load per binary per device, each device's functions from its own module),
a CUDA graph captured and replayed on the second device, and preload(device=0) leaving device 1 alone.

The first-call and preload tests run in a fresh interpreter, so that no earlier test has loaded a binary; they count
the driver's module loads by wrapping _driver.Driver.load_module. tests/cpu/test_two_devices.py runs the same loader
logic against a faked driver with two fake devices."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .helpers import assert_bitwise_equal, sample_inputs, sample_ops as ops, sample_references as references

pytestmark = [pytest.mark.gpu, pytest.mark.two_gpus]

ROOT = Path(__file__).resolve().parent.parent.parent


def inputs_on(device: int, num_tokens: int) -> tuple[torch.Tensor, ...]:
    return sample_inputs(num_tokens, device)


# Wrap the loader and the driver so that every module load is recorded with the device whose context was current, and
# every function handle with the module it came from.
COUNTING = r'''
import threading
from collections import Counter

from tile_kernels_aot import _driver, _launch

_lock = threading.Lock()
_state = threading.local()
loads = []  # (binary, device asked for, device whose context was current at cuModuleLoadData)
module_device = {}  # module handle -> device of its context
function_module = {}  # function handle -> module handle
kernels = set()  # the LoadedKernel objects that loaded
_real_load_module, _real_get_function, _real_load = _driver.Driver.load_module, _driver.Driver.get_function, _launch.LoadedKernel._load


def _load(self, device):
    _state.kernel = (f'{self.entry.kernel}[{self.entry.key}]', device)
    with _lock:
        kernels.add(self)
    return _real_load(self, device)


def _load_module(self, image):
    module = _real_load_module(self, image)
    current = self.current_context_device()
    with _lock:
        loads.append((*_state.kernel, current))
        module_device[module.value] = current
    return module


def _get_function(self, module, symbol):
    fn = _real_get_function(self, module, symbol)
    with _lock:
        function_module[fn.value] = module.value
    return fn


_launch.LoadedKernel._load = _load
_driver.Driver.load_module = _load_module
_driver.Driver.get_function = _get_function


def check_loads():
    """One load per binary per device, in that device's context, and every device's functions from its own modules."""
    assert loads, 'nothing loaded'
    assert all(asked == current for _, asked, current in loads), [x for x in loads if x[1] != x[2]]
    repeated = {k: n for k, n in Counter((name, asked) for name, asked, _ in loads).items() if n > 1}
    assert not repeated, f'loaded more than once: {repeated}'
    for kernel in kernels:
        for device, fns in kernel._functions.items():
            assert all(module_device[function_module[f.value]] == device for f in fns), (kernel.entry.kernel, device)
    return {device: sorted(name for name, asked, _ in loads if asked == device) for device in sorted({x[1] for x in loads})}
'''


@pytest.fixture
def restore_device():
    yield
    torch.cuda.set_device(0)


@pytest.mark.parametrize('current, target', [(0, 1), (1, 0)])
def test_ops_on_the_device_of_their_tensors(restore_device, current, target):
    inputs = inputs_on(target, 512)
    torch.cuda.set_device(current)
    outputs = ops(*inputs)
    assert torch.cuda.current_device() == current  # the op switched to the tensors' device and back
    torch.cuda.synchronize(target)
    for out, ref in zip(outputs, references(*inputs)):
        assert out.device.index == target
        assert_bitwise_equal(out, ref)


def test_cuda_graph_capture_and_replay_on_the_second_device(restore_device):
    torch.cuda.set_device(0)
    with torch.cuda.device(1):
        static = inputs_on(1, 4096)
        ops(*static)  # the first calls load on device 1, before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = ops(*static)
    for _ in range(3):
        new = inputs_on(1, 4096)
        for s, n in zip(static, new):
            s.copy_(n)
        with torch.cuda.device(1):
            graph.replay()
        torch.cuda.synchronize(1)
        for out, ref in zip(outputs, references(*new)):
            assert out.device.index == 1
            assert_bitwise_equal(out, ref)


THREADS = COUNTING + r'''
import json

import torch

from tests.fixtures.threads import run_in_threads
from tests.gpu.helpers import assert_bitwise_equal
from tests.gpu.test_two_gpus import inputs_on, ops, references

inputs = {device: inputs_on(device, 1024) for device in (0, 1)}  # made here: the threads' calls are the ops' first
for device in (0, 1):
    torch.cuda.synchronize(device)
threads_per_device = 4
barrier = threading.Barrier(2 * threads_per_device)
results = {}


def work(i):
    device = i % 2
    if i // 2 % 2:  # half the threads of each device have the other device current; the rest never set one
        torch.cuda.set_device(1 - device)
    barrier.wait()
    results[i] = (device, ops(*inputs[device]))
    torch.cuda.synchronize(device)


run_in_threads(work, 2 * threads_per_device)
per_device = check_loads()
assert sorted(per_device) == [0, 1] and per_device[0] == per_device[1], per_device
for device, outputs in results.values():
    for out, ref in zip(outputs, references(*inputs[device])):
        assert out.device.index == device
        assert_bitwise_equal(out, ref)
print(json.dumps({'ok': True, 'binaries_per_device': len(per_device[0]), 'threads': len(results)}))
'''


PRELOAD = COUNTING + r'''
import ctypes
import json

import torch

import tile_kernels_aot
from tests.gpu.helpers import assert_bitwise_equal
from tests.gpu.test_two_gpus import inputs_on, ops, references


def primary_context_active(device):
    lib = ctypes.CDLL('libcuda.so.1')
    handle, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    assert lib.cuDeviceGet(ctypes.byref(handle), device) == 0
    assert lib.cuDevicePrimaryCtxGetState(handle, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)


names = ['moe.topk_gate', 'moe.group_count', 'quant.per_token_cast', 'quant.cast_back', 'transpose.*']
loaded = tile_kernels_aot.preload(device=0, kernels=names)
assert loaded and len(loads) == len(loaded), (loaded, loads)
assert {asked for _, asked, _ in loads} == {0}, loads
assert not primary_context_active(1), 'preload(device=0) made a context on device 1'
assert all(set(k._functions) == {0} for k in kernels)

assert tile_kernels_aot.preload(device=1, kernels=names) == loaded
per_device = check_loads()
assert per_device[0] == per_device[1] and len(per_device[1]) == len(loaded)
before = len(loads)
with torch.cuda.device(1):  # the first calls on device 1 are in the capture: preload must have done their loading
    static = inputs_on(1, 4096)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = ops(*static)
new = inputs_on(1, 4096)
for s, n in zip(static, new):
    s.copy_(n)
with torch.cuda.device(1):
    graph.replay()
torch.cuda.synchronize(1)
for out, ref in zip(outputs, references(*new)):
    assert_bitwise_equal(out, ref)
assert len(loads) == before, loads[before:]
print(json.dumps({'ok': True, 'preloaded': len(loaded)}))
'''


@pytest.mark.parametrize('script', [THREADS, PRELOAD], ids=['first-calls-from-threads', 'preload-one-device'])
def test_in_a_fresh_interpreter(script):
    result = subprocess.run([sys.executable, '-c', script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])['ok']
