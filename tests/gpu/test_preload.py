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
from tests.gpu.helpers import assert_bitwise_equal, sample_inputs as inputs, sample_ops as ops, sample_references as references

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
