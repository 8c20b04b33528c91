"""The kernels' own checks of index and gating values (kernel_src/bounds.py), with the host checks off: one case of
benchmarks/adversarial.py per op and kind of bad value, each in a process of its own (a failed device assert ends
the CUDA context), ends as the rule says. `.ci/gpu-run.sh adversarial` runs every case under memcheck."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import adversarial

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _sample() -> list[str]:
    """The first case of each op, argument or dtype, and outcome, and every int64 value that a wrapping read would
    turn into a valid index."""
    seen, names = set(), []
    for name, (expected, _) in adversarial.cases().items():
        op, variant = name.split('.')[:2]
        key = (op, variant, expected)
        if key not in seen or name.endswith(f'.{2**32 + 1}'):
            seen.add(key)
            names.append(name)
    return names


@pytest.mark.parametrize('name', _sample())
def test_a_bad_value_ends_as_the_rule_says(name):
    expected, _ = adversarial.cases()[name]
    env = {k: v for k, v in os.environ.items() if k != 'TILE_KERNELS_AOT_CHECK_INDICES'}
    result = subprocess.run([sys.executable, '-m', 'benchmarks.adversarial', '--case', name], capture_output=True, text=True, env=env,
                            cwd=ROOT, timeout=300, check=False)
    output = result.stdout + result.stderr
    assert adversarial.outcome_of(output, result.returncode) == expected, output[-2000:]
