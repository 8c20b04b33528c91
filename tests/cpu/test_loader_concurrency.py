"""The loader under concurrent first calls and after errors, on CPU: a synthetic arch package of four kernels (a
manifest written by manifest_to_json, an ELF header as each cubin) and a faked CUDA driver that counts module loads.

* 16 threads make their first calls of the 4 kernels at once, on two (faked) devices: each kernel's module is loaded
  exactly once per device, and every thread gets the same functions.
* After each of the package's error types (tile_kernels_aot.errors) is raised and caught, a sound load still works,
  with nothing left half-loaded by the failure. The GPU versions are in tests/gpu/test_soak.py.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures.threads import run_in_threads
from tile_kernels_aot import _launch, _select, errors, targets
from tile_kernels_aot.errors import CudaDriverError
from tile_kernels_aot.manifest import KernelInfo, Manifest, ParamSchema, entry_from_plain, manifest_to_json

from .test_artifact_faults import fake_cubin

KERNELS = ('demo.a', 'demo.b', 'demo.c', 'demo.d')


def make_package(folder: Path, target: str = 'sm_90a') -> Path:
    """An arch package folder with one entry (h=64) of each of KERNELS; each cubin differs (its kernel's name in it)."""
    sm = targets.parse_target(target)[0] * 10 + targets.parse_target(target)[1]
    infos = {}
    for name in KERNELS:
        data = fake_cubin(sm)[:-16] + name.encode().ljust(16, b'\0')
        cubin = f'cubins/{name}/h64.cubin'
        (folder / 'cubins' / name).mkdir(parents=True)
        (folder / cubin).write_bytes(data)
        entry = entry_from_plain({
            'kernel': name, 'key': 'h=64', 'params': {'h': 64}, 'target': target, 'cubin': cubin,
            'sha256': hashlib.sha256(data).hexdigest(), 'source': f'sources/{name}/h64.cu', 'buffers': [], 'scalars': [],
            'launches': [{'symbol': 'k', 'args': [], 'grid': [1, 1, 1], 'block': [128, 1, 1], 'dynamic_smem': 0,
                          'cooperative': False, 'cluster_dims': None, 'pdl': False, 'tma': []}],
            'constants': {},
        })
        infos[name] = KernelInfo(name, (ParamSchema('h', 'int', 'h'),), {'h=64': entry})
    manifest = Manifest(target, targets.package_for(target), '0.0.0', {}, infos)
    (folder / 'manifest.json').write_text(manifest_to_json(manifest))
    return folder


class CountingDriver:
    """A driver that records every module load as (image, device of the calling thread), slowly enough that threads
    racing for a first load overlap; `fail` (a list of driver error names) makes the next loads fail, one each."""

    def __init__(self) -> None:
        self.loads: list[tuple[bytes, int]] = []
        self.fail: list[str] = []
        self._lock = threading.Lock()
        self.device = threading.local()

    def load_module(self, image: bytes):
        time.sleep(0.005)
        with self._lock:
            if self.fail:
                name = self.fail.pop(0)
                raise CudaDriverError('cuModuleLoadData', 200 if name == 'CUDA_ERROR_INVALID_IMAGE' else 2, name, 'refused')
            self.loads.append((image, getattr(self.device, 'index', 0)))
            return len(self.loads)

    def get_function(self, module, symbol: str):
        return 1000 + module

    def loads_by_kernel(self) -> dict[tuple[str, int], int]:
        counts: dict[tuple[str, int], int] = {}
        for image, device in self.loads:
            name = image[-16:].rstrip(b'\0').decode()
            counts[(name, device)] = counts.get((name, device), 0) + 1
        return counts


@pytest.fixture
def package(tmp_path, monkeypatch):
    """The synthetic sm_90a package named by TILE_KERNELS_AOT_KERNEL_DIRS, on two faked H200s, with the counting driver."""
    root = make_package(tmp_path / 'sm_90a')
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
    monkeypatch.delenv(_select.VERIFY_ENV, raising=False)
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    drv = CountingDriver()
    monkeypatch.setattr(_launch._driver, 'driver', lambda: drv)
    monkeypatch.setattr(_launch, '_ensure_context', lambda device: setattr(drv.device, 'index', device))
    _select.reset()
    yield root, drv
    _select.reset()


def load(name: str, device: int = 0):
    return _select.find_kernel(name, {'h': 64}, device).functions(device)


# --- first loads from many threads --------------------------------------------------------------------------------------

@pytest.mark.parametrize('round_', range(3))
def test_16_threads_first_calls_load_each_module_once_per_device(package, round_):
    _, drv = package
    barrier = threading.Barrier(16)
    results: dict[tuple[int, str], list] = {}

    def worker(i: int) -> None:
        device = i % 2
        order = KERNELS[i % 4:] + KERNELS[:i % 4]  # every thread starts with another kernel
        barrier.wait()
        for name in order:
            results[(i, name)] = load(name, device)

    run_in_threads(worker)
    assert drv.loads_by_kernel() == {(name, device): 1 for name in KERNELS for device in (0, 1)}
    for name in KERNELS:
        for device in (0, 1):
            assert len({tuple(results[(i, name)]) for i in range(device, 16, 2)}) == 1, (name, device)


def test_a_kernel_found_from_many_threads_is_one_object(package):
    barrier = threading.Barrier(16)
    found: list = []

    def worker(i: int) -> None:
        barrier.wait()
        found.append(_select.find_kernel('demo.a', {'h': 64}, 0))

    run_in_threads(worker)
    assert len(found) == 16 and len({id(k) for k in found}) == 1


# --- error recovery -------------------------------------------------------------------------------------------------------

def _flip(path: Path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    return data


def _load_with_recorded_cubin(cubin: Path, manifest: Path, damage) -> None:
    """Load demo.a with its cubin replaced by damage(its bytes) and the manifest recording the new bytes' sha256, so
    that a check past the sha256 one refuses it; then put both back."""
    data, text = cubin.read_bytes(), manifest.read_text()
    damaged = damage(data)
    cubin.write_bytes(damaged)
    manifest.write_text(text.replace(hashlib.sha256(data).hexdigest(), hashlib.sha256(damaged).hexdigest()))
    _select.reset()
    try:
        load('demo.a')
    finally:
        cubin.write_bytes(data)
        manifest.write_text(text)
        _select.reset()


def _provoke(error: str, root: Path, drv: CountingDriver, monkeypatch) -> None:
    """Raise the package's error `error` through the loader, then repair what caused it (as an operator would)."""
    cubin = root / 'cubins/demo.a/h64.cubin'
    manifest = root / 'manifest.json'
    if error == 'SpecNotPrebuiltError':
        _select.find_kernel('demo.a', {'h': 65}, 0)
    elif error in ('CudaDriverError', 'CubinLoadError'):
        drv.fail.append('CUDA_ERROR_OUT_OF_MEMORY' if error == 'CudaDriverError' else 'CUDA_ERROR_INVALID_IMAGE')
        load('demo.a')
    elif error == 'CubinMissingError':
        data = cubin.read_bytes()
        cubin.unlink()
        try:
            load('demo.a')
        finally:
            cubin.write_bytes(data)
    elif error == 'CubinChecksumError':
        data = _flip(cubin)
        try:
            load('demo.a')
        finally:
            cubin.write_bytes(data)
    elif error == 'CubinTruncatedError':  # the layout check refuses a cut cubin before the driver
        _load_with_recorded_cubin(cubin, manifest, lambda data: data[:300])
    elif error == 'CubinArchError':  # the ELF header check refuses a cubin for another SM
        _load_with_recorded_cubin(cubin, manifest, lambda data: fake_cubin(100)[:-16] + b'demo.a'.ljust(16, b'\0'))
    elif error in ('ManifestError', 'ManifestSchemaError'):
        text = manifest.read_text()
        manifest.write_text(text[:50] if error == 'ManifestError' else json.dumps({**json.loads(text), 'schema': 999}))
        _select.reset()
        try:
            load('demo.a')
        finally:
            manifest.write_text(text)
    elif error == 'KernelDirError':
        monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root / 'missing'))
        _select.reset()
        try:
            load('demo.a')
        finally:
            monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(root))
            _select.reset()
    elif error in ('UnsupportedDeviceError', 'ArchPackageMissingError'):
        capability = (7, 0) if error == 'UnsupportedDeviceError' else (10, 0)  # no target runs on 7.0; sm_100a's package is absent
        monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA GPU', capability))
        _select.reset()
        try:
            load('demo.a')
        finally:
            monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
            _select.reset()
    else:
        raise AssertionError(f'no way to provoke {error}')


# The abstract bases: raised only as one of their subclasses.
BASES = {'TileKernelsAOTError', 'ArtifactError', 'KernelIntegrityError'}
ERROR_TYPES = sorted(name for name, cls in vars(errors).items()
                     if inspect.isclass(cls) and issubclass(cls, errors.TileKernelsAOTError) and name not in BASES)


def test_every_error_type_is_provoked():
    assert set(ERROR_TYPES) == {
        'ArchPackageMissingError', 'CubinArchError', 'CubinChecksumError', 'CubinLoadError', 'CubinMissingError', 'CubinTruncatedError',
        'CudaDriverError',
        'KernelDirError', 'ManifestError', 'ManifestSchemaError', 'SpecNotPrebuiltError', 'UnsupportedDeviceError',
    }, 'a new error type: add a way to provoke it to _provoke'


@pytest.mark.parametrize('error', ERROR_TYPES)
def test_the_loader_keeps_working_after_each_error(package, error, monkeypatch):
    root, drv = package
    load('demo.b')  # a kernel loaded before the error stays loaded
    loads_before = len(drv.loads)
    with pytest.raises(getattr(errors, error)) as info:
        _provoke(error, root, drv, monkeypatch)
    assert type(info.value).__name__ == error
    # The same process, repaired: every kernel loads, demo.a included (nothing cached from the failure), and demo.b is
    # not loaded again unless the package was rediscovered.
    for name in KERNELS:
        assert load(name) == load(name)
    counts = drv.loads_by_kernel()
    assert counts[('demo.a', 0)] == 1
    if len(drv.loads) - loads_before == len(KERNELS) - 1:
        assert counts[('demo.b', 0)] == 1


def test_a_failed_load_is_retried_and_then_cached(package):
    _, drv = package
    drv.fail.extend(['CUDA_ERROR_OUT_OF_MEMORY', 'CUDA_ERROR_OUT_OF_MEMORY'])
    kernel = _select.find_kernel('demo.c', {'h': 64}, 0)
    for _ in range(2):
        with pytest.raises(CudaDriverError) as info:
            kernel.functions(0)
        assert 'demo.c' in str(info.value) and info.value.name == 'CUDA_ERROR_OUT_OF_MEMORY'
    assert kernel.functions(0) == kernel.functions(0)
    assert drv.loads_by_kernel() == {('demo.c', 0): 1}
