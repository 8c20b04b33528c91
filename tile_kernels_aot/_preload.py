"""preload(): load installed cubins into a device's context ahead of time, so that a CUDA graph can be captured
without calling each op once first.

An op's first call on a device loads its binary (cuModuleLoadData, function attributes, the occupancy query that
sizes persistent grids); those are not stream work, and a capture must not be the first to do them. After
preload(), an op whose spec was preloaded only binds arguments and launches.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable

from tile_kernels_aot import _select
from tile_kernels_aot.errors import TileKernelsAOTError


def preload(device=None, kernels: str | Iterable[str] | None = None) -> list[str]:
    """Load every installed binary for `device` (default: torch's current CUDA device), or those of the kernels named
    by `kernels`: kernel names or globs (``'moe.*'``, ``['quant.per_token_cast', 'transpose.*']``) over the names
    that ``python -m tile_kernels_aot list`` shows. Returns the binaries loaded, as ``'kernel[spec]'``.

    Raises TypeError or ValueError for a bad argument (a name or glob that matches no kernel of the device's arch
    package names the close ones), TileKernelsAOTError when torch sees no CUDA GPU, and the loader's errors
    (UnsupportedDeviceError, KernelIntegrityError, CudaDriverError) as an op's first call would.
    """
    patterns = _patterns(kernels)
    index = _device_index(device)
    visible = _visible_devices()
    if not visible:
        raise TileKernelsAOTError('preload: torch sees no CUDA GPU, so there is no device to load the binaries into')
    if index >= visible:
        raise ValueError(f'preload: there is no CUDA device {index}; torch sees {visible}')
    package = _select.package_for_device(index)
    names = _matching(patterns, sorted(package.manifest.kernels), package)
    loaded = []
    with _on_device(index):
        for name in names:
            for key, entry in sorted(package.manifest.kernels[name].entries.items()):
                with _select._lock:  # find_kernel takes it too: one LoadedKernel per entry
                    kernel = package.kernel(entry)
                kernel.blocks_per_sm(index)  # loads the module and caches the occupancy that persistent grids use
                loaded.append(f'{name}[{key}]')
    return loaded


def _patterns(kernels: str | Iterable[str] | None) -> list[str] | None:
    if kernels is None:
        return None
    items = [kernels] if isinstance(kernels, str) else kernels
    try:
        patterns = list(items)
    except TypeError:
        raise TypeError(f'preload: kernels must be a kernel name, a glob or a list of them, got {kernels!r}') from None
    bad = [p for p in patterns if not isinstance(p, str) or not p]
    if bad or not patterns:
        raise TypeError(f'preload: kernels must be non-empty strings (kernel names or globs), got {kernels!r}')
    return patterns


def _device_index(device) -> int:
    """torch's device index of `device`: None (the current device), an int, 'cuda', 'cuda:N' or a torch.device."""
    import torch

    if device is None:
        return _current_device()
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f'preload: device must be None, an int, a str or a torch.device, got {device!r}')
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f'preload: device must be a CUDA device index >= 0, got {device}')
        return device
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f'preload: {exc}') from None
    if device.type != 'cuda':
        raise ValueError(f"preload: device must be a CUDA device, got '{device}'")
    return _current_device() if device.index is None else device.index


def _matching(patterns: list[str] | None, names: list[str], package: _select.ArchPackage) -> list[str]:
    if patterns is None:
        return names
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            close = difflib.get_close_matches(pattern, names, n=4, cutoff=0.6)
            hint = f'close names: {", ".join(close)}' if close else 'python -m tile_kernels_aot list shows them all'
            raise ValueError(f'preload: no kernel of the {package.target} arch package ({package.origin}) matches {pattern!r}; {hint}')
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _current_device() -> int:
    import torch

    return torch.cuda.current_device() if _visible_devices() else 0  # without CUDA, preload() then says so


def _visible_devices() -> int:
    """How many CUDA devices torch sees (tests replace it: there is no GPU there)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _on_device(index: int):
    """The context in which `index`'s primary context is current (tests replace it: there is no GPU there)."""
    import torch

    return torch.cuda.device(index)
