"""benchmarks/adversarial.py without a GPU: the case list covers every op of the README's device-check table, each case
has one expected outcome, outcomes and invalid accesses are read from the output as compute-sanitizer prints them,
and benchmarks.record condenses the case records."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks import adversarial, record

from .test_report import write_out_dir

ROOT = Path(__file__).resolve().parents[2]


def test_the_cases_cover_every_op_of_the_readme_table():
    table = re.search(r'\| Op \| Checked on the device \|\n\|---\|---\|\n((?:\|.*\n)+)', (ROOT / 'README.md').read_text())
    assert table, 'the README has no device-check table'
    ops = {op for row in table[1].splitlines() for op in re.findall(r'`(\w+)`', row.split('|')[1])}
    names = adversarial.cases()
    covered = {name.split('.')[0] for name in names}
    assert ops <= covered, ops - covered
    assert {expected for expected, _ in names.values()} == {adversarial.ASSERT, adversarial.TRAP, adversarial.PADDING}
    # A case that stops the kernel traps exactly where the README's row of its op says so (the SwiGLU forward: for
    # bfloat16 input); the padding cases succeed.
    says_trap = {op for row in table[1].splitlines() for op in re.findall(r'`(\w+)`', row.split('|')[1]) if 'trap' in row.split('|')[2]}
    for name, (expected, _) in names.items():
        op = name.split('.')[0]
        traps = op in says_trap and (op != 'swiglu_forward_and_per_token_cast' or '.bf16.' in name)
        if expected != adversarial.PADDING:
            assert (expected == adversarial.TRAP) == traps, name


def test_list_runs_without_a_gpu():
    result = subprocess.run([sys.executable, '-m', 'benchmarks.adversarial', '--list'], capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(adversarial.cases())


def test_outcomes_and_invalid_accesses_are_read_from_the_output():
    assert adversarial.outcome_of('', 0) == adversarial.PADDING
    assert adversarial.outcome_of('RuntimeError: CUDA error: device-side assert triggered\n', 1) == adversarial.ASSERT
    assert adversarial.outcome_of('torch.AcceleratorError: CUDA error: unspecified launch failure', 1) == adversarial.TRAP
    assert adversarial.outcome_of('Segmentation fault', -11) == 'exit -11'
    sanitizer = ['========= Invalid __global__ read of size 4 bytes', '=========     at expand_to_fused_kernel+0x1a0',
                 '========= Invalid __shared__ write of size 4 bytes', '========= ERROR SUMMARY: 0 errors']
    assert [line for line in sanitizer if adversarial.INVALID_ACCESS.search(line)] == sanitizer[::2][:2]


def test_record_condenses_the_case_records(tmp_path):
    out = write_out_dir(tmp_path / 'out')
    rows = [{'case': 'reduce_fused.past', 'expected': adversarial.ASSERT, 'found': adversarial.ASSERT, 'invalid_accesses': 0,
             'sanitizer': 'memcheck', 'passed': True},
            {'case': 'topk_gate.nan', 'expected': adversarial.ASSERT, 'found': adversarial.PADDING, 'invalid_accesses': 2,
             'sanitizer': 'memcheck', 'passed': False}]
    (out / 'adversarial.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    lines = [line for line in record.condense(out) if line['type'] == 'adversarial']
    assert lines == [{'type': 'adversarial', 'sanitizer': 'memcheck', 'cases': 2, 'held': 1, 'invalid_accesses': 2,
                      'failed': ['topk_gate.nan']}]
