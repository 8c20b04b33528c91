"""The build, for real: tilelang lowering, nvcc, manifests, wheels (no GPU needed)."""

from __future__ import annotations

import email.parser
import hashlib
import json
import platform
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from build_tools.cubin_info import frame_bytes
from kernel_src.decl import Arch
from kernel_src.registry import DECLS
from tile_kernels_aot.cubin import cubin_sm
from tile_kernels_aot.manifest import manifest_from_json

from .conftest import SUBSET, build_subset

pytestmark = pytest.mark.build
TARGETS = {'sm_90a': 90, 'sm_100f': 100}


def wheel_metadata(path: Path) -> email.message.Message:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))
        return email.parser.Parser().parsestr(z.read(name).decode())


def test_manifest_records_every_binary(built):
    for target, sm in TARGETS.items():
        root = built / 'build' / target
        manifest = manifest_from_json((root / 'manifest.json').read_text())
        assert manifest.target == target
        assert manifest.provenance['tilelang'] == '0.1.15'
        assert manifest.provenance['nvcc'].startswith('13.')
        assert sorted(manifest.kernels) == sorted({s['kernel'] for s in SUBSET})
        for item in SUBSET:
            info = manifest.kernels[item['kernel']]
            (entry,) = info.entries.values()
            assert entry.params == item['params']
            assert entry.target == target
            assert entry.constants == DECLS[item['kernel']].constants_for(Arch(target), entry.params)
            cubin = (root / entry.cubin).read_bytes()
            assert hashlib.sha256(cubin).hexdigest() == entry.sha256
            assert cubin_sm(cubin) == sm
            (launch,) = entry.launches
            assert launch.symbol.endswith('_kernel') and launch.block[0] in (32, 64, 128, 256)
            assert all(isinstance(b, int) for b in launch.block)
            prov = manifest.provenance['kernels'][item['kernel']]
            assert f'-gencode=arch=compute_{target[3:]},code={target}' in prov['nvcc_flags']
            assert len(prov['kernel_sources_sha256']) == 64


def test_launch_metadata_is_read_from_the_lowering(built):
    manifest = manifest_from_json((built / 'build' / 'sm_90a' / 'manifest.json').read_text())
    (entry,) = manifest.kernels['moe.topk_gate'].entries.values()
    (launch,) = entry.launches
    assert [(a.name, a.kind) for a in launch.args] == [('scores', 'ptr'), ('topk_idx', 'ptr'), ('num_tokens', 'int32'), ('row_stride', 'int32')]
    assert launch.grid == (['//', ['+', 'num_tokens', 3], 4], 1, 1)
    scores = next(b for b in entry.buffers if b.name == 'scores')
    assert scores.shape == ('num_tokens', 256) and scores.strides == ('row_stride', 1) and scores.dtype == 'float32'
    assert not launch.cooperative and launch.cluster_dims is None and not launch.pdl and launch.dynamic_smem == 0


def test_wheels_contents_and_metadata(built):
    wheels = sorted((built / 'dist').glob('*.whl'))
    names = [w.name for w in wheels]
    machine = platform.machine()
    assert names == [
        'tile_kernels_aot-0.1.0-py3-none-any.whl',
        f'tile_kernels_aot_runtime-0.1.0-cp311-abi3-manylinux2014_{machine}.whl',
        'tile_kernels_aot_runtime-0.1.0-py3-none-any.whl',
        'tile_kernels_aot_sm100f-0.1.0-py3-none-any.whl',
        'tile_kernels_aot_sm90a-0.1.0-py3-none-any.whl',
    ]
    wheels.pop(1)  # the native runtime: below, the other four; its own test is test_native_runtime_wheel
    for wheel in wheels:
        assert wheel.stat().st_size < 50 * 2**20
        meta = wheel_metadata(wheel)
        assert meta['Version'] == '0.1.0' and '+' not in meta['Version']  # PyPI rejects local labels
        assert meta['License-Expression'] == 'MIT'
    meta = wheel_metadata(wheels[0])
    assert sorted(meta.get_all('Requires-Dist')) == [
        'tile-kernels-aot-runtime==0.1.0', 'tile-kernels-aot-sm100f==0.1.0', 'tile-kernels-aot-sm90a==0.1.0']
    runtime = wheel_metadata(wheels[1])
    assert any(r.startswith('torch') for r in runtime.get_all('Requires-Dist'))
    with zipfile.ZipFile(wheels[1]) as z:
        files = z.namelist()
        assert 'tile_kernels_aot/_launch.py' in files and not any('kernel_src' in f or 'build_tools' in f for f in files)
    for wheel, target in ((wheels[3], 'sm90a'), (wheels[2], 'sm100f')):
        assert wheel_metadata(wheel).get_all('Requires-Dist') == ['tile-kernels-aot-runtime==0.1.0']
        with zipfile.ZipFile(wheel) as z:
            files = set(z.namelist())
            manifest = manifest_from_json(z.read(f'tile_kernels_aot_{target}/manifest.json').decode())
            for info in manifest.kernels.values():
                for entry in info.entries.values():
                    assert f'tile_kernels_aot_{target}/{entry.cubin}' in files
                    assert f'tile_kernels_aot_{target}/{entry.source}' in files
                    source = z.read(f'tile_kernels_aot_{target}/{entry.source}').decode()
                    assert entry.launches[0].symbol in source
            assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in z.infolist())


def test_native_runtime_wheel(built):
    """The native runtime wheel is the pure one plus the C extension and its source, and the extension launches
    through the driver function it is bound to."""
    (native,) = (built / 'dist').glob('tile_kernels_aot_runtime-*-abi3-*.whl')
    (pure,) = (built / 'dist').glob('tile_kernels_aot_runtime-*-py3-none-any.whl')
    with zipfile.ZipFile(native) as zn, zipfile.ZipFile(pure) as zp:
        extra = set(zn.namelist()) - set(zp.namelist())
        assert {n for n in extra if 'dist-info' not in n} == {'tile_kernels_aot/_driver_native.abi3.so', 'tile_kernels_aot/_driver_native.c'}
        assert not any('_driver_native' in n for n in zp.namelist())
    assert wheel_metadata(native)['Version'] == '0.1.0'


def test_noop_rebuild_is_fast_and_touches_nothing(built, capsys):
    files = sorted(p for p in (built / 'build').rglob('*') if p.is_file() and 'wheels' not in p.parts and p.name != '.lock')
    before = {p: p.stat().st_mtime_ns for p in files}
    start = time.monotonic()
    build_subset(built)
    elapsed = time.monotonic() - start
    output = capsys.readouterr().out
    assert elapsed < 10, f'no-op rebuild took {elapsed:.1f}s'
    assert 'all 6 kernels up to date' in output
    assert 'nvcc: all 6 cubins up to date' in output and '] nvcc ' not in output  # ninja had no work
    assert output.count(': up to date') == 5  # every wheel (the runtime's two)
    assert {p: p.stat().st_mtime_ns for p in files} == before


def test_two_builds_are_byte_identical(built, tmp_path):
    build_subset(tmp_path)
    for target in TARGETS:
        a, b = built / 'build' / target, tmp_path / 'build' / target
        assert (a / 'manifest.json').read_bytes() == (b / 'manifest.json').read_bytes()
        for cubin in a.rglob('*.cubin'):
            assert cubin.read_bytes() == (b / cubin.relative_to(a)).read_bytes(), cubin
    for wheel in (built / 'dist').glob('*.whl'):
        assert wheel.read_bytes() == (tmp_path / 'dist' / wheel.name).read_bytes(), wheel.name


def test_lowering_failure_names_the_kernel_and_writes_no_wheel(tmp_path):
    from build_tools.build import BuildArgs, build
    from build_tools.util import BuildError
    from kernel_src.decl import Arch

    with pytest.raises(BuildError) as info:
        build(BuildArgs(archs=(Arch('sm_90a'),), kernels=('test.broken_lowering',), registry='tests.cpu.fixture_kernels',
                        partial_wheels=True, jobs=1, out=tmp_path / 'dist', build_dir=tmp_path / 'build'))
    message = str(info.value)
    assert 'test.broken_lowering[size=3] for sm_90a' in message and 'deliberately broken factory' in message
    assert not (tmp_path / 'dist').exists()


def test_nvcc_failure_names_the_binary_and_writes_no_wheel(tmp_path):
    from build_tools.build import BuildArgs, build
    from build_tools.util import BuildError
    from kernel_src.decl import Arch

    with pytest.raises(BuildError) as info:
        build(BuildArgs(archs=(Arch('sm_90a'),), kernels=('test.broken_nvcc',), registry='tests.cpu.fixture_kernels',
                        partial_wheels=True, jobs=1, out=tmp_path / 'dist', build_dir=tmp_path / 'build'))
    assert 'sm_90a/cubins/test.broken_nvcc/e8-k2.cubin' in str(info.value)
    assert not (tmp_path / 'dist').exists()


def test_bad_specs_file_is_rejected_with_the_reason(tmp_path):
    from build_tools.build import BuildArgs, plan
    from build_tools.util import BuildError
    from kernel_src.decl import Arch

    bad = tmp_path / 'specs.json'
    bad.write_text(json.dumps([{'kernel': 'moe.topk_gate', 'params': {'num_experts': 8, 'num_topk': 9}}]))
    with pytest.raises(BuildError, match=r'item 0 \(moe.topk_gate\): num_topk must be in'):
        plan(BuildArgs(archs=(Arch('sm_90a'),), specs_file=bad))
    bad.write_text(json.dumps([{'kernel': 'moe.nope', 'params': {}}]))
    with pytest.raises(BuildError, match="unknown kernel 'moe.nope'"):
        plan(BuildArgs(archs=(Arch('sm_90a'),), specs_file=bad))


def test_partial_build_refuses_wheels_unless_asked():
    """An arch wheel of some kernels only would replace the installed one, losing the rest (one arch package per
    target): --kernels and --only-specs build folders for TILE_KERNELS_AOT_KERNEL_DIRS, wheels only on request."""
    from build_tools.__main__ import parse_args
    from build_tools.build import plan
    from build_tools.util import BuildError

    with pytest.raises(BuildError, match=r'leaves out \d+ of the \d+ kernels .* --no-wheels'):
        plan(parse_args(['--arch', 'sm90', '--kernels', 'moe.topk_gate']))
    specs = plan(parse_args(['--arch', 'sm90', '--kernels', 'moe.topk_gate', '--no-wheels']))
    assert {job.decl.name for job in specs} == {'moe.topk_gate'}
    assert plan(parse_args(['--arch', 'sm90', '--kernels', 'moe.topk_gate', '--partial-wheels'])) == specs
    assert len(plan(parse_args(['--arch', 'sm90']))) > len(specs)  # the whole set needs no flag


def test_kernel_sources_are_the_module_and_its_kernel_src_imports():
    """Editing one family's file re-lowers that family only; a shared helper module re-lowers its users."""
    from build_tools.build import KERNEL_SRC, _kernel_src_closure

    def closure(module):
        return {p.relative_to(KERNEL_SRC).as_posix() for p in _kernel_src_closure(module)}

    swiglu = closure('kernel_src.quant.swiglu.forward')
    assert {'quant/swiglu/forward.py', 'quant/swiglu/common.py', 'quant/common.py', 'decl.py', 'cuda/swiglu_div.cuh'} <= swiglu
    assert 'quant/cast_back.py' not in swiglu and 'models.py' not in swiglu
    assert 'quant/common.py' not in closure('kernel_src.transpose.batched_transpose')


def test_built_kernels_keep_their_working_set_in_registers(built):
    for target in TARGETS:
        for cubin in (built / 'build' / target / 'cubins').rglob('*.cubin'):
            assert frame_bytes(cubin.read_bytes()) == 0, cubin


def test_frame_bytes_reads_the_local_memory_ptxas_gave(tmp_path):
    """A kernel with a dynamically indexed local array (which must live in local memory) and one without."""
    source = tmp_path / 'k.cu'
    source.write_text(
        'extern "C" __global__ void local_array(float* out, int i) { float a[64] = {};\n'
        '  for (int k = 0; k < 64; ++k) a[(k * i) & 63] += out[k];\n  out[0] = a[i & 63]; }\n'
        'extern "C" __global__ void in_registers(float* out) { out[threadIdx.x] += 1.0f; }\n')
    cubin = tmp_path / 'k.cubin'
    subprocess.run(['nvcc', '-cubin', '-O3', '-gencode=arch=compute_90a,code=sm_90a', '-o', str(cubin), str(source)], check=True)
    assert frame_bytes(cubin.read_bytes()) == 256
    source.write_text('extern "C" __global__ void in_registers(float* out) { out[threadIdx.x] += 1.0f; }\n')
    subprocess.run(['nvcc', '-cubin', '-O3', '-gencode=arch=compute_90a,code=sm_90a', '-o', str(cubin), str(source)], check=True)
    assert frame_bytes(cubin.read_bytes()) == 0
