"""examples/ep_moe.py on GPUs: the expert-parallel layer (tile_kernels_aot's kernels around NCCL all_to_all_single) equals
its single-process pure-torch reference within the e4m3 quantisation tolerance, with one rank in this process and with
two ranks under torchrun (tests/cpu/test_ep_moe.py checks the same exchange with the pure-torch ops, bit for bit)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / 'examples' / 'ep_moe.py'


def load_example():
    spec = importlib.util.spec_from_file_location('ep_moe_example', EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ep = load_example()


@pytest.fixture
def one_rank(tmp_path):
    """A single-rank NCCL process group on GPU 0, in this process."""
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group('nccl', init_method=f'file://{tmp_path / "store"}', rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize('argv', [
    ['--tiny', '--tokens-per-rank', '64'],
    ['--tiny', '--tokens-per-rank', '1'],
    ['--moe-intermediate', '256', '--weight-sets', '4', '--tokens-per-rank', '200'],  # DeepSeek-V3's hidden size
], ids=['tiny', 'one-token', 'hidden-7168'])
def test_one_rank_equals_the_reference(one_rank, argv):
    result = ep.run(ep.parse_args([*argv, '--iters', '2', '--warmup', '1', '--check']))
    check = result['check']
    assert check['ok'], check
    assert check['same_layer']['diff'] <= ep.SAME_LAYER_DIFF and check['unquantized']['diff'] <= ep.UNQUANTIZED_DIFF
    assert result['ops'] == 'kernels' and result['world_size'] == 1
    assert result['kernels_ms'] > 0 and result['nccl_ms'] > 0 and result['experts_ms'] > 0 and result['tokens_per_s'] > 0


def test_kernels_and_pure_torch_ops_agree_step_by_step(one_rank):
    """The same exchange with both sets of ops on the same inputs: the outputs agree to the router weights' rounding."""
    cfg = ep.LayerConfig(**ep.TINY)
    x, logits = ep.rank_inputs(cfg, 0, 128, 'cuda', seed=5)
    bias = ep.router_bias(cfg, 'cuda', seed=5)
    experts = ep.LocalExperts(cfg, 0, 1, 'cuda', seed=5)
    ours = ep.ep_layer(x, logits, bias, experts, cfg, ops=ep.kernel_ops())
    theirs = ep.ep_layer(x, logits, bias, experts, cfg, ops=ep.reference_ops())
    assert ours.dtype == torch.bfloat16 and ours.shape == (128, cfg.hidden)
    assert ep.calc_diff(ours, theirs) < 1e-6


def run_torchrun(nproc: int, *argv: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')])))
    command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', str(nproc), str(EXAMPLE), *argv]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    (line,) = [json.loads(x) for x in result.stdout.splitlines() if x.startswith('{')]
    return line


@pytest.mark.two_gpus
@pytest.mark.parametrize('argv', [
    ['--tiny', '--tokens-per-rank', '64'],
    ['--moe-intermediate', '256', '--weight-sets', '4', '--tokens-per-rank', '200'],
], ids=['tiny', 'hidden-7168'])
def test_two_ranks_equal_the_reference(argv):
    line = run_torchrun(2, *argv, '--iters', '3', '--warmup', '1', '--check')
    assert line['world_size'] == 2 and line['ops'] == 'kernels'
    assert line['check']['ok'], line['check']
    assert line['nccl_ms'] > 0 and line['kernels_ms'] > 0
