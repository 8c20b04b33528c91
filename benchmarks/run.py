"""Benchmark every installed spec against the copy-bandwidth ceiling measured in the same run.

    python benchmarks/run.py [--out results.jsonl] [--kernels PATTERN] [--tokens 8192] [--upstream]

Device time is taken between CUDA events on a GPU kept busy by a sleep, so host launch overhead is not
counted; each input is larger than L2 or L2 is flushed before every run. Decode sizes (1, 32, 128
tokens) are timed by replaying a CUDA graph of 100 calls, and their host time per call is measured
separately. Bandwidth counts each input read once and each output written once.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import time

import torch

import tile_kernels_aot
from tile_kernels_aot._select import prebuilt_specs

ITERS = 30
DECODE_TOKENS = (1, 32, 128)


class Timer:
    def __init__(self) -> None:
        self.flush = torch.zeros(64 * 2**20, dtype=torch.int32, device='cuda')  # 256 MB, > 4x the 60 MB L2

    def device_us(self, fn, iters: int = ITERS) -> float:
        fn()
        times = []
        for _ in range(iters):
            # Evict the inputs from L2 by reading, not writing: written lines would be dirty and their
            # write-back would be charged to the kernel under test.
            self.flush.max()
            torch.cuda._sleep(1_000_000)  # keep the GPU busy while the host enqueues the call
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times) * 1e3

    def graph_us(self, fn, calls: int = 100) -> float:
        """Device time per call of a graph of `calls` back-to-back calls (for decode sizes)."""
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        times = []
        for _ in range(10):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times) * 1e3 / calls

    @staticmethod
    def host_us(fn, calls: int = 2000) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / calls * 1e6


def copy_bandwidth(timer: Timer) -> float:
    a = torch.randn(16384, 7168, device='cuda').bfloat16()
    c = torch.empty_like(a)
    us = timer.device_us(lambda: c.copy_(a), iters=50)
    return 2 * a.numel() * a.element_size() / us / 1e3  # GB/s


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- one case builder per kernel: spec -> (label, fn, bytes moved) at a token count ------------------

DTYPE_OF_SIZE = {1: torch.float8_e4m3fn, 2: torch.bfloat16, 4: torch.float32}


def transpose_case(spec, tokens):
    cols = 7168 if spec['tile_n'] == 128 else 7104
    rows = tokens // 128 * 128 if spec['tile_m'] == 128 else tokens // 128 * 128 - 64
    pad = spec['vec_bytes'] // spec['elem_bytes']
    base = torch.randn(rows * (cols + pad), device='cuda').to(DTYPE_OF_SIZE[spec['elem_bytes']])
    x = base.view(rows, cols + pad)[:, :cols] if spec['vec_bytes'] < 16 else base[: rows * cols].view(rows, cols)
    out = tile_kernels_aot.transpose.transpose(x)
    return f'{str(x.dtype)[6:]} {rows}x{cols}', lambda: tile_kernels_aot.transpose.transpose(x), nbytes(x, out)


def topk_case(spec, tokens):
    scores = torch.randn(tokens, spec['num_experts'], device='cuda')
    out = tile_kernels_aot.moe.topk_gate(scores, spec['num_topk'])
    return f'T={tokens}', lambda: tile_kernels_aot.moe.topk_gate(scores, spec['num_topk']), nbytes(scores, out)


def per_token_cast_case(spec, tokens):
    dtype = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[spec['in_dtype']]
    extra = 0 if spec['aligned'] else 1
    # The unaligned variant serves inputs whose pointer or row stride is not a multiple of 16 bytes.
    x = torch.randn(tokens, spec['hidden'] + extra, device='cuda').to(dtype)[:, extra:]
    fn = lambda: tile_kernels_aot.quant.per_token_cast(x, 'e4m3', spec['num_per_channels'], round_sf=spec['round_sf'])  # noqa: E731
    out, sf = fn()
    return f'T={tokens}', fn, nbytes(x, out, sf)


def topk_sum_case(spec, tokens):
    g, per_group, topk_sum, topk_groups = spec['num_groups'], spec['experts_per_group'], spec['num_topk_sum'], spec['num_topk_groups']
    scores = torch.randn(tokens, g, per_group, device='cuda')
    fn = lambda: tile_kernels_aot.moe.topk_sum_and_topk_group_idx(scores, topk_sum, topk_groups)  # noqa: E731
    return f'T={tokens}', fn, nbytes(scores, fn())


def routing_indices(tokens, num_topk=8, num_experts=256):
    return torch.rand(tokens, num_experts, device='cuda').topk(num_topk, dim=-1).indices


def normalize_weight_case(spec, tokens):
    weights = torch.rand(tokens, 8, device='cuda')
    fn = lambda: tile_kernels_aot.moe.normalize_weight(weights)  # noqa: E731
    return f'T={tokens}, K=8', fn, nbytes(weights, *fn())


def group_count_case(spec, tokens):
    idx = routing_indices(tokens).to(getattr(torch, spec['index_dtype']))
    fn = lambda: tile_kernels_aot.moe.group_count(idx, 256)  # noqa: E731
    return f'T={tokens}, K=8, E=256', fn, nbytes(idx, fn())


def aux_fi_case(spec, tokens):
    idx = routing_indices(tokens).to(getattr(torch, spec['index_dtype']))
    fn = lambda: tile_kernels_aot.moe.aux_fi(idx, 256, 8)  # noqa: E731
    return f'T={tokens}, K=8, E=256', fn, nbytes(idx, fn())


def unique_case(spec, tokens):
    idx = (routing_indices(tokens) // 32).to(getattr(torch, spec['index_dtype']))  # group ids, with repeats
    fn = lambda: tile_kernels_aot.moe.inplace_unique_group_indices(idx, 8)  # noqa: E731
    return f'T={tokens}, K=8, G=8', fn, 2 * nbytes(idx)


def mask_by_tp_case(spec, tokens):
    idx = routing_indices(tokens).to(getattr(torch, spec['index_dtype']))
    fn = lambda: tile_kernels_aot.moe.mask_indices_by_tp(idx, 256, 8, 1, 2)  # noqa: E731
    return f'T={tokens}, K=8', fn, nbytes(idx, fn())


CASES = {
    'transpose.batched_transpose': transpose_case,
    'moe.topk_gate': topk_case,
    'moe.topk_sum_and_topk_group_idx': topk_sum_case,
    'moe.normalize_weight': normalize_weight_case,
    'moe.group_count': group_count_case,
    'moe.aux_fi': aux_fi_case,
    'moe.inplace_unique_group_indices': unique_case,
    'moe.mask_indices_by_tp': mask_by_tp_case,
    'quant.per_token_cast': per_token_cast_case,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None, help='write one JSON object per line here')
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--tokens', type=int, default=8192)
    parser.add_argument('--decode', action='store_true', help='also time decode sizes (graph replay and host time)')
    args = parser.parse_args()

    timer = Timer()
    copy_gbs = copy_bandwidth(timer)
    gpu = torch.cuda.get_device_name(0)
    print(f'# {gpu}, torch {torch.__version__}, tile_kernels_aot {tile_kernels_aot.__version__}; copy bandwidth {copy_gbs:.0f} GB/s')
    rows = [{'kernel': 'copy', 'gbs': copy_gbs, 'gpu': gpu}]
    for kernel, case in CASES.items():
        if not fnmatch.fnmatchcase(kernel, args.kernels):
            continue
        for spec in prebuilt_specs(kernel, 0):
            label, fn, moved = case(spec, args.tokens)
            us = timer.device_us(fn)
            row = {'kernel': kernel, 'spec': spec, 'shape': label, 'us': us, 'gbs': moved / us / 1e3, 'of_copy': moved / us / 1e3 / copy_gbs}
            if args.decode and kernel != 'transpose.batched_transpose':
                row['decode'] = {}
                for t in DECODE_TOKENS:
                    _, small, _ = case(spec, t)
                    row['decode'][t] = {'graph_us': timer.graph_us(small), 'host_us': timer.host_us(small)}
            rows.append(row)
            print(f'{kernel:28s} {json.dumps(spec, separators=(",", ":")):90s} {label:18s} {us:8.1f} us {row["gbs"]:7.0f} GB/s {100 * row["of_copy"]:5.1f}%', flush=True)
            del fn
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, 'w') as f:
            for row in rows:
                f.write(json.dumps(row) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
