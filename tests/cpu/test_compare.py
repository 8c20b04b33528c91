"""benchmarks.compare matches the cases of two runs and judges each kernel by its median ratio."""

from __future__ import annotations

import json

import pytest

from benchmarks import compare


def _rows(path, rows):
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    return path


def test_cases_are_matched_and_judged_by_the_median_ratio(tmp_path, capsys, monkeypatch):
    spec = {'num_experts': 256, 'num_topk': 8}
    base = _rows(tmp_path / 'base.jsonl', [
        {'kernel': 'copy', 'gbs': 4000},
        {'kernel': 'moe.topk_gate', 'spec': spec, 'shape': 'T', 'tokens': 8192, 'us': 10.0},
        {'kernel': 'moe.topk_gate', 'spec': spec, 'shape': 'U', 'tokens': 8192, 'us': 20.0},
        {'kernel': 'moe.group_count', 'spec': {'index_dtype': 'int64'}, 'shape': 'T', 'tokens': 8192, 'us': 5.0},
        {'kernel': 'moe.aux_fi', 'error': 'no case'}])
    record = _rows(tmp_path / 'new.jsonl', [
        {'type': 'environment'},
        {'type': 'case', 'kernel': 'moe.topk_gate', 'spec': spec, 'shape': 'T', 'tokens': 8192, 'median_us': 10.1},
        {'type': 'case', 'kernel': 'moe.topk_gate', 'spec': spec, 'shape': 'U', 'tokens': 8192, 'median_us': 20.0},
        {'type': 'case', 'kernel': 'moe.group_count', 'spec': {'index_dtype': 'int64'}, 'shape': 'T', 'tokens': 4096, 'median_us': 9.0}])
    ratios = compare.compare(compare.cases(base), compare.cases(record))
    assert ratios == {'moe.topk_gate': [pytest.approx(1.01), 1.0]}  # group_count ran at another token count
    monkeypatch.setattr('sys.argv', ['compare', str(base), str(record)])
    assert compare.main() == 0
    monkeypatch.setattr('sys.argv', ['compare', str(base), str(record), '--limit', '1.001'])
    assert compare.main() == 1
    assert 'above 1.001' in capsys.readouterr().out


def test_overlay_serves_the_build_s_kernels_and_the_base_s_others(tmp_path, monkeypatch):
    """The "after" side of an A/B: the base package with one kernel's binaries from a build; the loader, pointed at
    the overlay, finds the build's cubin for that kernel and verifies every sha256."""
    from benchmarks.overlay import overlay
    from tile_kernels_aot import _select

    from .test_artifact_faults import CUBIN, KERNEL, fake_cubin, make_package

    base = make_package(tmp_path / 'base')
    build = make_package(tmp_path / 'build', cubin=fake_cubin(90, size=640))
    assert overlay(base, build, tmp_path / 'out') == [KERNEL]
    with pytest.raises(FileExistsError):
        overlay(base, build, tmp_path / 'out')
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(tmp_path / 'out'))
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    _select.reset()
    try:
        assert _select.find_kernel(KERNEL, {'h': 64}, 0).image() == (build / CUBIN).read_bytes()
    finally:
        _select.reset()
    other = make_package(tmp_path / 'sm100', target='sm_100f')
    with pytest.raises(ValueError, match='is for sm_100f'):
        overlay(base, other, tmp_path / 'out2')


def test_runs_in_turn_are_medians_and_the_base_runs_give_a_control(tmp_path, capsys, monkeypatch):
    """base, new, base, new, base: each side's case time is its median over its runs; the control is the last base run
    against the first."""
    spec = {'num_experts': 256}
    row = lambda us: {'kernel': 'moe.topk_gate', 'spec': spec, 'shape': 'T', 'tokens': 8192, 'us': us}  # noqa: E731
    base = [_rows(tmp_path / f'base{i}.jsonl', [row(us)]) for i, us in enumerate((10.0, 30.0, 11.0))]
    new = [_rows(tmp_path / f'new{i}.jsonl', [row(us)]) for i, us in enumerate((12.0, 13.0))]
    assert compare.median_cases(base) == {('moe.topk_gate', json.dumps(spec), 'T', 8192): 11.0}
    assert compare.median_cases(new) == {('moe.topk_gate', json.dumps(spec), 'T', 8192): 12.5}
    monkeypatch.setattr('sys.argv', ['compare', ','.join(map(str, base)), ','.join(map(str, new)), '--limit', '1.2'])
    assert compare.main() == 0
    out = capsys.readouterr().out
    assert 'median 1.136' in out and 'control 1.100' in out and '(3 and 2 runs)' in out
