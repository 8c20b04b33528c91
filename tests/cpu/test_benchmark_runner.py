"""benchmarks/run.py's loop without a GPU (stub timings): rows reach --out as they are measured, an installed kernel
without a case is an error row, and a case that never returns ends the process with a traceback instead of holding
the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

STUBS = '''
import sys, time, torch
import benchmarks.run as run
class Timer:
    def device_times(self, fn, iters=30):
        fn()
        return [12.0, 10.0, 9.0]
run.Timer = Timer
run.copy_bandwidth = lambda timer: 4000.0
run.SameSizeCopy = lambda timer: (lambda moved: 5.0)
run.prebuilt_specs = lambda kernel, device: [{'n': 1}, {'n': 2}]
run.installed_kernels = lambda: ['k.a']
torch.cuda.get_device_name = lambda index: 'stub'
torch.cuda.empty_cache = lambda: None
run.CASE_TIMEOUT_S = 2
'''


def _run(tmp_path: Path, cases: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / 'bench.jsonl'
    script = STUBS + textwrap.dedent(cases) + f'\nsys.argv = ["run", "--out", {str(out)!r}]\nsys.exit(run.main())\n'
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return done, rows


def test_every_case_is_a_row(tmp_path):
    done, rows = _run(tmp_path, "run.CASES = {'k.a': lambda spec, tokens: [('one', lambda: None, 1e6), ('two', lambda: None, 2e6)]}")
    assert done.returncode == 0, done.stderr
    assert rows[0] == {'kernel': 'copy', 'gbs': 4000.0, 'gpu': 'stub'}
    assert [(r['spec']['n'], r['shape']) for r in rows[1:]] == [(1, 'one'), (1, 'two'), (2, 'one'), (2, 'two')]
    assert (rows[1]['us'], rows[1]['min_us'], rows[1]['max_us'], rows[1]['tokens']) == (10.0, 9.0, 12.0, 8192)
    assert rows[2]['gbs'] == pytest.approx(200.0) and rows[2]['of_same_size_copy'] == pytest.approx(0.5)


def test_an_installed_kernel_without_a_case_is_an_error_row_and_fails_the_run(tmp_path):
    done, rows = _run(tmp_path, """
        run.installed_kernels = lambda: ['k.a', 'k.new']
        run.CASES = {'k.a': lambda spec, tokens: ('one', lambda: None, 1e6)}
    """)
    assert done.returncode == 1
    assert rows[1]['kernel'] == 'k.new' and 'no benchmark case' in rows[1]['error']
    assert [r['shape'] for r in rows[2:]] == ['one', 'one']


def test_a_case_that_never_returns_ends_the_run_and_keeps_the_rows_before_it(tmp_path):
    done, rows = _run(tmp_path, '''
        def case(spec, tokens):
            return ('hangs' if spec['n'] == 2 else 'returns', (lambda: time.sleep(60)) if spec['n'] == 2 else (lambda: None), 1e6)
        run.CASES = {'k.a': case}
    ''')
    assert done.returncode != 0
    assert 'Timeout' in done.stderr and 'device_times' in done.stderr
    assert [r.get('shape') for r in rows] == [None, 'returns']


def test_the_kernel_selection_takes_comma_separated_globs():
    from benchmarks.run import select

    cases = {'moe.topk_gate': None, 'moe.reduce_fused': None, 'quant.per_token_cast': None}
    installed = ['moe.topk_gate', 'moe.reduce_fused', 'quant.per_token_cast', 'engram.engram_hash']
    assert select(cases, 'moe.topk_gate,quant.*', installed) == (['moe.topk_gate', 'quant.per_token_cast'], [])
    assert select(cases, '*', installed) == (['moe.topk_gate', 'moe.reduce_fused', 'quant.per_token_cast'], ['engram.engram_hash'])


def test_ab_times_each_case_on_both_sides_in_turn(tmp_path):
    """--ab: each case on the installed binaries and on DIR's, through TILE_KERNELS_AOT_KERNEL_DIRS, in the order base,
    new, new, base, ...; each side's round r in PREFIX-side-r.jsonl; the environment as it was afterwards."""
    prefix = tmp_path / 'ab'
    script = STUBS + textwrap.dedent('''
        import os
        sides = []
        class SideTimer(Timer):
            def device_times(self, fn, iters=30):
                side = 'new' if os.environ.get(run.KERNEL_DIRS_ENV) else 'base'
                sides.append(side)
                return [2.0] if side == 'new' else [4.0]
        run.Timer = SideTimer
        run._select.reset = lambda: None
        run.CASES = {'k.a': lambda spec, tokens: ('one', lambda: None, 1e6)}
        os.environ.pop(run.KERNEL_DIRS_ENV, None)
    ''') + f'sys.argv = ["run", "--ab", {str(tmp_path)!r}, "--rounds", "3", "--out", {str(prefix)!r}]\n' \
        + 'rc = run.main()\nprint(sides, os.environ.get(run.KERNEL_DIRS_ENV))\nsys.exit(rc)\n'
    done = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    order = ['base', 'new', 'new', 'base', 'base', 'new']
    assert done.stdout.splitlines()[-1] == f'{order * 2} None'  # two specs, three rounds each
    for side, us in (('base', 4.0), ('new', 2.0)):
        for r in (1, 2, 3):
            rows = [json.loads(line) for line in Path(f'{prefix}-{side}-{r}.jsonl').read_text().splitlines()]
            assert [(row['spec'], row['shape'], row['us']) for row in rows] == [({'n': 1}, 'one', us), ({'n': 2}, 'one', us)]


def test_ab_needs_an_output_prefix():
    done = subprocess.run([sys.executable, '-m', 'benchmarks.run', '--ab', 'somewhere'], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and '--ab needs --out PREFIX' in done.stderr
