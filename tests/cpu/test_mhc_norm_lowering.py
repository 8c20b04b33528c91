"""The pre-norm GEMMs on both targets: T.gemm on float32 operands lowers to TF32 mma.sync (HMMA.1688.F32.TF32 in
the SASS, no WGMMA or tcgen05), without spills; n_splits, eps and the width stay run-time (tilelang and nvcc, no GPU)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest

from kernel_src.decl import ARCHS

pytestmark = pytest.mark.build

SPEC = {'mhc': 4, 'hidden': 1280}
TF32_MMA = 'tl::mma_sync<tl::DataType::kTensorFloat32, tl::DataType::kTensorFloat32, tl::DataType::kFloat32, 16, 8, 8'


def compile_and_dump(source: str, arch, pass_configs, tmp_path) -> tuple[str, str]:
    """(SASS, ptxas -v report) of one lowered kernel, compiled as the build compiles it."""
    from build_tools.ninja import device_flags, include_dirs, nvcc_path

    cu, cubin = tmp_path / f'{arch.target}.cu', tmp_path / f'{arch.target}.cubin'
    cu.write_text(source)
    flags = device_flags(arch, dict(pass_configs))
    report = subprocess.run([nvcc_path(), *flags, *(f'-I{d}' for d in include_dirs().values()), '-Xptxas', '-v', '-o', str(cubin), str(cu)],
                            check=True, capture_output=True, text=True).stderr
    tools = [tool('cuobjdump'), tool('nvdisasm')]  # cuobjdump runs nvdisasm, which it looks for on PATH
    path = os.pathsep.join([*{os.path.dirname(t) for t in tools}, os.environ.get('PATH', '')])
    sass = subprocess.run([tools[0], '-sass', str(cubin)], check=True, capture_output=True, text=True, env={**os.environ, 'PATH': path})
    return sass.stdout, report


def tool(name: str) -> str:
    """A CUDA tool on PATH, else the one of its NVIDIA wheel (nvidia-cuda-<name>, in the test extra)."""
    try:
        files = importlib.metadata.files(f'nvidia-cuda-{name}') or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    found = shutil.which(name) or next((str(f.locate()) for f in files if f.name == name), None)
    if found is None:
        pytest.fail(f'no {name}: `pip install -e .[test]` installs nvidia-cuda-{name}')
    return found


@pytest.mark.parametrize('arch', ARCHS, ids=lambda a: a.target)
@pytest.mark.parametrize('decl_name', ['FWD_MUL', 'BWD_MUL'])
def test_gemms_are_tf32_mma_sync(arch, decl_name, tmp_path):
    pytest.importorskip('tilelang')
    from build_tools.lower import lower
    from kernel_src.mhc.norm_fn import gemm

    decl = getattr(gemm, decl_name)
    lowered = lower(decl, SPEC, arch)
    assert TF32_MMA in lowered.source
    assert not re.search(r'wgmma|tcgen05', lowered.source)
    sass, report = compile_and_dump(lowered.source, arch, decl.pass_configs, tmp_path)
    assert 'HMMA.1688.F32.TF32' in sass
    assert '0 bytes spill stores, 0 bytes spill loads' in report


def test_split_count_eps_and_width_are_run_time():
    pytest.importorskip('tilelang')
    from build_tools.lower import lower
    from kernel_src.mhc.norm_fn import gemm, norm

    (launch,) = lower(gemm.FWD_MUL, SPEC, ARCHS[0]).launch['launches']
    assert launch['grid'][1] == 'n_splits'  # the partial buffers' leading dim
    (launch,) = lower(norm.FWD_NORM, {'mhc': 4}, ARCHS[0]).launch['launches']
    assert {'name': 'width', 'kind': 'int32'} in launch['args'] and {'name': 'eps', 'kind': 'float32'} in launch['args']
