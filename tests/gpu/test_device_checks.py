"""The kernels' own checks of index and gating values (kernel_src/bounds.py), with the host checks off: each case of
benchmarks/adversarial.sample() (each op, argument or dtype and outcome) runs in a process of its own (a failed
device assert ends the CUDA context) and ends as the rule says. `.ci/gpu-run.sh adversarial` runs the cases under
memcheck."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import adversarial

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize('name', adversarial.sample())
def test_a_bad_value_ends_as_the_rule_says(name):
    expected, _ = adversarial.cases()[name]
    env = {k: v for k, v in os.environ.items() if k != 'TILE_KERNELS_AOT_CHECK_INDICES'}
    result = subprocess.run([sys.executable, '-m', 'benchmarks.adversarial', '--case', name], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert adversarial.outcome_of(output, result.returncode) == expected, output[-2000:]
