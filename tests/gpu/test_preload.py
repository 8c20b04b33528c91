"""CUDA graphs after tile_kernels_aot.preload() alone: in a fresh interpreter (so that no earlier test has loaded a
binary), preload, capture ops of each family in one graph without calling any of them first, and replay it on new
inputs, bitwise against the references."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = r'''
import json
import sys

import torch

import tile_kernels_aot
from tile_kernels_aot import reference
from tests.gpu.helpers import assert_bitwise_equal


def inputs(num_tokens):
    return (torch.randn(num_tokens, 256, device='cuda'), torch.randn(num_tokens, 7168, device='cuda').bfloat16(),
            torch.randn(num_tokens, 7168, device='cuda').bfloat16())


def ops(scores, x_t, x_q):
    idx = tile_kernels_aot.moe.topk_gate(scores, 8)
    q, sf = tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128)
    return (idx, tile_kernels_aot.moe.group_count(idx, 256), tile_kernels_aot.transpose.transpose(x_t), q.view(torch.uint8), sf,
            tile_kernels_aot.quant.cast_back((q, sf), 'bf16', (1, 128)))


def references(scores, x_t, x_q):
    idx = reference.stable_topk(scores, 8)
    q, sf = reference.cast(x_q, 'e4m3', (1, 128))
    return (idx, reference.group_count(idx, 256), reference.transpose(x_t), q.view(torch.uint8), sf,
            reference.cast_back((q, sf), 'bf16', (1, 128)))


kernels = json.loads(sys.argv[1])
loaded = tile_kernels_aot.preload(kernels=kernels)
assert loaded, 'preload loaded nothing'
static = inputs(4096)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):  # the first call of every op is in the capture
    outputs = ops(*static)
for _ in range(3):
    new = inputs(4096)
    for s, n in zip(static, new):
        s.copy_(n)
    graph.replay()
    torch.cuda.synchronize()
    for out, ref in zip(outputs, references(*new)):
        assert_bitwise_equal(out, ref)
print(f'replayed after preloading {len(loaded)} binaries')
'''


@pytest.mark.parametrize('kernels', [
    None,  # everything installed
    ['moe.topk_gate', 'moe.group_count', 'quant.per_token_cast', 'quant.cast_back', 'transpose.*'],  # what the graph uses
])
def test_capture_after_preload_alone(kernels):
    result = subprocess.run([sys.executable, '-c', SCRIPT, json.dumps(kernels)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    assert 'replayed after preloading' in result.stdout
