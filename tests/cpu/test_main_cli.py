"""`python -m tile_kernels_aot {doctor,list,version}` without a GPU: list and version read the installed manifests
(the subset build here); doctor says there is no GPU in one line, and with a faked device and driver it reports the
arch package, the cubins' sha256 and each family's launch check. tests/gpu/test_main_cli.py runs doctor on a GPU."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tile_kernels_aot import __main__ as cli
from tile_kernels_aot import __version__, _select

from .test_select import fake_device  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent.parent


def run_module(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'tile_kernels_aot', *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


@pytest.fixture
def installed(built, monkeypatch):
    """The subset build as the only installed arch packages (sm_90a and sm_100f)."""
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, f"{built / 'build' / 'sm_90a'}{os.pathsep}{built / 'build' / 'sm_100f'}")
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    _select.reset()
    yield built
    _select.reset()


def test_doctor_without_a_gpu_says_so_in_one_line():
    result = run_module('doctor', env={'CUDA_VISIBLE_DEVICES': ''})
    assert result.returncode == 1
    assert result.stdout == ''
    (line,) = result.stderr.splitlines()
    assert line.startswith('python -m tile_kernels_aot doctor: no CUDA GPU: torch ')


def test_version(installed, capsys):
    assert cli.main(['version']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f'tile-kernels-aot {__version__} (')
    assert lines[1].startswith(f'torch {torch.__version__}')
    assert lines[2].startswith(f'sm_90a: tile-kernels-aot-sm90a {__version__} (TILE_KERNELS_AOT_KERNEL_DIRS (')
    assert 'built with tilelang 0.1.15, nvcc 13.' in lines[2]
    assert lines[3].startswith('sm_100f: tile-kernels-aot-sm100f')


def test_version_as_a_module():
    result = run_module('version', env={_select.KERNEL_DIRS_ENV: ''})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f'tile-kernels-aot {__version__} (')


def test_list(installed, capsys):
    assert cli.main(['list']) == 0
    out = capsys.readouterr().out
    assert out.startswith('sm_90a (TILE_KERNELS_AOT_KERNEL_DIRS (')
    assert '): 3 kernels, 3 specs\n  moe.topk_gate: 1 spec\n    num_experts=256,num_topk=8\n  quant.per_token_cast: 1 spec\n' in out
    assert '\nsm_100f (' in out


def test_list_filters_by_glob_and_target(installed, capsys):
    assert cli.main(['list', 'moe.*', '*transpose', '--target', 'sm_100f']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith('): 2 kernels, 2 specs')
    assert [line.strip() for line in lines[1:]] == [
        'moe.topk_gate: 1 spec', 'num_experts=256,num_topk=8',
        'transpose.batched_transpose: 1 spec', 'elem_bytes=2,vec_bytes=16,tile_m=64,tile_n=64']


def test_list_json_is_a_specs_file(installed, capsys, tmp_path):
    from build_tools.build import read_specs_file, registry

    assert cli.main(['list', '--json']) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 3  # each spec once, though both targets have it
    specs = tmp_path / 'specs.jsonl'
    specs.write_text(out)
    assert read_specs_file(specs, registry('kernel_src.registry'))['moe.topk_gate'] == [{'num_experts': 256, 'num_topk': 8}]


@pytest.mark.parametrize('argv, message', [
    (['list', 'moe.topk_gat'], "no installed kernel matches 'moe.topk_gat'; close names: moe.topk_gate"),
    (['list', '--target', 'sm_80'], 'no arch package for sm_80 is installed (installed: sm_90a, sm_100f)'),
])
def test_list_errors_are_one_line(installed, capsys, argv, message):
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == '' and captured.err == f'python -m tile_kernels_aot list: {message}\n'


def test_list_with_nothing_installed(monkeypatch, capsys):
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, '')
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    _select.reset()
    try:
        assert cli.main(['list']) == 1
    finally:
        _select.reset()
    assert capsys.readouterr().err.startswith('python -m tile_kernels_aot list: no arch package is installed: pip install tile-kernels-aot')


def test_a_broken_install_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(tmp_path / 'nowhere'))
    _select.reset()
    try:
        assert cli.main(['list']) == 1
    finally:
        _select.reset()
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('python -m tile_kernels_aot list: KernelDirError: ')


# -- doctor with a faked device ----------------------------------------------------------------------------------


@pytest.fixture
def faked_gpu(fake_device, monkeypatch):  # noqa: F811
    """An H200 as the one device, a driver that loads, and launch checks that pass (each test may replace one)."""
    from tile_kernels_aot import _driver

    fake_device[0] = ('NVIDIA H200', (9, 0))
    monkeypatch.setattr(cli, 'no_gpu_reason', lambda: None)
    monkeypatch.setattr(cli, 'driver_version', lambda: '13.0')
    monkeypatch.setattr(_driver, 'driver', lambda: None)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setattr(cli, 'torch_device', lambda index: contextlib.nullcontext())
    monkeypatch.setattr(cli, 'synchronize', lambda index: None)
    monkeypatch.setattr(cli, '_verified', {})
    checks = {family: (lambda index, family=family: f'{family} op') for family in ('moe', 'quant', 'transpose')}
    monkeypatch.setattr(cli, 'FAMILY_CHECKS', checks)
    return checks


def test_doctor_reports_each_check(faked_gpu, capsys):
    assert cli.main(['doctor']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('ok    CUDA driver 13.0 (libcuda.so.1), torch ')
    assert lines[1:] == [
        'ok    device 0: NVIDIA H200, compute capability 9.0',
        f"ok    device 0: served by sm_90a from {_select.package_for_device(0).origin}, because "
        'sm_90a: accepted (sm_90a runs only on compute capability 9.0); '
        'sm_100f: rejected (sm_100f runs on compute capability 10.0 to 10.9)',
        'ok    sm_90a: sha256 and ELF arch of all 3 cubins match the manifest',
        'ok    device 0: moe: moe op equal to the reference',
        'ok    device 0: quant: quant op equal to the reference',
        'ok    device 0: transpose: transpose op equal to the reference',
        'doctor: OK',
    ]


def test_doctor_fails_on_a_wrong_result(faked_gpu, capsys):
    def wrong(index):
        raise AssertionError('moe.topk_gate differs from the reference in 3 of 4096 elements')

    faked_gpu['moe'] = wrong
    assert cli.main(['doctor']) == 1
    captured = capsys.readouterr()
    assert 'FAIL  device 0: moe launch: AssertionError: moe.topk_gate differs from the reference in 3 of 4096 elements\n' in captured.out
    assert 'ok    device 0: quant: quant op equal to the reference\n' in captured.out  # the other checks still run
    assert captured.err == ('python -m tile_kernels_aot doctor: device 0: moe launch: AssertionError: '
                            'moe.topk_gate differs from the reference in 3 of 4096 elements\n')


def test_doctor_fails_on_a_damaged_cubin(faked_gpu, fake_device, monkeypatch, tmp_path, capsys):  # noqa: F811
    copy = tmp_path / 'sm_90a'
    shutil.copytree(_select.package_for_device(0).root, copy)
    cubin = next(copy.rglob('e256-k8.cubin'))
    data = bytearray(cubin.read_bytes())
    data[-1] ^= 0xFF
    cubin.write_bytes(bytes(data))
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(copy))
    monkeypatch.setenv(_select.VERIFY_ENV, '0')  # doctor checks every cubin whatever the setting
    _select.reset()
    assert cli.main(['doctor']) == 1
    captured = capsys.readouterr()
    assert 'FAIL  sm_90a: CubinChecksumError: ' in captured.out and 'e256-k8.cubin' in captured.out
    assert captured.err.startswith('python -m tile_kernels_aot doctor: sm_90a: CubinChecksumError: ')
    assert captured.err.count('\n') == 1


def test_doctor_on_an_unsupported_gpu(faked_gpu, fake_device, capsys):  # noqa: F811
    fake_device[0] = ('NVIDIA A100-SXM4-80GB', (8, 0))
    assert cli.main(['doctor']) == 1
    captured = capsys.readouterr()
    assert ('FAIL  device 0: UnsupportedDeviceError: no tile-kernels-aot binaries run on NVIDIA A100-SXM4-80GB '
            '(compute capability 8.0).') in captured.out
    assert captured.err.startswith('python -m tile_kernels_aot doctor: device 0: UnsupportedDeviceError: ')


def test_doctor_on_a_device_that_is_not_there(faked_gpu, capsys):
    assert cli.main(['doctor', '--device', '3']) == 1
    assert capsys.readouterr().err == 'python -m tile_kernels_aot doctor: device 3: no such device (1 visible)\n'
