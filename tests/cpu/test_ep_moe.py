"""examples/ep_moe.py without a GPU: it imports, parses its arguments, its exchange bookkeeping is right on plain tensors,
its single-process reference is the layer it says, and the whole expert-parallel step over gloo with the pure-torch
ops equals that reference bit for bit (one rank in this process, two under torchrun)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / 'examples' / 'ep_moe.py'


def load_example():
    spec = importlib.util.spec_from_file_location('ep_moe_example', EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


ep = load_example()


def test_defaults_are_deepseek_v3():
    from kernel_src.models import MODELS

    v3 = next(m for m in MODELS if m.name == 'DeepSeek-V3')
    cfg = ep.LayerConfig()
    assert (cfg.hidden, cfg.num_experts, cfg.num_topk, cfg.moe_intermediate, cfg.num_groups, cfg.num_topk_groups, cfg.scoring,
            cfg.routed_scaling_factor) == (v3.hidden, v3.num_experts, v3.num_topk, v3.moe_intermediate, v3.num_groups, v3.num_topk_groups,
                                           v3.scoring, v3.routed_scaling_factor)
    assert v3.group_topk_sum == 2  # top2_sum_gate's group score


def test_argument_parsing():
    args = ep.parse_args([])
    assert (args.tokens_per_rank, args.iters, args.device, args.ops, args.check, args.weight_sets) == (4096, 20, 'cuda', 'kernels', False, 0)
    assert ep.config_of(args) == ep.LayerConfig()
    tiny = ep.config_of(ep.parse_args(['--tiny', '--weight-sets', '4']))
    assert (tiny.hidden, tiny.moe_intermediate, tiny.num_experts, tiny.weight_sets) == (256, 64, 256, 4)
    assert tiny.sets_per_rank(2) == 4 and ep.LayerConfig(weight_sets=500).sets_per_rank(2) == 128 and ep.LayerConfig().sets_per_rank(8) == 32
    for bad in (['--device', 'cpu'], ['--iters', '0'], ['--weight-sets', '-1']):
        with pytest.raises(SystemExit):
            ep.parse_args(bad)
    with pytest.raises(ValueError, match='do not divide over 3 ranks'):
        ep.LayerConfig().experts_per_rank(3)


def test_send_counts_and_splits():
    per_expert = [3, 0, 1, 2, 0, 0, 5, 1]  # 8 experts over 4 ranks: 2 each
    counts = ep.send_counts(per_expert, 4)
    assert counts.tolist() == [[3, 0], [1, 2], [0, 0], [5, 1]]
    assert ep.split_sizes(counts) == [3, 3, 0, 6]
    assert ep.offsets(ep.split_sizes(counts)) == [0, 3, 6, 6, 12]
    assert ep.offsets([]) == [0]
    with pytest.raises(ValueError, match='8 experts do not divide over 3 ranks'):
        ep.send_counts(per_expert, 3)


def test_expert_order_groups_received_rows_by_expert():
    # From rank 0: 2 rows of local expert 0, 1 of expert 2; from rank 1: 1 of expert 1, 2 of expert 2.
    recv = torch.tensor([[2, 0, 1], [0, 1, 2]])
    order, starts = ep.expert_order(recv)
    row_expert = torch.tensor([0, 0, 2, 1, 2, 2])  # the received rows' experts, in the order received
    assert order.tolist() == [0, 1, 3, 2, 4, 5]
    assert row_expert[order].tolist() == [0, 0, 1, 2, 2, 2] and starts == [0, 2, 3, 6]
    order, starts = ep.expert_order(torch.zeros((2, 3), dtype=torch.int64))
    assert order.numel() == 0 and starts == [0, 0, 0, 0]


def test_local_experts_run_each_row_through_its_expert():
    cfg = ep.LayerConfig(hidden=32, moe_intermediate=16, num_experts=8, weight_sets=3)
    experts = ep.LocalExperts(cfg, rank=1, world=2, device='cpu')  # experts 4..7, sets of experts 4, 5, 6
    recv = torch.tensor([[1, 0, 2, 1], [0, 3, 0, 1]])
    h = torch.randn((8, 32)).bfloat16()
    y = experts(h, recv)
    row_expert = [0, 2, 2, 3, 1, 1, 1, 3]
    for row, j in enumerate(row_expert):
        source = ep.weight_source(cfg, 2, 4 + j)
        assert source == 4 + j % 3
        w13, w2 = ep.expert_weights(cfg, source, 'cpu')
        torch.testing.assert_close(y[row], ep.swiglu_ffn(h[row:row + 1], w13, w2)[0], rtol=0, atol=0)


def test_reference_layer_is_the_layer():
    """reference_layer against a token-by-token reading of the layer: the router's experts and weights, each expert's
    FFN on the token's e4m3 round trip, the weighted sum in k order."""
    from tile_kernels_aot import reference as ref

    cfg = ep.LayerConfig(**ep.TINY)
    inputs = [ep.rank_inputs(cfg, r, 5, 'cpu', seed=3) for r in range(2)]
    bias = ep.router_bias(cfg, 'cpu', seed=3)
    outs = ep.reference_layer([x for x, _ in inputs], [lg for _, lg in inputs], bias, cfg, 2, seed=3)
    assert [tuple(o.shape) for o in outs] == [(5, 256), (5, 256)] and outs[0].dtype == torch.bfloat16
    x, logits = torch.cat([x for x, _ in inputs]), torch.cat([lg for _, lg in inputs])
    idx, weights = ref.top2_sum_gate(logits, bias, 8, 4, 8, False, 0, 2.5, 0, 2, 0, 1, 'sigmoid')
    h = ref.cast_back(ref.cast(x, 'e4m3', (1, 128)), 'bf16', (1, 128))
    for t in (0, 7):
        acc = torch.zeros(256)
        for k in range(8):
            w13, w2 = ep.expert_weights(cfg, int(idx[t, k]), 'cpu', seed=3)
            acc = ref.fma_f32(ep.swiglu_ffn(h[t:t + 1], w13, w2)[0].float(), weights[t, k].expand(1), acc)
        assert torch.equal(torch.cat(outs)[t], acc.bfloat16())
    unquantized = torch.cat(ep.reference_layer([x for x, _ in inputs], [lg for _, lg in inputs], bias, cfg, 2, seed=3, quantize=False))
    assert 0 < ep.calc_diff(torch.cat(outs), unquantized) < ep.UNQUANTIZED_DIFF


def test_one_rank_in_process_over_gloo(tmp_path):
    import torch.distributed as dist

    dist.init_process_group('gloo', init_method=f'file://{tmp_path / "store"}', rank=0, world_size=1)
    try:
        args = ep.parse_args(['--device', 'cpu', '--ops', 'reference', '--tiny', '--tokens-per-rank', '16', '--iters', '1', '--warmup', '0', '--check'])
        result = ep.run(args)
    finally:
        dist.destroy_process_group()
    assert result['check']['ok'] and result['check']['same_layer']['diff'] == 0.0
    assert result['world_size'] == 1 and result['tokens_per_s'] > 0
    assert set(result['phases_ms']) == {'gate', 'layout', 'quantize', 'counts', 'dispatch', 'dequantize', 'experts', 'return', 'combine'}
    assert abs(sum(result['phases_ms'].values()) - sum(result[f'{k}_ms'] for k in ep.KINDS)) < 1e-6
    from benchmarks import record

    line = record.ep_moe_line(json.loads(json.dumps(result)))  # what benchmarks.record makes of the printed line
    assert line['type'] == 'ep_moe' and line['check_ok'] is True and line['layer']['hidden'] == 256


def test_two_ranks_under_torchrun_equal_the_reference():
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', str(EXAMPLE), '--device', 'cpu',
               '--ops', 'reference', '--tiny', '--tokens-per-rank', '24', '--iters', '1', '--warmup', '0', '--check']
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    (line,) = [json.loads(x) for x in result.stdout.splitlines() if x.startswith('{')]
    assert line['world_size'] == 2 and line['weight_sets'] == 128
    assert line['check']['ok'] and line['check']['same_layer']['diff'] == 0.0, line['check']
