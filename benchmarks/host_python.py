"""The Python part of every op's host time, on a machine without a GPU: each case of tests/fixtures/custom_ops.py with
CPU tensors and the binaries' manifests from a build folder. First each launch is replaced by a record, and the replayed
calls' launches are checked against the full calls': the same binaries, dims and scalars, and each buffer at the same
place in the call's tensors (each case starts with no binary loaded, by _select.reset: no plan has a native form, and
Python's replay launches through LoadedKernel.launch, which makes the record). Then
each case is timed in full (launch plans off) and replayed (tile_kernels_aot._plans, its plans recorded again over the
loaded binaries, so that a simple plan replays in the runtime's C extension; the line says which replays it) down to the
driver call, over a stand-in libcuda (tests/fixtures/stub_libcuda.c, compiled with the host C compiler; without one the
launch stays a record), and replayed once more as without the extension (Python's replay, the driver call through
ctypes) where the extension is built. tests/cpu/test_native_replay.py checks what the C replays launch.

    python -m benchmarks.host_python build/sm_90a [--tokens 1] [--cases mhc_post_fwd,engram_*]

The figures are this CPU's and leave out what a GPU adds (CUDA allocations, the driver's own work);
benchmarks.host_overhead measures the whole on a GPU host.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib
import os
import sys
import tempfile
import time

import torch
from torch.utils import _pytree as pytree


def fake_device(kernel_dir: str) -> list:
    """Serve `kernel_dir`'s manifests as an H200's, let CPU tensors pass the device check, and record every launch
    (kernel, {buffer: address}, env) instead of making it, until recording(False). Returns the list the launches go to."""
    os.environ['TILE_KERNELS_AOT_KERNEL_DIRS'] = kernel_dir
    from tile_kernels_aot import _checks, _launch, _select, config

    launched = []
    _select.device_facts = lambda index: ('NVIDIA H200', (9, 0))
    _checks.on_one_cuda_device = lambda op, **tensors: 0
    sms = functools.cache(lambda device=None: 132)
    for module in list(sys.modules.values()):
        if getattr(module, '__name__', '').startswith('tile_kernels_aot') and hasattr(module, 'get_device_num_sms'):
            module.get_device_num_sms = sms
    config.get_device_num_sms = sms
    _launch.LoadedKernel.blocks_per_sm = lambda self, device: 4
    _launches['record'] = lambda self, device, pointers, env: launched.append((self.entry.kernel, dict(pointers), dict(env)))
    _launches['make'] = _launch.LoadedKernel.launch
    recording(True)
    _select.reset()
    return launched


_launches: dict = {}


def recording(on: bool) -> None:
    """Launches recorded (fake_device's list), or made through the loader's driver bindings (stub_driver)."""
    from tile_kernels_aot import _launch

    _launch.LoadedKernel.launch = _launches['record' if on else 'make']


def stub_driver(folder: str):
    """The driver bindings over a stand-in libcuda built in `folder` (device 0 and its null stream current), for the
    launches made after recording(False); None where there is no C compiler."""
    from pathlib import Path

    from tests.fixtures import stub_driver as stub
    from tile_kernels_aot import _driver, _launch

    lib = stub.build(Path(folder))
    if lib is None:
        return None
    drv = _driver.Driver(lib)
    _driver.driver = lambda: drv
    _launch._ensure_context = lambda device: setattr(_launch._thread_state, 'device', device)
    _launch._current_device = lambda: 0
    _launch._current_stream = lambda device: 0
    return drv


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """t's copy at its offset modulo 256 bytes from a 256-byte boundary, as the CUDA allocator would place it (the CPU
    one aligns to 64 bytes, and a signature holds the low 8 bits of an address)."""
    base = torch.empty(t.untyped_storage().nbytes() + 512, dtype=torch.uint8)
    start = (-base.data_ptr() % 256 + (t.data_ptr() - t.untyped_storage().data_ptr()) % 256) // t.element_size()
    copy = torch.empty(0, dtype=t.dtype).set_(base.untyped_storage()).as_strided(t.shape, t.stride(), start)
    return copy.copy_(t)


def roles(pointers: dict, tensors: list) -> dict:
    """Each launched buffer as (which of `tensors` holds it, byte offset), or '?' for a buffer the call made."""
    found = {}
    for name, address in pointers.items():
        found[name] = '?'
        for i, t in enumerate(tensors):
            end = t.data_ptr() + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
            if t.numel() and t.data_ptr() <= address < end:
                found[name] = (i, address - t.data_ptr())
                break
    return found


def per_call_us(fn, calls: int = 2000) -> float:
    for _ in range(50):
        fn()
    best = float('inf')
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        best = min(best, (time.perf_counter() - start) / (calls // 5) * 1e6)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('kernel_dir', help='a build folder with a manifest.json (build/sm_90a)')
    parser.add_argument('--tokens', type=int, default=1)
    parser.add_argument('--cases', default='*', help='globs over case names, comma-separated')
    args = parser.parse_args()
    launched = fake_device(args.kernel_dir)
    from tests.fixtures.custom_ops import CASES
    from tile_kernels_aot import _custom_ops, _plans, _select
    from tile_kernels_aot.errors import SpecNotPrebuiltError

    stub_folder = tempfile.TemporaryDirectory()
    drv = stub_driver(stub_folder.name)
    native = drv.native if drv is not None else None  # None for a launch through ctypes
    native_replay, native_extension = _plans._native_replay, _plans._native  # the extension's replay of simple plans, its keys
    if drv is None:
        print('no C compiler: each launch is timed as a record, not a driver call')

    public = {op: qualified for qualified, op in _custom_ops.PUBLIC.items()}
    failed = 0
    for case in CASES:
        if not any(fnmatch.fnmatch(case.name, pattern) for pattern in args.cases.split(',')):
            continue
        module, name = public[case.op.__name__].split('.')
        op = getattr(importlib.import_module(f'tile_kernels_aot.{module}'), name)
        try:
            inputs = pytree.tree_map_only(torch.Tensor, aligned_copy, case.args(args.tokens))
            records = []
            recording(True)
            _select.reset()  # an earlier case's binaries, loaded, would let the replays launch past the record
            for _ in range(4):  # in full, recorded, replayed twice
                call_args = pytree.tree_map_only(torch.Tensor, aligned_copy, inputs)
                launched.clear()
                result = op(*call_args)
                tensors = [t for t in pytree.tree_leaves((call_args, result)) if isinstance(t, torch.Tensor)]
                records.append([(kernel, roles(pointers, tensors), env) for kernel, pointers, env in launched])
            recording(drv is None)
            _plans.enable(False)
            full = per_call_us(lambda: op(*call_args))
            _plans.enable(True)
            _plans.clear()  # recorded again over the loaded binaries: a simple plan gets its native form
            for _ in range(3):
                op(*call_args)
            replayer = 'C' if any(getattr(plan, 'native', None) for plan in getattr(op, 'plans', {}).values()) else 'Python'
            replayed = per_call_us(lambda: op(*call_args))
            through_ctypes = ''
            if native is not None:  # as without the extension: Python replays, ctypes makes the driver call
                drv.native, _plans._native, _plans._native_replay = None, None, None
                through_ctypes = f'  replayed without the extension {per_call_us(lambda: op(*call_args)):6.1f} us'
        except (ValueError, TypeError, SpecNotPrebuiltError) as exc:  # a case the token count or the build does not suit
            print(f'{case.name:60s} skipped: {str(exc).splitlines()[0]}')
            continue
        finally:
            _plans.enable(True)
            if native is not None:
                drv.native, _plans._native, _plans._native_replay = native, native_extension, native_replay
        same = all(r == records[0] for r in records[1:])
        failed += not same
        print(f'{case.name:60s} in full {full:6.1f} us  replayed in {replayer:6s} {replayed:6.1f} us  {full / replayed:4.1f}x{through_ctypes}'
              f'{"" if same else "  REPLAYED LAUNCHES DIFFER"}', flush=True)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
