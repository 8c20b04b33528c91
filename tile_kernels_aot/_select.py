"""Binary selection: which arch package serves a device, and which of its entries serves a call.

Arch packages are found by import name (tile_kernels_aot_sm90a, ...) and, for development, in the
directories listed in TILE_KERNELS_AOT_KERNEL_DIRS (each holding a manifest.json, e.g. build/sm_90a).
Nothing is read until the first kernel call; after that each device's choice is cached.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import threading
from pathlib import Path

from tile_kernels_aot import _misses, _plans, targets
from tile_kernels_aot._launch import LoadedKernel
from tile_kernels_aot.manifest import Entry, Manifest, ParamValue, read_manifest, spec_key
from tile_kernels_aot.errors import (
    ArchPackageMissingError, KernelDirError, ManifestError, SpecNotPrebuiltError, TileKernelsAOTError, UnsupportedDeviceError,
)

KERNEL_DIRS_ENV = 'TILE_KERNELS_AOT_KERNEL_DIRS'
VERIFY_ENV = 'TILE_KERNELS_AOT_VERIFY_SHA256'

_lock = threading.Lock()


@dataclasses.dataclass
class ArchPackage:
    target: str
    root: Path  # folder with manifest.json, cubins/, sources/
    origin: str  # where it was found, for messages
    _manifest: Manifest | None = None
    _kernels: dict = dataclasses.field(default_factory=dict)

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            path = self.root / 'manifest.json'
            manifest = read_manifest(path, package=self.origin)
            if manifest.target != self.target:
                raise ManifestError('malformed', f'the manifest is for {manifest.target}, not {self.target}', package=self.origin, file=str(path))
            self._manifest = manifest
        return self._manifest

    def kernel(self, entry: Entry) -> LoadedKernel:
        loaded = self._kernels.get((entry.kernel, entry.key))
        if loaded is None:
            verify = os.environ.get(VERIFY_ENV, '1') != '0'
            loaded = self._kernels[(entry.kernel, entry.key)] = LoadedKernel(entry, self.root, verify_sha256=verify, package=self.origin)
        return loaded


@functools.cache
def installed_packages() -> tuple[ArchPackage, ...]:
    """Every arch package visible to this process; directories from the environment come first. A folder of the
    environment that does not exist raises KernelDirError; one without a readable manifest, ManifestError."""
    found: dict[str, ArchPackage] = {}
    for entry in filter(None, os.environ.get(KERNEL_DIRS_ENV, '').split(os.pathsep)):
        root = Path(entry)
        if not root.is_dir():
            raise KernelDirError(KERNEL_DIRS_ENV, str(root))
        origin = f'{KERNEL_DIRS_ENV} ({root})'
        manifest = read_manifest(root / 'manifest.json', package=origin)  # its target says which arch it serves
        found.setdefault(manifest.target, ArchPackage(manifest.target, root, origin, manifest))
    for target in targets.KNOWN_TARGETS:
        root = find_arch_package(target)
        if target not in found and root is not None:
            found[target] = ArchPackage(target, root, targets.distribution_for(target))
    return tuple(found.values())


def find_arch_package(target: str) -> Path | None:
    """The folder of the installed arch package for `target`, found without importing it."""
    spec = importlib.util.find_spec(targets.package_for(target))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def device_facts(device_index: int) -> tuple[str, tuple[int, int]]:
    """Name and compute capability of a CUDA device (tests replace this to fake a device)."""
    import torch

    return torch.cuda.get_device_name(device_index), torch.cuda.get_device_capability(device_index)


@functools.cache
def package_for_device(device_index: int) -> ArchPackage:
    name, capability = device_facts(device_index)
    packages = {p.target: p for p in installed_packages()}
    target, reasons = targets.choose_target(capability, list(packages))
    if target is None:
        installed = [f'{t} ({p.origin})' for t, p in packages.items()]
        advice = targets.install_advice(capability, targets.find_checkout(Path(__file__).resolve().parent.parent))
        served_by, _ = targets.choose_target(capability, list(targets.KNOWN_TARGETS))
        if served_by is not None:  # a release target runs here: its arch package is what is missing
            raise ArchPackageMissingError(served_by, targets.distribution_for(served_by), name, capability, installed, reasons, advice)
        raise UnsupportedDeviceError(name, capability, installed, reasons, advice)
    return packages[target]


def _distance(a: dict[str, ParamValue], b: dict[str, ParamValue]) -> tuple[int, float]:
    differing = [k for k in a if a[k] != b.get(k)]
    numeric = sum(abs(a[k] - b[k]) / max(abs(a[k]), abs(b[k]), 1)
                  for k in differing if isinstance(a[k], int) and not isinstance(a[k], bool) and isinstance(b.get(k), int))
    return len(differing), numeric


def _not_prebuilt(package: ArchPackage, kernel: str, params: dict[str, ParamValue]) -> SpecNotPrebuiltError:
    info = package.manifest.kernels.get(kernel)
    nearest: list[str] = []
    if info is not None:
        ranked = sorted(info.entries.values(), key=lambda e: (_distance(params, e.params), e.key))
        nearest = [e.key for e in ranked[:3]]
    spec_json = json.dumps([{'kernel': kernel, 'params': params}])
    command = f'python -m build_tools --arch {targets.cli_arch(package.target)} --specs my_specs.json'
    _misses.record_miss(kernel, params)  # TILE_KERNELS_AOT_RECORD_MISSES
    return SpecNotPrebuiltError(kernel, package.target, params, nearest, command, spec_json)


def _kernel_info(kernel: str, device_index: int):
    package = package_for_device(device_index)
    return package, package.manifest.kernels.get(kernel)


_found: dict[tuple, LoadedKernel] = {}


def find_kernel(kernel: str, params: dict[str, ParamValue], device_index: int) -> LoadedKernel:
    """The loaded binary for `kernel` at `params` on a device. Raises rather than ever compiling."""
    memo_key = (kernel, device_index, *params.items())
    found = _found.get(memo_key)
    if found is not None:
        return found
    with _lock:
        package, info = _kernel_info(kernel, device_index)
        entry = info.entries.get(spec_key(info.params, params)) if info is not None else None
        if entry is None:
            raise _not_prebuilt(package, kernel, params)
        found = _found[memo_key] = package.kernel(entry)
        return found


_preferred: dict[tuple, dict[str, ParamValue]] = {}


def first_prebuilt(kernel: str, candidates: list[dict[str, ParamValue]], device_index: int) -> dict[str, ParamValue]:
    """The first of `candidates` (best first) that is prebuilt for the device; if none is, the first
    one, so that find_kernel reports the spec the call wanted most."""
    memo_key = (kernel, device_index, *(tuple(c.items()) for c in candidates))
    chosen = _preferred.get(memo_key)
    if chosen is None:
        _, info = _kernel_info(kernel, device_index)
        prebuilt = [c for c in candidates if info is not None and spec_key(info.params, c) in info.entries]
        chosen = _preferred[memo_key] = (prebuilt or candidates)[0]
    return chosen


_constants: dict[tuple, int] = {}


def kernel_constant(kernel: str, name: str, device_index: int) -> int:
    """A constant that every installed entry of `kernel` for the device declares alike, for an op that needs it before
    it chooses an entry (after that, the op reads ``find_kernel(...).entry.constants``)."""
    memo_key = (kernel, name, device_index)
    value = _constants.get(memo_key)
    if value is None:
        package, info = _kernel_info(kernel, device_index)
        values = {e.constants.get(name) for e in info.entries.values()} if info is not None else set()
        if len(values) != 1 or None in values:
            if not values:
                found = 'no binaries of it'
            elif None in values:
                found = f'binaries that do not declare {name}'
            else:
                found = f'binaries that declare {name} differently ({sorted(values)})'
            raise TileKernelsAOTError(f'{kernel}: the {package.target} arch package ({package.origin}) has {found}; '
                                      f'the op needs one {name} for every spec')
        value = _constants[memo_key] = values.pop()
    return value


def prebuilt_specs(kernel: str, device_index: int = 0) -> list[dict[str, ParamValue]]:
    """The specs of `kernel` installed for a device, in manifest order (used by tests and benchmarks)."""
    _, info = _kernel_info(kernel, device_index)
    return [] if info is None else [dict(e.params) for _, e in sorted(info.entries.items())]


def reset() -> None:
    """Forget discovered packages and device choices (tests use it after changing the environment)."""
    installed_packages.cache_clear()
    package_for_device.cache_clear()
    _found.clear()
    _preferred.clear()
    _constants.clear()
    _plans.clear()  # the plans hold binaries of the packages found before
