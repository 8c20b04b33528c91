"""Soak and concurrency on the GPU.

* Mixed calls in one process (topk_gate, group_count, aux_fi, normalize_weight, transpose, per_token_cast at several
  token counts, 0 included) leave no growth of host memory (RSS), of torch's allocated GPU memory, of the driver's
  free memory, or of the loaded modules and functions. 5,000 calls by default; TILE_KERNELS_AOT_SOAK=1 runs 100,000.
* 16 threads make their first calls of 4 ops at once (spread over the visible GPUs): each kernel's module is loaded
  exactly once per device (counted by wrapping the driver's load_module), and every result equals the reference.
* 4 streams at once give the results the same calls give one after another on one stream.
* After each of the package's error types (tile_kernels_aot.errors) is raised and caught, the ops still give the
  reference results.
The CPU versions of the loader's part (faked driver) are in tests/cpu/test_loader_concurrency.py.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch

import tile_kernels_aot
from tests.fixtures.threads import run_in_threads
from tile_kernels_aot import _driver, _select, errors, reference, targets

from .helpers import assert_bitwise_equal

pytestmark = pytest.mark.gpu

SOAK_ENV = 'TILE_KERNELS_AOT_SOAK'
SOAK_CALLS = 100_000 if os.environ.get(SOAK_ENV) == '1' else 5_000
MiB = 1 << 20


def rss_bytes() -> int:
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


def loaded_functions() -> int:
    """Functions the loader holds, over every kernel found so far and every device."""
    return sum(len(fns) for kernel in set(_select._found.values()) for fns in kernel._functions.values())


class ModuleLoads:
    """Wraps the driver's load_module: counts loads per (image sha256, device of the current context)."""

    def __init__(self, monkeypatch) -> None:
        self.counts: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        original = _driver.Driver.load_module

        def counted(drv, image):
            module = original(drv, image)
            key = (hashlib.sha256(image).hexdigest()[:16], drv.current_context_device())
            with self._lock:
                self.counts[key] = self.counts.get(key, 0) + 1
            return module

        monkeypatch.setattr(_driver.Driver, 'load_module', counted)

    def total(self) -> int:
        return sum(self.counts.values())


@pytest.fixture
def module_loads(monkeypatch):
    return ModuleLoads(monkeypatch)


# --- the mixed calls ------------------------------------------------------------------------------------------------------

TOKEN_COUNTS = (0, 1, 64, 1000)


def make_inputs(device='cuda', seed=0):
    gen = torch.Generator(device='cpu').manual_seed(seed)
    sets = []
    for t in TOKEN_COUNTS:
        scores = torch.randn(t, 256, generator=gen).to(device)
        idx = torch.randint(-1, 256, (t, 8), generator=gen).to(device)
        weights = torch.rand(t, 8, generator=gen).to(device)
        x_t = torch.randn(max(t // 64, 1) * 64, 256, generator=gen).bfloat16().to(device)
        x_q = torch.randn(t, 7168, generator=gen).bfloat16().to(device)
        sets.append((scores, idx, weights, x_t, x_q))
    return sets


def mixed_call(i: int, inputs) -> tuple:
    """Call number i of the soak: the op and the token count cycle with different periods."""
    scores, idx, weights, x_t, x_q = inputs[i % len(inputs)]
    op = i % 6
    if op == 0:
        return (tile_kernels_aot.moe.topk_gate(scores, 8),)
    if op == 1:
        return (tile_kernels_aot.moe.group_count(idx, 256),)
    if op == 2:
        return (tile_kernels_aot.moe.aux_fi(idx, 256, 8),)
    if op == 3:
        return tile_kernels_aot.moe.normalize_weight(weights)
    if op == 4:
        return (tile_kernels_aot.transpose.transpose(x_t),)
    return tuple(tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128))


def mixed_reference(i: int, inputs) -> tuple:
    scores, idx, weights, x_t, x_q = inputs[i % len(inputs)]
    op = i % 6
    if op == 0:
        return (reference.stable_topk(scores, 8),)
    if op == 1:
        return (reference.group_count(idx, 256),)
    if op == 2:
        return (reference.aux_fi(idx, 256, 8),)
    if op == 3:
        return reference.normalize_weight(weights)
    if op == 4:
        return (reference.transpose(x_t),)
    return tuple(reference.cast(x_q, 'e4m3', (1, 128)))


def assert_all_equal(actual, expected) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert_bitwise_equal(a, e.contiguous() if a.is_contiguous() and not e.is_contiguous() else e)


def _run(calls: int, start: int, inputs) -> None:
    for i in range(start, start + calls):
        mixed_call(i, inputs)


@pytest.mark.alone  # the driver's free memory is device-wide: another process's allocations would read as growth
def test_mixed_calls_do_not_grow_memory_or_modules(module_loads):
    inputs = make_inputs()
    for i in range(24):  # every op at every token count: all first loads, checked once against the references
        assert_all_equal(mixed_call(i, inputs), mixed_reference(i, inputs))
    _run(2_000, 0, inputs)  # warm the caching allocator and Python's caches
    torch.cuda.synchronize()
    gc.collect()
    loads, functions = module_loads.total(), loaded_functions()
    allocated = torch.cuda.memory_allocated()
    free = torch.cuda.mem_get_info()[0]
    checkpoints = []
    step = SOAK_CALLS // 10
    for n in range(10):
        _run(step, n * step, inputs)
        torch.cuda.synchronize()
        gc.collect()
        checkpoints.append(rss_bytes())
        assert torch.cuda.memory_allocated() == allocated, f'GPU memory allocated grew after {(n + 1) * step} calls'
    assert module_loads.total() == loads and loaded_functions() == functions, 'modules or functions were loaded again'
    assert free - torch.cuda.mem_get_info()[0] < 64 * MiB, 'the driver has 64 MiB less free memory than after the warm-up'
    # Host memory: from the second checkpoint on (the first still fills Python's free lists), no growth beyond noise.
    growth = checkpoints[-1] - checkpoints[1]
    assert growth < 16 * MiB, f'RSS grew {growth / MiB:.1f} MiB over {8 * step} calls: {[c // MiB for c in checkpoints]} MiB'
    for i in range(24):  # still right
        assert_all_equal(mixed_call(i, inputs), mixed_reference(i, inputs))


# --- first calls from 16 threads ----------------------------------------------------------------------------------------

def four_ops(inputs) -> tuple:
    scores, idx, _, x_t, x_q = inputs[3]
    return (tile_kernels_aot.moe.topk_gate(scores, 8), tile_kernels_aot.moe.group_count(idx, 256),
            tile_kernels_aot.transpose.transpose(x_t), *tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128))


def four_references(inputs) -> tuple:
    scores, idx, _, x_t, x_q = inputs[3]
    return (reference.stable_topk(scores, 8), reference.group_count(idx, 256), reference.transpose(x_t),
            *reference.cast(x_q, 'e4m3', (1, 128)))


@pytest.fixture
def fresh_loader():
    """Forget every loaded kernel (the next calls load their modules again) and do so again afterwards."""
    _select.reset()
    yield
    _select.reset()


def test_16_threads_first_calls_load_each_module_once_per_device(fresh_loader, module_loads):
    devices = list(range(torch.cuda.device_count()))
    inputs = {d: make_inputs(f'cuda:{d}', seed=d) for d in devices}
    torch.cuda.synchronize()
    barrier = threading.Barrier(16)
    results: dict[int, tuple] = {}

    def worker(i: int) -> None:
        device = devices[i % len(devices)]
        with torch.cuda.device(device):
            barrier.wait()
            if i % 2:  # half the threads call the ops in reverse order
                out = four_ops(inputs[device])
            else:
                scores, idx, _, x_t, x_q = inputs[device][3]
                q = tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128)
                t = tile_kernels_aot.transpose.transpose(x_t)
                c = tile_kernels_aot.moe.group_count(idx, 256)
                out = (tile_kernels_aot.moe.topk_gate(scores, 8), c, t, *q)
            torch.cuda.synchronize(device)
            results[i] = out

    run_in_threads(worker)
    assert module_loads.counts and all(n == 1 for n in module_loads.counts.values()), module_loads.counts
    per_device = {d: {image for image, dev in module_loads.counts if dev == d} for d in devices}
    assert all(len(images) >= 4 for images in per_device.values()), per_device  # 4 ops: at least 4 kernels each
    assert len({frozenset(images) for images in per_device.values()}) == 1, 'the devices loaded different kernels'
    for i, out in results.items():
        assert_all_equal(out, four_references(inputs[devices[i % len(devices)]]))


# --- 4 streams at once ------------------------------------------------------------------------------------------------------

def test_4_streams_at_once_equal_the_serial_results():
    stream_inputs = [make_inputs(seed=10 + s) for s in range(4)]
    calls = range(48)
    serial = [[mixed_call(i, inputs) for i in calls] for inputs in stream_inputs]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream() for _ in range(4)]
    main = torch.cuda.current_stream()
    results: list[list] = [[] for _ in streams]
    for s in streams:
        s.wait_stream(main)
    with torch.cuda.stream(streams[0]):
        torch.cuda._sleep(50_000_000)  # one stream starts late: the others overtake it
    for i in calls:  # interleaved: call i of every stream before call i + 1 of any
        for s, inputs, out in zip(streams, stream_inputs, results):
            with torch.cuda.stream(s):
                out.append(mixed_call(i, inputs))
    torch.cuda.synchronize()
    for per_stream, expected in zip(results, serial):
        for got, want in zip(per_stream, expected):
            assert_all_equal(got, want)


# --- errors caught, then the ops still work -----------------------------------------------------------------------------

def _ops_still_work() -> None:
    inputs = make_inputs(seed=99)
    for i in range(24):
        assert_all_equal(mixed_call(i, inputs), mixed_reference(i, inputs))


def _copy_package(tmp: Path, root: Path, cubin_rel: str) -> Path:
    """A copy of an arch package folder to damage: the manifest and the folder of the cubin `cubin_rel` are copied, the
    other cubin folders link back to the original. Refuses to return a copy whose cubin would be the original's."""
    copy = tmp / 'package'
    (copy / 'cubins').mkdir(parents=True)
    shutil.copy(root / 'manifest.json', copy / 'manifest.json')
    own = Path(cubin_rel).parts[1]  # cubins/<this folder>/...
    for folder in (root / 'cubins').iterdir():
        if folder.name == own:
            shutil.copytree(folder, copy / 'cubins' / folder.name, symlinks=False)
        else:
            (copy / 'cubins' / folder.name).symlink_to(folder)
    target = copy / cubin_rel
    assert target.is_file() and not target.is_symlink() and target.resolve().is_relative_to(copy.resolve()), target
    return copy


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _rename(path: Path, old: bytes, new: bytes) -> None:
    """Every occurrence of `old` (a symbol, and the section names built from it) replaced by `new`, of the same
    length: the ELF stays whole, and cuModuleGetFunction finds no entry of the manifest's name."""
    data = path.read_bytes()
    assert len(old) == len(new) and old in data
    path.write_bytes(data.replace(old, new))


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


BASES = {'TileKernelsAOTError', 'ArtifactError', 'KernelIntegrityError'}
ERROR_TYPES = sorted(name for name, cls in vars(errors).items()
                     if isinstance(cls, type) and issubclass(cls, errors.TileKernelsAOTError) and name not in BASES)


@pytest.mark.parametrize('error', ERROR_TYPES)
def test_the_ops_keep_working_after_each_error(error, tmp_path, monkeypatch):
    _ops_still_work()  # every module loaded before the error
    device = torch.cuda.current_device()
    package = _select.package_for_device(device)
    kernel = _select.find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, device)
    cubin_rel = kernel.entry.cubin
    scores = torch.randn(16, 256, device='cuda')

    def use_copy(damage, *, verify: bool = True) -> None:
        copy = _copy_package(tmp_path, package.root, cubin_rel)
        damage(copy)
        monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(copy))
        monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
        if not verify:
            monkeypatch.setenv(_select.VERIFY_ENV, '0')
        _select.reset()
        tile_kernels_aot.moe.topk_gate(scores, 8)

    with pytest.raises(getattr(errors, error)) as info:
        if error == 'SpecNotPrebuiltError':
            _select.find_kernel('moe.topk_gate', {'num_experts': 12345, 'num_topk': 8}, device)
        elif error == 'CudaDriverError':
            value = ctypes.c_int()
            _driver.driver().call('cuDeviceGetAttribute', ctypes.byref(value), 16, 9999)  # no device 9999
        elif error == 'CubinMissingError':
            use_copy(lambda copy: (copy / cubin_rel).unlink())
        elif error == 'CubinChecksumError':
            use_copy(lambda copy: _flip(copy / cubin_rel, 200))
        elif error == 'CubinTruncatedError':  # verification off: the layout check refuses a cubin cut in half
            use_copy(lambda copy: _cut(copy / cubin_rel), verify=False)
        elif error == 'CubinLoadError':  # verification off: a sound ELF whose entry symbol is renamed everywhere
            symbol = kernel.entry.launches[0].symbol.encode()
            use_copy(lambda copy: _rename(copy / cubin_rel, symbol, symbol[:-1] + (b'Y' if symbol.endswith(b'X') else b'X')),
                     verify=False)
        elif error == 'CubinArchError':  # the ELF header names another SM
            use_copy(lambda copy: _flip(copy / cubin_rel, 49), verify=False)
        elif error == 'ManifestError':
            use_copy(lambda copy: (copy / 'manifest.json').write_text((copy / 'manifest.json').read_text()[:1000]))
        elif error == 'ManifestSchemaError':
            use_copy(lambda copy: (copy / 'manifest.json').write_text(
                json.dumps({**json.loads((copy / 'manifest.json').read_text()), 'schema': 999})))
        elif error == 'KernelDirError':
            monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(tmp_path / 'missing'))
            _select.reset()
            tile_kernels_aot.moe.topk_gate(scores, 8)
        elif error in ('UnsupportedDeviceError', 'ArchPackageMissingError'):
            # Only this device's package is visible, and the device claims a capability no target serves, or one that
            # only the other target serves.
            other = next(t for t in targets.KNOWN_TARGETS if t != package.target)
            capability = (7, 0) if error == 'UnsupportedDeviceError' else targets.parse_target(other)[:2]
            monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(package.root))
            monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
            monkeypatch.setattr(_select, 'device_facts', lambda index: ('a GPU', capability))
            _select.reset()
            tile_kernels_aot.moe.topk_gate(scores, 8)
        else:
            raise AssertionError(f'no way to provoke {error}: add one')
    assert type(info.value).__name__ == error
    monkeypatch.undo()  # the environment and the device as they were
    _select.reset()
    _ops_still_work()
