"""The measurement records and the tables made from them: docs/benchmarks.md and the README's performance table are
exactly what `python -m benchmarks.report` makes from docs/measurements, and `python -m benchmarks.record` condenses a
GPU run's raw output folder into a record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import record, report


def test_committed_tables_are_the_generators_output():
    sources = report.Sources.of(report.load_records())
    assert report.BENCHMARKS_MD.read_text() == report.benchmarks_md(sources), 'docs/benchmarks.md is stale: run python -m benchmarks.report'
    readme = report.README.read_text()
    assert report.replace_region(readme, report.readme_region(sources)) == readme, 'README.md\'s table is stale: run python -m benchmarks.report'


def test_committed_records_are_records():
    for path in sorted(report.MEASUREMENTS.glob('*.jsonl')):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        env = lines[0]
        assert env['type'] == 'environment' and env['format'] == record.FORMAT, path
        assert path.stem.startswith(env['date'][:10]) and env['commit'] and env['gpu'], path
        assert {line['type'] for line in lines[1:]} <= {'case', 'upstream', 'error', 'cold_start', 'tests', 'sanitizer', 'note', 'ep_moe',
                                                    'adversarial', 'host', 'ab'}, path


ENVIRONMENT = '''2026-12-24T10:00:00Z
NVIDIA H200, 580.159.04, 143771 MiB, 1980 MHz, 1980 MHz
python 3.12.3 torch 2.11.0+cu130 cuda 13.0
tile_kernels_aot-0.2.0-py3-none-any.whl
tile_kernels_aot_runtime-0.2.0-py3-none-any.whl
tile_kernels_aot_sm90a-0.2.0-py3-none-any.whl
compute_capability 9.0
commit 1234abc
kernels *
tests tests/gpu
built_with_tilelang 0.1.15
built_with_nvcc 13.0.88
'''

BENCH = [
    {'kernel': 'copy', 'gbs': 4200.04, 'gpu': 'NVIDIA H200'},
    {'kernel': 'moe.topk_gate', 'spec': {'num_experts': 256, 'num_topk': 8}, 'shape': 'T=8192', 'tokens': 8192, 'us': 12.61234, 'min_us': 12.5,
     'max_us': 13.0, 'gbs': 700.0, 'of_copy': 0.16666, 'of_same_size_copy': 0.5,
     'decode': {'1': {'graph_us': 1.234, 'host_us': 30.11}, '128': {'graph_us': 2.5, 'host_us': 31.0}}},
    {'kernel': 'quant.new_kernel', 'error': 'no benchmark case: quant.new_kernel is installed but benchmarks/run.py has no entry for it in CASES'},
]
UPSTREAM = [
    {'kernel': 'copy', 'gbs': 4210.0, 'upstream_import_s': 12.5, 'tilelang': '0.1.15', 'upstream_version': None},
    {'kernel': 'moe.topk_gate', 'shape': 'E256 K8', 'tokens': 8192, 'same_result': True, 'bitwise': False, 'upstream_first_call_s': 2.0,
     'ours_us': 12.6, 'upstream_us': 13.5, 'ours_of_copy': 0.167, 'upstream_of_copy': 0.156},
    {'kernel': 'quant.swiglu_forward_and_per_token_cast', 'error': 'RuntimeError: does not build (legacy reducer)'},
]
JUNIT = ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="2" skipped="1" tests="10" '
         'time="50.25"></testsuite></testsuites>')
COLD = '{"import_ms": 47.123, "total_ms": 64.0}\n{"import_ms": 46.0, "total_ms": 63.0}\n'
SANITIZE = '''## memcheck, kernels quant.*
========= COMPUTE-SANITIZER
3 specs ran (4 cases)
========= ERROR SUMMARY: 0 errors
## racecheck, kernels quant.*
========= COMPUTE-SANITIZER
3 specs ran (4 cases)
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
## racecheck: FAILED (exit 1)
'''


def write_out_dir(out: Path, junit: bool = True) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / 'environment.txt').write_text(ENVIRONMENT)
    (out / 'bench.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in BENCH))
    (out / 'upstream.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in UPSTREAM))
    if junit:
        (out / 'junit.xml').write_text(JUNIT)
    (out / 'pytest.log').write_text('....\nFAILED tests/gpu/test_x.py::test_y\n7 passed, 2 failed, 1 skipped in 50.25s\n')
    (out / 'cold_start.log').write_text(COLD)
    (out / 'sanitize.log').write_text(SANITIZE)
    return out


def test_record_condenses_a_run_folder(tmp_path):
    lines = record.condense(write_out_dir(tmp_path / 'out'))
    by_type: dict[str, list[dict]] = {}
    for line in lines:
        by_type.setdefault(line['type'], []).append(line)
    assert lines[0]['type'] == 'environment'
    env = by_type['environment'][0]
    expected = {'date': '2026-12-24T10:00:00Z', 'gpu': 'NVIDIA H200', 'compute_capability': '9.0', 'driver': '580.159.04', 'torch': '2.11.0+cu130',
                'cuda': '13.0', 'python': '3.12.3', 'commit': '1234abc', 'version': '0.2.0', 'built_with_tilelang': '0.1.15',
                'built_with_nvcc': '13.0.88', 'copy_gbs': 4200.0, 'upstream_copy_gbs': 4210.0, 'upstream_tilelang': '0.1.15',
                'upstream_import_s': 12.5}
    assert {k: env[k] for k in expected} == expected
    assert by_type['case'] == [{
        'type': 'case', 'kernel': 'moe.topk_gate', 'spec': {'num_experts': 256, 'num_topk': 8}, 'shape': 'T=8192', 'tokens': 8192,
        'median_us': 12.61, 'min_us': 12.5, 'max_us': 13.0, 'gbs': 700, 'of_copy': 0.1667, 'of_same_size_copy': 0.5,
        'decode': {'1': [1.23, 30.1], '128': [2.5, 31.0]}}]
    assert by_type['error'][0]['kernel'] == 'quant.new_kernel'
    assert [u.get('same_result') for u in by_type['upstream']] == [True, None]
    assert by_type['upstream'][0]['bitwise'] is False  # a comparison's diagnostic flags are kept
    assert 'error' in by_type['upstream'][1]
    assert by_type['cold_start'] == [{'type': 'cold_start', 'what': 'ops', 'runs': [{'import_ms': 47.12, 'total_ms': 64.0}, {'import_ms': 46.0, 'total_ms': 63.0}]}]
    assert by_type['tests'] == [{'type': 'tests', 'passed': 7, 'failed': 2, 'skipped': 1, 'errors': 0, 'seconds': 50.2}]
    assert by_type['sanitizer'] == [
        {'type': 'sanitizer', 'tool': 'memcheck', 'kernels': 'quant.*', 'specs': 3, 'cases': 4, 'errors': 0, 'exit': 0},
        {'type': 'sanitizer', 'tool': 'racecheck', 'kernels': 'quant.*', 'specs': 3, 'cases': 4, 'errors': 1, 'exit': 1}]


def test_record_condenses_an_ab_of_rounds_with_its_control(tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    (out / 'environment.txt').write_text(ENVIRONMENT)
    (out / 'ab.json').write_text(json.dumps({'build': 'build-nochecks/sm_90a', 'label': 'device checks', 'kernels': 'moe.*'}))
    row = lambda kernel, us: json.dumps({'kernel': kernel, 'spec': {}, 'shape': 'T', 'tokens': 8192, 'us': us}) + '\n'  # noqa: E731
    for round_, (base, new) in enumerate(((10.0, 9.0), (10.4, 9.4)), start=1):
        (out / f'ab-base-{round_}.jsonl').write_text(row('moe.aux_fi', base) + row('moe.group_count', 5.0))
        (out / f'ab-new-{round_}.jsonl').write_text(row('moe.aux_fi', new) + row('moe.group_count', 5.0))
    condensed = record.condense(out)
    lines = [line for line in condensed if line['type'] == 'ab']
    assert lines == [
        {'type': 'ab', 'build': 'build-nochecks/sm_90a', 'label': 'device checks', 'kernel': 'moe.aux_fi', 'rounds': 2, 'cases': 1,
         'median_ratio': 0.902, 'max_ratio': 0.902, 'control_ratio': 1.04},
        {'type': 'ab', 'build': 'build-nochecks/sm_90a', 'label': 'device checks', 'kernel': 'moe.group_count', 'rounds': 2, 'cases': 1,
         'median_ratio': 1.0, 'max_ratio': 1.0, 'control_ratio': 1.0}]
    region = report.reliability_region([report.Record('2026-12-24-h200', condensed[0], condensed[1:])])
    assert '| moe.aux_fi | 1 | 0.902 | 1.040 |' in region and 'device checks' in region


def test_record_adds_the_tests_run_alone_to_the_workers_tests(tmp_path):
    out = write_out_dir(tmp_path / 'out')
    (out / 'junit-alone.xml').write_text(JUNIT.replace('failures="2" skipped="1" tests="10" time="50.25"',
                                                       'failures="0" skipped="0" tests="3" time="9.75"'))
    tests = next(line for line in record.condense(out) if line['type'] == 'tests')
    assert tests == {'type': 'tests', 'passed': 10, 'failed': 2, 'skipped': 1, 'errors': 0, 'seconds': 60.0}


def test_record_reads_pytests_last_line_without_junit_and_needs_a_commit(tmp_path):
    out = write_out_dir(tmp_path / 'out', junit=False)
    tests = next(line for line in record.condense(out) if line['type'] == 'tests')
    assert tests == {'type': 'tests', 'passed': 7, 'failed': 2, 'skipped': 1, 'errors': 0, 'seconds': 50.2}
    (out / 'environment.txt').write_text(ENVIRONMENT.replace('commit 1234abc\n', ''))
    with pytest.raises(ValueError, match='--commit'):
        record.condense(out)
    assert record.condense(out, commit='feed123')[0]['commit'] == 'feed123'


def test_record_command_names_files_by_date_and_gpu(tmp_path, monkeypatch):
    out = write_out_dir(tmp_path / 'out')
    dest = tmp_path / 'measurements'
    for _ in range(2):
        monkeypatch.setattr(sys, 'argv', ['record', str(out), '--out', str(dest)])
        assert record.main() == 0
    assert sorted(p.name for p in dest.iterdir()) == ['2026-12-24-h200-2.jsonl', '2026-12-24-h200.jsonl']
    assert record.gpu_short_name('NVIDIA H100 80GB HBM3') == 'h100'


def _write_record(folder: Path, name: str, lines: list[dict]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f'{name}.jsonl').write_text(record.dumps(lines))


def test_report_takes_each_kernel_from_the_newest_record_that_measured_it(tmp_path, monkeypatch):
    full = record.condense(write_out_dir(tmp_path / 'out'))
    _write_record(tmp_path / 'm', '2026-12-24-h200', full)
    newer_env = dict(full[0], date='2026-12-25T09:00:00Z', commit='5678def')
    newer_case = dict(full[1], median_us=11.0)
    _write_record(tmp_path / 'm', '2026-12-25-h200', [newer_env, newer_case])
    sources = report.Sources.of(report.load_records(tmp_path / 'm'))
    assert sources.primary.name == '2026-12-25-h200'
    assert sources.cases['moe.topk_gate'].name == '2026-12-25-h200'
    assert sources.upstream['moe.topk_gate'].name == '2026-12-24-h200'
    md = report.benchmarks_md(sources)
    assert 'Measured on NVIDIA H200; SM100 binaries are compiled and checked, not run.' in md
    assert '| num_experts=256, num_topk=8 | T=8192 | 11.0 | 12.5 | 13.0 |' in md
    assert 'quant.new_kernel' in md.split('## Gaps')[1]
    region = report.readme_region(sources)
    assert region.startswith(report.BEGIN) and region.endswith(report.END)
    assert '| topk_gate | E256 K8 | 12.6 | 13.5 | 17% |' in region and 'commit `1234abc`' in region
    # Without matplotlib the tables are still made; only the plot is skipped, with a message.
    monkeypatch.setitem(sys.modules, 'matplotlib', None)
    assert 'matplotlib is not installed' in report.plot(sources, tmp_path / 'plot.png')
    assert not (tmp_path / 'plot.png').exists()


def test_a_newer_upstream_run_on_another_gpu_supplies_its_rows_named_with_its_gpu(tmp_path):
    full = record.condense(write_out_dir(tmp_path / 'out'))
    _write_record(tmp_path / 'm', '2026-12-24-h200', full)
    h100 = dict(full[0], date='2026-12-25T09:00:00Z', commit='5678def', gpu='NVIDIA H100 80GB HBM3')
    upstream = next(line for line in full if line['type'] == 'upstream' and line['kernel'] == 'moe.topk_gate')
    _write_record(tmp_path / 'm', '2026-12-25-h100', [h100, dict(upstream, ours_us=10.0)])
    sources = report.Sources.of(report.load_records(tmp_path / 'm'))
    assert sources.primary.name == '2026-12-24-h200'  # the newest record with benchmark cases
    assert sources.cases['moe.topk_gate'].name == '2026-12-24-h200'
    assert sources.upstream['moe.topk_gate'].name == '2026-12-25-h100'
    region = report.readme_region(sources)
    assert '| topk_gate | E256 K8 | 10.0 | 13.5 |' in region and 'NVIDIA H100 80GB HBM3, 2026-12-25 at commit `5678def`' in region
    assert 'Measured on NVIDIA H200 and NVIDIA H100 80GB HBM3;' in report.benchmarks_md(sources)
