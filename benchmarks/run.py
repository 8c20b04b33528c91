"""Benchmark every installed spec against the copy-bandwidth ceiling measured in the same run.

    python -m benchmarks.run [--out bench.jsonl] [--kernels PATTERN] [--tokens 8192] [--decode]
    python -m benchmarks.run --ab DIR --rounds N --out PREFIX [--kernels PATTERN] [--tokens 8192]

Device time is taken between CUDA events on a GPU kept busy by a sleep, so host launch overhead is not
counted; each input is larger than L2 or L2 is flushed before every run. A case's row holds the median, minimum
and maximum of ITERS such runs. Decode sizes (1, 32, 128 tokens) are timed by replaying a CUDA graph of 100
calls, and their host time per call is measured separately. Bandwidth counts each input read once and each
output written once.

The kernels are those of the installed arch package that serves the GPU, each with its case builder in CASES:
an installed kernel without one is written as an error row and makes the exit status 1.

With --ab DIR (an arch package's folder: manifest.json and cubins, e.g. benchmarks.overlay's output) the run is an
A/B inside one process: each case is timed on the installed binaries ("base") and on DIR's ("new", through
TILE_KERNELS_AOT_KERNEL_DIRS) in turn, N rounds of each in the order base, new, new, base, ..., on the same inputs,
so that what drifts between processes (clocks, placement in memory) weighs on both sides alike. Round r of a side
goes to PREFIX-base-r.jsonl or PREFIX-new-r.jsonl, rows as without --ab, for benchmarks.compare.
"""

from __future__ import annotations

import argparse
import faulthandler
import fnmatch
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

import tile_kernels_aot
from tile_kernels_aot import _select
from tile_kernels_aot._select import KERNEL_DIRS_ENV, package_for_device, prebuilt_specs
from tile_kernels_aot.quant.per_token import per_token_requant_spec
from benchmarks.common import RowWriter, nbytes
from benchmarks.mhc_stream import RUN_CASES as MHC_STREAM_CASES
from benchmarks.mhc_mixes import RUN_CASES as MHC_MIXES_CASES
from benchmarks.engram import RUN_CASES as ENGRAM_CASES
from benchmarks.mhc_norm_fn import RUN_CASES as MHC_NORM_FN_CASES

ITERS = 30
# A case (its inputs, timings and decode sizes) still running after this many seconds is taken for a kernel that never
# returns: every thread's traceback goes to stderr and the process exits, so a GPU run loses one step, not the rest of
# its device time. Cases take a few seconds.
CASE_TIMEOUT_S = 120
DECODE_TOKENS = (1, 32, 128)


class Timer:
    def __init__(self) -> None:
        self.flush = torch.zeros(64 * 2**20, dtype=torch.int32, device='cuda')  # 256 MB, > 4x the 60 MB L2

    def device_us(self, fn, iters: int = ITERS) -> float:
        """The median of device_times."""
        return statistics.median(self.device_times(fn, iters))

    def device_times(self, fn, iters: int = ITERS) -> list[float]:
        """Device time of each of `iters` calls, in us, each after an L2 flush and behind a sleep."""
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
        return [s.elapsed_time(e) * 1e3 for s, e in times]

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
    def host_us(fn, calls: int = 2000, burst: int = 16) -> float:
        """Host time per call, the device's left out: `calls` calls in bursts of `burst`, each burst started on an idle
        device and timed until its last call returns. A burst never fills the launch queue (about a thousand
        launches), so a call never waits for the device, however long its kernels run. The median burst."""
        fn()
        times = []
        for _ in range(calls // burst):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(burst):
                fn()
            times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        return statistics.median(times) / burst * 1e6


def copy_bandwidth(timer: Timer) -> float:
    a = torch.randn(16384, 7168, device='cuda').bfloat16()
    c = torch.empty_like(a)
    us = timer.device_us(lambda: c.copy_(a), iters=50)
    return 2 * a.numel() * a.element_size() / us / 1e3  # GB/s


class SameSizeCopy:
    """Device time of a copy that moves as many bytes (read + written) as a case, timed as the cases are.

    The 235 MB copy of copy_bandwidth is the ceiling every case is quoted against. A kernel of 20-30 us also pays
    what any launch of its size pays (the grid filling the GPU and draining, the first loads' latency), which a
    copy of the same size pays too and the large copy spreads thin. So each case is also quoted against a copy of
    its own size, time for time."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.us: dict[int, float] = {}

    def __call__(self, moved: int) -> float:
        n = moved // 2
        if n not in self.us:
            a = torch.ones(n, dtype=torch.uint8, device='cuda')
            c = torch.empty_like(a)
            self.us[n] = self.timer.device_us(lambda: c.copy_(a), iters=50)
            del a, c
        return self.us[n]


def installed_kernels() -> list[str]:
    """The kernels of the arch package that serves GPU 0, in manifest order: what the benchmarks cover."""
    return list(package_for_device(0).manifest.kernels)


def select(cases: dict, pattern: str, kernels: list[str]) -> tuple[list[str], list[str]]:
    """The kernels of `kernels` that match `pattern` (globs, comma-separated) and have a case in `cases`, and those
    that match but have none, in the order of the first glob each matches."""
    globs = pattern.split(',')
    first_glob = {k: next((i for i, g in enumerate(globs) if fnmatch.fnmatchcase(k, g)), None) for k in kernels}
    chosen = sorted((k for k in kernels if first_glob[k] is not None), key=first_glob.get)
    return [k for k in chosen if k in cases], [k for k in chosen if k not in cases]


def no_case_row(kernel: str, where: str) -> dict:
    row = {'kernel': kernel, 'error': f'no benchmark case: {kernel} is installed but {where} has no entry for it in CASES'}
    print(f'{kernel}: {row["error"]}', file=sys.stderr, flush=True)
    return row


# -- one case builder per kernel: spec -> (label, fn, bytes moved) at a token count, or a list of them where a spec
# -- serves inputs that take different paths through its kernel ----------------------------------------------------


def cases_of(case, *args) -> list:
    """case(*args) as a list of cases (benchmarks.upstream's builders too, whose cases are longer tuples)."""
    result = case(*args)
    return result if isinstance(result, list) else [result]


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


def _cast_config(spec):
    """Upstream's benchmark configurations: e4m3 with 128 and e2m1 with 32 channels per scale factor (or
    one per row), row-major float32 scale factors, or column-major packed UE8M0 ones with round_sf."""
    npc = 7168 if spec.get('per_row') else 128 if spec['fmt'] == 'e4m3' else 32
    packed = spec['sf_format'] == 'ue8m0'
    return npc, dict(use_tma_aligned_col_major_sf=packed, round_sf=packed, use_packed_ue8m0=packed)


def with_spec_function(module, name: str, spec: dict, fn):
    """fn, run with module.<name> (an op's spec choice) answering spec: times a prebuilt spec the op does not take on
    this GPU. Costs the host two attribute swaps a call."""
    def call():
        chosen = getattr(module, name)
        setattr(module, name, lambda *args: dict(spec))
        try:
            return fn()
        finally:
            setattr(module, name, chosen)
    return call


def copy_at(x: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous copy of x starting `offset` elements into a fresh (256-byte aligned) allocation: an input on which an
    op takes a spec for less aligned data."""
    return torch.empty(x.numel() + offset, dtype=x.dtype, device=x.device)[offset:].view(x.shape).copy_(x)


def per_token_cast_case(spec, tokens):
    dtype = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[spec['in_dtype']]
    # The 16-byte vector variant serves inputs whose pointer and row stride are multiples of 16 bytes but not of 32,
    # the unaligned one the others.
    offset = 1 if not spec['aligned'] else 16 // dtype.itemsize if spec['vec_bytes'] == 16 and not spec['per_row'] else 0
    x = torch.randn(tokens, 7168 + offset, device='cuda').to(dtype)[:, offset:]
    npc, flags = _cast_config(spec)
    assert tile_kernels_aot.quant.per_token_cast_spec(x, spec['fmt'], npc, flags['use_packed_ue8m0']) == spec
    fn = lambda: tile_kernels_aot.quant.per_token_cast(x, spec['fmt'], npc, **flags)  # noqa: E731
    out, sf = fn()
    return f'T={tokens}, H=7168, {npc} per sf', fn, nbytes(x, out, sf)


def per_token_requant_case(spec, tokens):
    """Upstream's benchmark shape for a quantised input: e4m3 data with (128, 128) blocks (e2m1: (32, 32)),
    re-quantised with 128 (e2m1: 32) channels per scale factor, with round_sf; float32 scale factors also without it
    (upstream's default), where no factor is a power of two and the kernels take another path. e4m3 data in 16-byte
    vectors is copied 16 bytes past a 32-byte boundary, where the op takes that spec."""
    x = torch.randn(tokens, 7168, device='cuda', dtype=torch.bfloat16)
    packed = spec['sf_format'] == 'ue8m0'
    block = (128, 128) if spec['in_fmt'] == 'e4m3' else (32, 32)
    npc = 128 if spec['fmt'] == 'e4m3' else 32
    cases = []
    for round_sf in (True,) if packed else (True, False):
        flags = {'use_tma_aligned_col_major_sf': packed, 'round_sf': round_sf, 'use_packed_ue8m0': packed}
        q = tile_kernels_aot.quant.per_block_cast(x, spec['in_fmt'], block, **flags)
        if spec['in_fmt'] == 'e4m3' and spec['vec_bytes'] == 16:
            q = (copy_at(q[0], 16), q[1])
        assert per_token_requant_spec(q[0], spec['fmt'], packed, packed) == spec
        fn = partial(tile_kernels_aot.quant.per_token_cast, q, spec['fmt'], npc, x_block_size=block, **flags)
        cases.append((f'T={tokens}, H=7168, {block} -> {npc} per sf{"" if round_sf else ", no round_sf"}', fn, nbytes(*q, *fn())))
    return cases


def cast_back_case(spec, tokens):
    x = torch.randn(tokens, 7168, device='cuda', dtype=torch.bfloat16)
    npc, flags = _cast_config(spec)
    q = tile_kernels_aot.quant.per_token_cast(x, spec['fmt'], npc, **flags)
    out_fmt = {'bfloat16': 'bf16', 'float32': 'fp32'}[spec['out_dtype']]
    fn = lambda: tile_kernels_aot.quant.per_token_cast_back(q, out_fmt, npc)  # noqa: E731
    return f'T={tokens}, H=7168, {npc} per sf', fn, nbytes(*q, fn())


def topk_sum_case(spec, tokens):
    g, per_group, topk_sum, topk_groups = spec['num_groups'], spec['experts_per_group'], spec['num_topk_sum'], spec['num_topk_groups']
    scores = torch.randn(tokens, g, per_group, device='cuda')
    fn = lambda: tile_kernels_aot.moe.topk_sum_and_topk_group_idx(scores, topk_sum, topk_groups)  # noqa: E731
    return f'T={tokens}', fn, nbytes(scores, fn())


def top2_sum_gate_case(spec, tokens):
    """Sigmoid scoring with everything a DeepSeek-V3 deployment passes: a token mask, one shared expert
    as a routed slot through a replica map with 32 extra experts, EP 4 x TP 2 seen from TP rank 1."""
    e, k = spec['num_experts'], spec['num_topk']
    shared = 1 if e % k == 0 else 0
    logits, bias = torch.randn(tokens, e, device='cuda'), torch.randn(e, device='cuda')
    physical_map = torch.arange(e + shared, dtype=torch.int32, device='cuda')[:, None].repeat(1, 33)
    counts = torch.ones(e + shared, dtype=torch.int32, device='cuda')
    mask = torch.ones(tokens, dtype=torch.bool, device='cuda')
    args = (logits, bias, k, spec['num_topk_groups'], spec['num_groups'], shared > 0, shared, 2.5, 0, 4, 1, 2, 'sigmoid')
    fn = lambda: tile_kernels_aot.moe.top2_sum_gate(*args, mask=mask, to_physical_map=physical_map, logical_count=counts)  # noqa: E731
    return f'T={tokens}', fn, nbytes(logits, bias, mask, *fn())


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


def _fused_routing(tokens, num_topk=8, num_experts=256, alignment=128):
    idx = routing_indices(tokens, num_topk, num_experts)
    p2e, _, _, t2p, *_ = tile_kernels_aot.moe.get_fused_mapping(idx, num_experts, 0, alignment)
    return idx, p2e, t2p


def fused_mapping_case(spec, tokens):
    idx = routing_indices(tokens).to(getattr(torch, spec['index_dtype']))
    # With the host sync that trims the outputs, as upstream times it; decode sizes skip it, since
    # they are timed inside a captured CUDA graph.
    no_sync = tokens in DECODE_TOKENS
    fn = lambda: tile_kernels_aot.moe.get_fused_mapping(idx, 256, 0, 128, force_no_sync=no_sync)  # noqa: E731
    return f'T={tokens}, K=8, E=256, align 128' + (', no sync' if no_sync else ''), fn, nbytes(idx, *fn()[:7])


def expand_case(spec, tokens):
    dtype = DTYPE_OF_SIZE[spec['elem_bytes']]
    _, p2e, t2p = _fused_routing(tokens)
    extra = 0 if spec['aligned'] else 1  # the unaligned spec serves rows off 16-byte boundaries
    x = torch.randn(tokens, 7168 + extra, device='cuda').to(dtype)[:, extra:]
    fn = lambda: tile_kernels_aot.moe.expand_to_fused(x, t2p, p2e)  # noqa: E731
    return f'T={tokens}, H=7168, K=8, E=256', fn, nbytes(x, t2p, p2e, fn())


def reduce_case(spec, tokens):
    dtype = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[spec['in_dtype']]
    fp8_format = '' if spec['out_dtype'] == 'same' else 'e4m3'
    _, p2e, t2p = _fused_routing(tokens)
    x = torch.randn(p2e.shape[0], 7168, device='cuda').to(dtype)
    weights = torch.rand(t2p.shape, device='cuda')
    fn = lambda: tile_kernels_aot.moe.reduce_fused(x, weights, t2p, fp8_format)  # noqa: E731
    read = int((t2p >= 0).sum()) * 7168 * x.element_size()  # only routed rows are read
    return f'T={tokens}, H=7168, K=8, weights', fn, read + nbytes(t2p, weights, fn())


def _swiglu_layout(rows, num_topk=8):
    """Every one of `rows` fused rows routed, for rows // num_topk tokens: (pos_to_token_topk, weights,
    pos_to_expert, token_topk_to_pos)."""
    tokens = max(-(-rows // num_topk), 1)
    p2tt = torch.arange(rows, dtype=torch.int32, device='cuda')
    t2p = torch.full((tokens, num_topk), -1, dtype=torch.int32, device='cuda')
    t2p.view(-1)[:rows] = p2tt
    return p2tt, torch.rand(tokens, num_topk, device='cuda'), torch.zeros(rows, dtype=torch.int32, device='cuda'), t2p


def swiglu_forward_case(spec, tokens):
    """DeepSeek-V3's expert width (2048), weights, pos_to_expert, clamp 10 with counters: the full path. A per-row
    spec that the op does not use at 2048 (a larger CTA: the op takes the smallest that holds the row) runs at the
    widest row it takes."""
    from tile_kernels_aot.quant.swiglu import per_row_threads

    dtype = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[spec['in_dtype']]
    hidden = 2048
    if spec['per_row'] and per_row_threads(spec['in_dtype'], hidden, 0) != spec['row_threads']:
        hidden = spec['row_threads'] * 16  # the widest row the spec's kernel takes
    npc = hidden if spec['per_row'] else 128
    packed = spec['sf_format'] == 'ue8m0'
    p2tt, weights, p2e, _ = _swiglu_layout(tokens)
    count = torch.zeros(3, dtype=torch.int64, device='cuda')
    cases = []
    # randn, where no value reaches the clamp (10), and three times randn, where about one in a thousand does: the
    # elements of a step with such a value are clamped, and the step's clamps counted again.
    for reached, scale in (('', 1), (', clamp reached', 3)):
        x = (torch.randn(tokens, 2 * hidden, device='cuda') * scale).to(dtype)
        fn = partial(tile_kernels_aot.quant.swiglu_forward_and_per_token_cast, x, 'e4m3', npc, p2tt, weights, p2e,
                     use_tma_aligned_col_major_sf=packed, round_sf=True, use_packed_ue8m0=packed, swiglu_clamp_value=10.0,
                     clamped_count=count)
        cases.append((f'T={tokens}, H={hidden}, npc={npc}{reached}', fn, nbytes(x, p2tt, weights, p2e, *fn())))
    return cases


def swiglu_channel_case(spec, tokens):
    """On a pointer for which the op takes the spec on this GPU: 32-byte aligned, else 16 bytes past such a boundary.
    A spec the op takes for neither (the 32-byte kernel, SM100's choice, on an sm_90a GPU) is forced onto the
    aligned pointer, 'forced' in the label."""
    import tile_kernels_aot.quant.swiglu as ops
    tokens = max(tokens // 128 * 128, 128)
    target = package_for_device(0).target

    def rows(offset, scale=1):
        return (torch.randn(tokens * 2 * 2048 + offset, device='cuda') * scale).bfloat16()[offset:].view(tokens, 2 * 2048)

    cases = []
    # randn, where no value reaches the clamp (10), and three times randn, where about one in a thousand does (the
    # tests' inputs): a thread with such a value takes the clamping path.
    for reached, scale in (('', 1), (', clamp reached', 3)):
        aligned, past = rows(0, scale), rows(8, scale)  # a 32-byte aligned pointer, and one 16 bytes past such a boundary
        x = next((c for c in (aligned, past) if ops.swiglu_forward_and_per_channel_cast_spec(c, not spec['transpose'], target) == spec), None)
        forced = x is None
        x = aligned if forced else x
        fn = partial(ops.swiglu_forward_and_per_channel_cast_and_transpose, x, 'e4m3', 128, round_sf=True,
                     without_transpose=not spec['transpose'], swiglu_clamp_value=10.0)
        if forced:
            fn = with_spec_function(ops, 'swiglu_forward_and_per_channel_cast_spec', spec, fn)
        cases.append((f'T={tokens}, H=2048, npt=128{reached}' + (', forced' if forced else ''), fn, nbytes(x, *fn())))
    return cases


def swiglu_backward_case(spec, tokens):
    hidden = 2048
    data = torch.randn(tokens, 2 * hidden, device='cuda').to(torch.float8_e4m3fn)
    sf = torch.rand(tokens, 2 * hidden // 128, device='cuda')
    grad = torch.randn(tokens, hidden, device='cuda').bfloat16()
    p2tt, weights, _, t2p = _swiglu_layout(tokens)
    fn = lambda: tile_kernels_aot.quant.swiglu_backward_and_per_token_cast(  # noqa: E731
        (data, sf), grad, weights, p2tt, t2p, 128, round_sf=True, swiglu_clamp_value=10.0)
    out, (q, q_sf), x_grad, weight_grad = fn()
    return f'T={tokens}, H={hidden}, npc=128', fn, nbytes(data, sf, grad, weights, p2tt, t2p, out, q, q_sf, x_grad, weight_grad)


def per_block_cast_case(spec, tokens):
    dtype = {'bfloat16': torch.bfloat16, 'float32': torch.float32}[spec['in_dtype']]
    # The 16-byte vector variant serves inputs whose pointer or row stride is 16- but not 32-byte aligned.
    offset = 16 // dtype.itemsize if spec['vec_bytes'] == 16 else 0
    x = torch.randn(tokens, 7168 + offset, device='cuda').to(dtype)[:, offset:]
    block = (spec['block_m'], spec['block_k'])
    packed = spec['sf_format'] == 'ue8m0'
    flags = dict(use_tma_aligned_col_major_sf=packed, round_sf=packed, use_packed_ue8m0=packed)
    assert tile_kernels_aot.quant.per_block.per_block_cast_spec(x, spec['fmt'], block, packed) == spec
    fn = lambda: tile_kernels_aot.quant.per_block_cast(x, spec['fmt'], block, **flags)  # noqa: E731
    return f'T={tokens}, H=7168, block {block}', fn, nbytes(x, *fn())


def per_block_cast_lossless_case(spec, tokens):
    """e2m1 with (1, 32) scale factors, as upstream's test, re-encoded on the spec's output blocks."""
    block = (spec['block_m'], spec['block_k'])
    in_packed, packed = spec['in_sf_format'] == 'ue8m0', spec['sf_format'] == 'ue8m0'
    x = torch.randn(tokens, 7168, device='cuda')
    q = tile_kernels_aot.reference.cast(x, 'e2m1', (1, 32), round_sf=True, use_tma_aligned_col_major_sf=in_packed, use_packed_ue8m0=in_packed)
    fn = lambda: tile_kernels_aot.quant.per_block_cast_lossless(q, 'e4m3', (1, 32), block, use_tma_aligned_col_major_sf=packed,  # noqa: E731
                                                                  use_packed_ue8m0=packed)
    return f'T={tokens}, H=7168, (1, 32) -> {block}', fn, nbytes(*q, *fn())


def per_channel_fused_case(spec, tokens):
    """H 7168; the gather reads `tokens` input rows in random order (with repeats, every 5th row -1), the
    e4m3 input comes with its (1, 128) scale factors."""
    hidden, num_tokens = 7168, -(-tokens // 128) * 128
    x = torch.randn(num_tokens, hidden, device='cuda')
    if spec['in_dtype'] == 'float8_e4m3fn':
        from tile_kernels_aot import reference

        x, npc = reference.cast(x.bfloat16(), 'e4m3', (1, 128)), 128
    else:
        x, npc = x.to(getattr(torch, spec['in_dtype'])), None
    pos = None
    if spec['gather']:
        pos = torch.randint(0, num_tokens, (num_tokens,), dtype=torch.int32, device='cuda')
        pos[::5] = -1
    fn = lambda: tile_kernels_aot.quant.per_channel_cast_fused(x, 'e4m3', 128, num_per_channels=npc, pos_to_token=pos)  # noqa: E731
    inputs = x if isinstance(x, tuple) else (x,)
    return f'T={num_tokens} H={hidden}', fn, nbytes(*inputs, *fn(), *(() if pos is None else (pos,)))


def per_channel_transpose_case(spec, tokens):
    x = torch.randn(-(-tokens // 128) * 128, 7168, device='cuda').bfloat16()
    fn = lambda: tile_kernels_aot.quant.per_channel_cast_and_transpose(x, 'e4m3', spec['num_per_tokens'])  # noqa: E731
    return f'T={x.shape[0]} H=7168', fn, nbytes(x, *fn())


def e5m6_cast_case(spec, tokens):
    from tile_kernels_aot.quant.e5m6 import per_token_cast_to_e5m6

    extra = 0 if spec['aligned'] else 1  # the unaligned variant serves rows that are not 16-byte aligned
    x = torch.randn(tokens, 7168 + extra, device='cuda').to(getattr(torch, spec['in_dtype']))[:, extra:]
    packed = spec['sf_format'] == 'ue8m0'
    fn = lambda: per_token_cast_to_e5m6(x, 7168, packed, True, packed)  # noqa: E731
    return f'T={tokens} H=7168', fn, nbytes(x, *fn())


def e5m6_cast_back_case(spec, tokens):
    from tile_kernels_aot.quant.e5m6 import cast_back_from_e5m6, per_token_cast_to_e5m6

    packed = spec['sf_format'] == 'ue8m0'
    data, sf = per_token_cast_to_e5m6(torch.randn(tokens, 7168, device='cuda').bfloat16(), 7168, packed, True, packed)
    if not spec['aligned']:  # 4- but not 16-byte aligned data
        data = copy_at(data, 4)
    fmt = 'bf16' if spec['out_dtype'] == 'bfloat16' else 'fp32'
    fn = lambda: cast_back_from_e5m6((data, sf), fmt, (1, 7168))  # noqa: E731
    return f'T={tokens} H=7168', fn, nbytes(data, sf, fn())


CASES = {
    'transpose.batched_transpose': transpose_case,
    'moe.topk_gate': topk_case,
    'moe.topk_sum_and_topk_group_idx': topk_sum_case,
    'moe.top2_sum_gate': top2_sum_gate_case,
    'moe.normalize_weight': normalize_weight_case,
    'moe.group_count': group_count_case,
    'moe.aux_fi': aux_fi_case,
    'moe.inplace_unique_group_indices': unique_case,
    'moe.mask_indices_by_tp': mask_by_tp_case,
    'quant.per_token_cast': per_token_cast_case,
    'quant.per_token_requant': per_token_requant_case,
    'quant.swiglu_forward_and_per_token_cast': swiglu_forward_case,
    'quant.swiglu_forward_and_per_channel_cast_and_transpose': swiglu_channel_case,
    'quant.swiglu_backward_and_per_token_cast': swiglu_backward_case,
    'quant.cast_back': cast_back_case,
    'moe.get_fused_mapping': fused_mapping_case,
    'moe.expand_to_fused': expand_case,
    'moe.reduce_fused': reduce_case,
    'quant.per_block_cast': per_block_cast_case,
    'quant.per_block_cast_lossless': per_block_cast_lossless_case,
    'quant.per_channel_cast_fused': per_channel_fused_case,
    'quant.per_channel_cast_and_transpose': per_channel_transpose_case,
    'quant.per_token_cast_to_e5m6': e5m6_cast_case,
    'quant.cast_back_e5m6': e5m6_cast_back_case,
    **ENGRAM_CASES,
    **MHC_NORM_FN_CASES,
    **MHC_MIXES_CASES,
    **MHC_STREAM_CASES,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None, help='write one JSON object per line here')
    parser.add_argument('--kernels', default='*', help='globs over kernel names, comma-separated')
    parser.add_argument('--tokens', type=int, default=8192)
    parser.add_argument('--decode', action='store_true', help='also time decode sizes (graph replay and host time)')
    parser.add_argument('--ab', default=None, help="an arch package's folder whose binaries are timed in turn with the installed ones")
    parser.add_argument('--rounds', type=int, default=4, help='with --ab: rounds of each side')
    args = parser.parse_args()
    if args.ab:
        if not args.out or args.decode:
            parser.error('--ab needs --out PREFIX and takes no --decode')
        return ab(args.ab, args.rounds, args.kernels, args.tokens, args.out)

    timer = Timer()
    copy_gbs = copy_bandwidth(timer)
    same_size_copy = SameSizeCopy(timer)
    gpu = torch.cuda.get_device_name(0)
    print(f'# {gpu}, torch {torch.__version__}, tile_kernels_aot {tile_kernels_aot.__version__}; copy bandwidth {copy_gbs:.0f} GB/s')
    record = RowWriter(args.out)  # what ran survives a case that hangs
    record({'kernel': 'copy', 'gbs': copy_gbs, 'gpu': gpu})
    kernels, missing = select(CASES, args.kernels, installed_kernels())
    for kernel in missing:
        record(no_case_row(kernel, 'benchmarks/run.py'))
    for kernel in kernels:
        for spec in prebuilt_specs(kernel, 0):
            faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
            for i, (label, fn, moved) in enumerate(cases_of(CASES[kernel], spec, args.tokens)):
                times = timer.device_times(fn)
                us = statistics.median(times)
                row = {'kernel': kernel, 'spec': spec, 'shape': label, 'tokens': args.tokens, 'us': us, 'min_us': min(times), 'max_us': max(times),
                       'gbs': moved / us / 1e3, 'of_copy': moved / us / 1e3 / copy_gbs, 'of_same_size_copy': same_size_copy(moved) / us}
                if args.decode and kernel != 'transpose.batched_transpose':
                    row['decode'] = {}
                    for t in DECODE_TOKENS:
                        small = cases_of(CASES[kernel], spec, t)[i][1]
                        row['decode'][t] = {'graph_us': timer.graph_us(small), 'host_us': timer.host_us(small)}
                record(row)
                print(f'{kernel:28s} {json.dumps(spec, separators=(",", ":")):90s} {label:18s} {us:8.1f} us {row["gbs"]:7.0f} GB/s '
                      f'{100 * row["of_copy"]:5.1f}% ({100 * row["of_same_size_copy"]:5.1f}% of a copy of its size)', flush=True)
                del fn
                torch.cuda.empty_cache()
            faulthandler.cancel_dump_traceback_later()
    record.close()
    return 1 if missing else 0


def _use(kernel_dir: str | None) -> None:
    """Serve the next calls from `kernel_dir`'s binaries, or from the installed ones (None)."""
    if kernel_dir is None:
        os.environ.pop(KERNEL_DIRS_ENV, None)
    else:
        os.environ[KERNEL_DIRS_ENV] = kernel_dir
    _select.reset()


def ab(kernel_dir: str, rounds: int, pattern: str, tokens: int, prefix: str) -> int:
    """The --ab run (see the module docstring)."""
    timer = Timer()
    sides = {'base': None, 'new': str(Path(kernel_dir).resolve())}
    writers = {(side, r): RowWriter(f'{prefix}-{side}-{r + 1}.jsonl') for side in sides for r in range(rounds)}
    kernels, missing = select(CASES, pattern, installed_kernels())
    for kernel in kernels:
        for spec in prebuilt_specs(kernel, 0):
            faulthandler.dump_traceback_later(CASE_TIMEOUT_S, exit=True)
            for label, fn, moved in cases_of(CASES[kernel], spec, tokens):
                medians = {}
                for r in range(rounds):
                    for side in (('base', 'new') if r % 2 == 0 else ('new', 'base')):
                        _use(sides[side])
                        times = timer.device_times(fn)  # its first call, untimed, loads the side's binary
                        us = medians[side, r] = statistics.median(times)
                        writers[side, r]({'kernel': kernel, 'spec': spec, 'shape': label, 'tokens': tokens, 'us': us,
                                          'min_us': min(times), 'max_us': max(times)})
                ratio = statistics.median(medians['new', r] for r in range(rounds)) / statistics.median(medians['base', r] for r in range(rounds))
                print(f'{kernel:28s} {json.dumps(spec, separators=(",", ":")):70s} {label:18s} new/base {ratio:.3f}', flush=True)
                del fn
                _use(None)
                torch.cuda.empty_cache()
            faulthandler.cancel_dump_traceback_later()
    for writer in writers.values():
        writer.close()
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
