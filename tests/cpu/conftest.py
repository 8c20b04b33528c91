"""A small real build (tilelang + nvcc, no GPU), shared by the CPU tests that need binaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# One spec each of a transpose, a moe and a quant kernel, for both arches: enough to exercise every step of the build.
SUBSET = [
    {'kernel': 'transpose.batched_transpose', 'params': {'elem_bytes': 2, 'vec_bytes': 16, 'tile_m': 64, 'tile_n': 64}},
    {'kernel': 'moe.topk_gate', 'params': {'num_experts': 256, 'num_topk': 8}},
    {'kernel': 'quant.per_token_cast', 'params': {'in_dtype': 'bfloat16', 'fmt': 'e4m3', 'sf_format': 'f32', 'per_row': False, 'aligned': True, 'vec_bytes': 32}},
]


def build_subset(root: Path, **overrides):
    from build_tools.build import BuildArgs, build
    from kernel_src.decl import ARCHS

    specs = root / 'specs.json'
    specs.parent.mkdir(parents=True, exist_ok=True)
    specs.write_text(json.dumps(SUBSET))
    args = dict(archs=ARCHS, specs_file=specs, prebuilt=False, partial_wheels=True, jobs=2, out=root / 'dist', build_dir=root / 'build')
    args.update(overrides)
    return build(BuildArgs(**args))


@pytest.fixture(scope='session')
def built(tmp_path_factory) -> Path:
    """Root of a finished subset build: build/<target>/manifest.json, dist/*.whl."""
    pytest.importorskip('tilelang')
    root = tmp_path_factory.mktemp('subset')
    build_subset(root)
    return root


@pytest.fixture
def record_launches(monkeypatch):
    """record_launches(kernel_dir) -> list: load `kernel_dir`'s binaries as an H200's, let CPU tensors pass the device
    check, and replace every launch, after its arguments are bound, by a record (kernel, bound dims, grids). What an op would launch is then bound
    and checked against the built manifests (names, shapes, strides, dtypes, alignment) with no GPU."""
    from tile_kernels_aot import _checks, _launch, _select

    launched = []

    def record(self, device, pointers, env):
        launched.append((self.entry.kernel, env, [grid(env) for grid in self._grids]))

    def start(kernel_dir: Path) -> list:
        monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(kernel_dir))
        monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
        monkeypatch.setattr(_checks, 'on_one_cuda_device', lambda op, **tensors: 0)
        monkeypatch.setattr(_launch.LoadedKernel, 'launch', record)
        _select.reset()
        return launched

    yield start
    _select.reset()
