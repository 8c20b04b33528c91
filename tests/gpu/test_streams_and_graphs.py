"""The launcher runs on torch's current stream of the tensors' device, so streams and graphs just work (on two GPUs:
test_two_gpus.py)."""

import pytest
import torch

import tile_kernels_aot
from tile_kernels_aot import reference

from .helpers import assert_bitwise_equal

pytestmark = pytest.mark.gpu


def three_ops(scores, x_t, x_q):
    return (
        tile_kernels_aot.moe.topk_gate(scores, 8),
        tile_kernels_aot.transpose.transpose(x_t),
        *tile_kernels_aot.quant.per_token_cast(x_q, 'e4m3', 128),
    )


def references(scores, x_t, x_q):
    return (reference.stable_topk(scores, 8), reference.transpose(x_t), *reference.cast(x_q, 'e4m3', (1, 128)))


def fresh_inputs(num_tokens=4096):
    return (torch.randn(num_tokens, 256, device='cuda'), torch.randn(num_tokens, 7168, device='cuda').bfloat16(),
            torch.randn(num_tokens, 7168, device='cuda').bfloat16())


def test_cuda_graph_capture_and_replay():
    static = fresh_inputs()
    three_ops(*static)  # load the modules before capture, as with any library
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = three_ops(*static)
    for _ in range(3):
        new = fresh_inputs()
        for s, n in zip(static, new):
            s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        for out, ref in zip(outputs, references(*new)):
            assert_bitwise_equal(out, ref)


def test_runs_on_the_current_stream():
    # The inputs are written on a side stream behind a long sleep; an op that launched anywhere but
    # on that stream would read them before they exist.
    source = fresh_inputs()
    inputs = tuple(torch.zeros_like(s) for s in source)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        for dst, src in zip(inputs, source):
            dst.copy_(src)
        outputs = three_ops(*inputs)
    side.synchronize()
    for out, ref in zip(outputs, references(*source)):
        assert_bitwise_equal(out, ref)
