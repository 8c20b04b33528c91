"""benchmarks/host_overhead.py without a GPU: the torch comparison runs on the tensors a case's lambda reads, and
benchmarks.record / benchmarks.report carry its rows into the records and docs/benchmarks.md."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from benchmarks import host_overhead, record, report

from .test_report import _write_record, write_out_dir

ROW = {'what': 'host', 'kernel': 'moe.topk_gate', 'shape': 'E256 K8', 'tokens': 128, 'ours_us': 12.3456, 'ours_in_full_us': 30.04,
       'ours_ctypes_us': 13.5, 'torch_us': 8.2, 'torch_op': 'torch.neg (128, 256) float32', 'outputs': 2, 'torch_outputs_us': 9.0,
       'torch_outputs_op': 'torch._foreach_neg 2 x (128, 256) float32', 'upstream_us': 40.0}


def test_the_tensors_a_case_reads_are_found_through_partials_and_nested_lambdas():
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    w = torch.zeros(64, 16)
    idx = torch.zeros(4, 2, dtype=torch.int64)

    def op(a, b, c=None):
        return a

    inner = functools.partial(op, w, c=idx)
    outer = lambda: (inner(x), op(x, (w, idx)))  # noqa: E731
    found = host_overhead._tensors_of(outer)
    assert {id(t) for t in found} == {id(x), id(w), id(idx)}
    label, fn = host_overhead.torch_reference(host_overhead.reference_tensor(found))
    assert label == 'torch.neg (64, 16) float32'  # the largest floating-point input
    assert torch.equal(fn(), -w)


def test_the_n_output_reference_counts_new_buffers_and_fits_one_foreach_launch():
    x, y, z = torch.zeros(2), torch.zeros(2), torch.zeros(4)
    results = [None, x, y, (x, None, [y, z[:2], z[2:]]), (z[:2], z.view(2, 2))]
    assert [host_overhead.new_outputs(r, [x]) for r in results] == [0, 0, 1, 2, 1]  # an input's and one buffer's views count once
    x = torch.randn(4, 16)[:, :8]  # not contiguous: the reference takes a contiguous copy
    label, fn = host_overhead.torch_outputs_reference(x, 3)
    outs = fn()
    assert label == 'torch._foreach_neg 3 x (4, 8) float32' and len(outs) == 3
    assert all(torch.equal(o, -x) for o in outs) and len({o.data_ptr() for o in outs}) == 3  # three allocations
    big = torch.zeros(320 * 65536 // 3 + 1, dtype=torch.bfloat16)  # past one launch's 320 chunks of 65536 at 3 outputs
    label, fn = host_overhead.torch_outputs_reference(big, 3)
    assert label == f'torch._foreach_neg 3 x ({106 * 65536},) bfloat16' and fn()[0].numel() == 106 * 65536


def test_record_and_report_carry_the_rows(tmp_path):
    out = write_out_dir(tmp_path / 'out')
    no_upstream = dict(ROW, kernel='quant.per_token_cast', shape='bf16 H7168', upstream_us=None)
    for key in ('ours_in_full_us', 'ours_ctypes_us', 'outputs', 'torch_outputs_us', 'torch_outputs_op'):
        del no_upstream[key]  # a record from before launch plans, the C extension and the N-output reference
    (out / 'host.jsonl').write_text(json.dumps(ROW) + '\n' + json.dumps(no_upstream) + '\n')
    lines = [line for line in record.condense(out) if line['type'] == 'host']
    assert lines[0] == {'type': 'host', 'kernel': 'moe.topk_gate', 'shape': 'E256 K8', 'tokens': 128, 'ours_us': 12.35, 'ours_in_full_us': 30.04,
                        'ours_ctypes_us': 13.5, 'torch_us': 8.2, 'torch_op': 'torch.neg (128, 256) float32', 'outputs': 2,
                        'torch_outputs_us': 9.0, 'torch_outputs_op': 'torch._foreach_neg 2 x (128, 256) float32', 'upstream_us': 40.0}
    assert all(lines[1][key] is None for key in ('upstream_us', 'ours_in_full_us', 'ours_ctypes_us', 'outputs', 'torch_outputs_us'))
    _write_record(tmp_path / 'm', '2026-12-24-h200', record.condense(out))
    md = report.benchmarks_md(report.Sources.of(report.load_records(tmp_path / 'm')))
    section = md.split('## Host time per call')[1]
    assert '| topk_gate | E256 K8 | 12.3 | 30.0 | 13.5 | 8.2 | 1.51 | 2 | 9.0 | 1.37 | 40.0 | 0.31 |' in section
    assert '| per_token_cast | bf16 H7168 | 12.3 | — | — | 8.2 | 1.51 | — | — | — | — | — |' in section


def test_the_host_rows_all_come_from_the_newest_record_that_has_any(tmp_path):
    out = write_out_dir(tmp_path / 'out')
    other = dict(ROW, kernel='quant.per_token_cast', shape='bf16 H7168')
    (out / 'host.jsonl').write_text(json.dumps(ROW) + '\n' + json.dumps(other) + '\n')
    older = record.condense(out)
    _write_record(tmp_path / 'm', '2026-12-24-h200', older)
    newer_env = dict(older[0], date='2026-12-25T09:00:00Z', commit='5678def', gpu='NVIDIA H100 80GB HBM3')
    newer_row = {'type': 'host', **{k: v for k, v in ROW.items() if k != 'what'}, 'ours_us': 9.0}
    _write_record(tmp_path / 'm', '2026-12-25-h100', [newer_env, newer_row])
    md = report.benchmarks_md(report.Sources.of(report.load_records(tmp_path / 'm')))
    section = md.split('## Host time per call')[1]
    assert '| topk_gate | E256 K8 | 9.0 |' in section and '| topk_gate | E256 K8 | 12.3 |' not in section
    assert 'per_token_cast' not in section  # one run's rows only: the older record's are not mixed in
    text = ' '.join(section.split())  # the method paragraph is wrapped
    assert 'NVIDIA H100 80GB HBM3' in text and '`5678def`' in text


def test_a_case_whose_upstream_fails_is_timed_without_it():
    def case(tk, tokens):
        if tk is not None:
            raise RuntimeError('upstream does not build here\nits log')
        return 'ours only', (lambda: tokens), None, None, 0

    cases, upstream = host_overhead.cases_and_upstream(case, object(), 3)
    assert upstream is None and [label for label, *_ in cases] == ['ours only'] and cases[0][1]() == 3
    with pytest.raises(ZeroDivisionError):  # the cases fail without upstream too: that error is the case's own
        host_overhead.cases_and_upstream(lambda tk, tokens: 1 / 0 if tk is None else case(tk, tokens), object(), 3)
    tk = object()
    assert host_overhead.cases_and_upstream(lambda t, tokens: ('both', None, None, None, 0), tk, 3) == ([('both', None, None, None, 0)], tk)
