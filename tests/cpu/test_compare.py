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
