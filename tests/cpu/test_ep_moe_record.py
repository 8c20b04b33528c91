"""examples/ep_moe.py's figures in the records: benchmarks.record condenses the JSON lines a run leaves in ep_moe.jsonl
into 'ep_moe' lines, and benchmarks.report shows the newest record's in a table (none without them)."""

from __future__ import annotations

import json

from benchmarks import record, report

from .test_report import _write_record, write_out_dir

# A line as examples/ep_moe.py prints it (rank 0, after the timed steps).
RUN = {
    'what': 'ep_moe', 'world_size': 2, 'tokens_per_rank': 4096, 'hidden': 7168, 'num_experts': 256, 'num_topk': 8, 'moe_intermediate': 2048,
    'weight_sets': 128, 'ops': 'kernels', 'device': 'NVIDIA H200', 'iters': 20, 'step_ms': 12.34567, 'tokens_per_s': 663592.81,
    'phases_ms': {'gate': 0.0312, 'layout': 0.4561, 'quantize': 0.1234, 'counts': 0.1, 'dispatch': 2.5, 'dequantize': 0.2, 'experts': 6.0,
                  'return': 2.4, 'combine': 0.3},
    'kernels_ms': 1.11085, 'nccl_ms': 5.0, 'experts_ms': 6.0, 'kernels_share': 0.089979, 'nccl_share': 0.405, 'experts_share': 0.486,
    'check': {'ok': True},
}


def test_record_condenses_the_examples_lines(tmp_path):
    out = write_out_dir(tmp_path / 'out')
    one = dict(RUN, world_size=1, step_ms=10.0, tokens_per_s=409600.0)
    del one['check']
    (out / 'ep_moe.jsonl').write_text('some torchrun banner\n' + json.dumps(one) + '\n' + json.dumps(RUN) + '\n')
    lines = [line for line in record.condense(out) if line['type'] == 'ep_moe']
    assert [line['world_size'] for line in lines] == [1, 2]
    assert lines[1] == {
        'type': 'ep_moe', 'world_size': 2, 'tokens_per_rank': 4096,
        'layer': {'hidden': 7168, 'num_experts': 256, 'num_topk': 8, 'moe_intermediate': 2048, 'weight_sets': 128},
        'step_ms': 12.346, 'tokens_per_s': 663593, 'kernels_ms': 1.111, 'kernels_share': 0.09, 'nccl_ms': 5.0, 'nccl_share': 0.405,
        'experts_ms': 6.0, 'experts_share': 0.486,
        'phases_ms': {'gate': 0.031, 'layout': 0.456, 'quantize': 0.123, 'counts': 0.1, 'dispatch': 2.5, 'dequantize': 0.2, 'experts': 6.0,
                      'return': 2.4, 'combine': 0.3},
        'check_ok': True}
    assert lines[0]['check_ok'] is None


def test_report_shows_the_newest_records_runs(tmp_path):
    out = write_out_dir(tmp_path / 'out')
    full = record.condense(out)
    _write_record(tmp_path / 'm', '2026-12-24-h200', full)
    without = report.benchmarks_md(report.Sources.of(report.load_records(tmp_path / 'm')))
    assert 'Expert-parallel' not in without
    (out / 'ep_moe.jsonl').write_text(json.dumps(RUN) + '\n')
    newer = record.condense(out)
    newer[0] = dict(newer[0], date='2026-12-25T09:00:00Z', commit='5678def')
    _write_record(tmp_path / 'm', '2026-12-25-h200', newer)
    md = report.benchmarks_md(report.Sources.of(report.load_records(tmp_path / 'm')))
    section = md.split('## Expert-parallel MoE layer')[1]
    assert 'commit `5678def`' in section
    assert '| 2 | 4096 | H7168 E256 K8 I2048 | 12.35 | 663,593 | 1.11 (9%) | 5.00 (40%) | 6.00 (49%) |' in section
