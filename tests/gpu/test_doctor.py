"""`python -m tile_kernels_aot doctor` and `list` on a GPU host with the binaries the tests load."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'tile_kernels_aot', *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_doctor_passes():
    result = run_module('doctor', '--device', '0')
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith('ok    CUDA driver ')
    assert any(' served by sm_' in line for line in lines)
    assert any('sha256 and ELF arch of all ' in line for line in lines)
    for family in ('moe', 'quant', 'transpose'):
        assert f'ok    device 0: {family}: ' in result.stdout
    assert lines[-1] == 'doctor: OK'


def test_list_matches_the_loader():
    from tile_kernels_aot._select import prebuilt_specs

    result = run_module('list', 'moe.topk_gate')
    assert result.returncode == 0, result.stderr
    for spec in prebuilt_specs('moe.topk_gate', 0):
        assert f"    num_experts={spec['num_experts']},num_topk={spec['num_topk']}\n" in result.stdout
