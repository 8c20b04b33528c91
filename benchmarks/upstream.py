"""Our kernels against upstream TileKernels v1 (JIT through tilelang) on the same inputs, in one process.

    python -m benchmarks.upstream [--out results.jsonl] [--kernels PATTERN] [--tokens 8192]

Needs `tile_kernels` importable (on the GPU host: ../shared/tools/pack-upstream-for-device.sh, unpacked
onto PYTHONPATH). For each case it checks that both give the same result (bit for bit where upstream's
own tests compare bit for bit) and times both with benchmarks.run's Timer, interleaved, so that clock
and thermal drift hit both alike: each side's time is the lowest of three interleaved medians. Upstream's
first call (its JIT compile) is timed too. The kernels are those installed for the GPU (benchmarks.run.select);
one without a case here is an error row. Composite ops (mhc_pre) are timed under their own names.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

import torch

import tile_kernels_aot as ours
from benchmarks.common import RowWriter
from benchmarks.run import Timer, cases_of, copy_bandwidth, installed_kernels, nbytes, no_case_row, select
from benchmarks.mhc_stream import UPSTREAM_CASES as MHC_STREAM_CASES
from benchmarks.mhc_mixes import UPSTREAM_CASES as MHC_MIXES_CASES, UPSTREAM_COMPOSITES as MHC_COMPOSITES
from benchmarks.engram import UPSTREAM_CASES as ENGRAM_CASES
from benchmarks.mhc_norm_fn import UPSTREAM_CASES as MHC_NORM_FN_CASES


def _same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _all_same_bits(a, b):
    return all(_same_bits(x, y) for x, y in zip(a, b, strict=True))


def _close(a, b):
    return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-8)


# -- one case builder per kernel: tokens -> (label, ours, theirs, compare, bytes moved), or a list of them -------
# -- (benchmarks.run.cases_of takes either) ---------------------------------------------------------------------


def transpose_case(tk, tokens):
    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    return 'bf16 x7168', lambda: ours.transpose.transpose(x), lambda: tk.transpose.transpose(x), _same_bits, 2 * nbytes(x)


def topk_gate_case(tk, tokens):
    scores = torch.randn(tokens, 256, device='cuda')
    return 'E256 K8', lambda: ours.moe.topk_gate(scores, 8), lambda: tk.moe.topk_gate(scores, 8), _same_bits, nbytes(scores) + tokens * 64


def topk_sum_case(tk, tokens):
    scores = torch.randn(tokens, 8, 32, device='cuda')
    return 'G8 x32, top-2 sum, 4 kept', (lambda: ours.moe.topk_sum_and_topk_group_idx(scores, 2, 4)), \
        (lambda: tk.moe.topk_sum_and_topk_group_idx(scores, 2, 4)), _same_bits, nbytes(scores) + tokens * 32


def top2_sum_gate_case(tk, tokens):
    """DeepSeek-V3's router as upstream benchmarks it: sigmoid, 8 groups, 4 kept, K 8, a mask, one shared
    expert as a routed slot through a replica map with 32 extra experts, EP 4 x TP 2 from TP rank 1."""
    from tests.gpu.test_top2_sum_gate import gate_inputs  # logits with no near-ties, so both must agree exactly

    logits, bias = gate_inputs(tokens, dict(num_experts=256, num_topk=8, num_groups=8, num_topk_groups=4), 'sigmoid')
    physical_map = torch.arange(257, dtype=torch.int32, device='cuda')[:, None].repeat(1, 33)
    counts = torch.ones(257, dtype=torch.int32, device='cuda')
    mask = torch.ones(tokens, dtype=torch.bool, device='cuda')
    mask[::7] = False
    args = (logits, bias, 8, 4, 8, True, 1, 2.5, 0, 4, 1, 2, 'sigmoid')
    kwargs = dict(mask=mask, to_physical_map=physical_map, logical_count=counts)

    def compare(a, b):
        # Upstream's test: indices equal after a per-row sort, weights close.
        return _same_bits(a[0].sort(dim=1).values, b[0].sort(dim=1).values) and _close(a[1].sort(dim=1).values, b[1].sort(dim=1).values)

    return 'DeepSeek-V3 sigmoid G8/4 K8 +1 shared', lambda: ours.moe.top2_sum_gate(*args, **kwargs), \
        lambda: tk.moe.top2_sum_gate(*args, **kwargs), compare, nbytes(logits, bias, mask) + tokens * 9 * 12


def normalize_weight_case(tk, tokens):
    w = torch.rand(tokens, 8, device='cuda')
    return 'K8', lambda: ours.moe.normalize_weight(w), lambda: tk.moe.normalize_weight(w), _all_same_bits, 3 * nbytes(w)


def _routing(tokens):
    return torch.rand(tokens, 256, device='cuda').topk(8, dim=-1).indices


def group_count_case(tk, tokens):
    idx = _routing(tokens)
    return 'E256 K8', lambda: ours.moe.group_count(idx, 256), lambda: tk.moe.group_count(idx, 256), _same_bits, nbytes(idx)


def aux_fi_case(tk, tokens):
    idx = _routing(tokens)
    # Upstream adds per-block fractions with float atomics: equal to rounding, not bit for bit.
    return 'E256 K8', lambda: ours.moe.aux_fi(idx, 256, 8), lambda: tk.moe.aux_fi(idx, 256, 8), _close, nbytes(idx)


def unique_case(tk, tokens):
    """In place: the first call deduplicates each row, and every later call reads rows that are already unique, which
    the kernel processes the same way (and leaves as they are)."""
    base = _routing(tokens) // 32
    a, b = base.clone(), base.clone()

    def run(fn, t):
        fn(t, 8)
        return t

    return 'G8 K8', lambda: run(ours.moe.inplace_unique_group_indices, a), lambda: run(tk.moe.inplace_unique_group_indices, b), \
        _same_bits, 2 * nbytes(base)


def mask_by_tp_case(tk, tokens):
    idx = _routing(tokens)
    return 'E256 EP8 TP2', lambda: ours.moe.mask_indices_by_tp(idx, 256, 8, 1, 2), lambda: tk.moe.mask_indices_by_tp(idx, 256, 8, 1, 2), \
        _same_bits, 2 * nbytes(idx)


def per_token_cast_case(tk, tokens):
    """Upstream's three benchmark configurations: e4m3 128 per scale factor, its column-major packed UE8M0 variant
    with round_sf, and e2m1 32 per scale factor."""
    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    packed = {'use_tma_aligned_col_major_sf': True, 'round_sf': True, 'use_packed_ue8m0': True}
    cases = []
    for fmt, npc, flags, label in (('e4m3', 128, {}, 'e4m3 128/ch H7168'), ('e4m3', 128, packed, 'e4m3 128/ch packed UE8M0 H7168'),
                                   ('e2m1', 32, {}, 'e2m1 32/ch H7168')):
        sf_bytes = tokens * (-(-7168 // npc)) * (1 if flags else 4)
        cases.append((label, partial(ours.quant.per_token_cast, x, fmt, npc, **flags), partial(tk.quant.per_token_cast, x, fmt, npc, **flags),
                      _all_same_bits, nbytes(x) + x.numel() // (2 if fmt == 'e2m1' else 1) + sf_bytes))
    return cases


def per_token_requant_case(tk, tokens):
    """A quantised input re-quantised: e4m3 (128, 128) blocks to e4m3 128 per scale factor (packed UE8M0) and to e2m1
    32 per scale factor (float32 scale factors without round_sf, upstream's default, and packed UE8M0), e2m1 (32, 32)
    blocks to e2m1 (packed UE8M0)."""
    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    packed = {'use_tma_aligned_col_major_sf': True, 'round_sf': True, 'use_packed_ue8m0': True}
    cases = []
    for in_fmt, block, fmt, npc, flags, label in (
            ('e4m3', (128, 128), 'e4m3', 128, packed, 'e4m3 (128,128) -> e4m3 128/ch packed UE8M0 H7168'),
            ('e4m3', (128, 128), 'e2m1', 32, {}, 'e4m3 (128,128) -> e2m1 32/ch f32 sf H7168'),
            ('e4m3', (128, 128), 'e2m1', 32, packed, 'e4m3 (128,128) -> e2m1 32/ch packed UE8M0 H7168'),
            ('e2m1', (32, 32), 'e2m1', 32, packed, 'e2m1 (32,32) -> e2m1 32/ch packed UE8M0 H7168')):
        q = ours.quant.per_block_cast(x, in_fmt, block, **flags)
        mine = partial(ours.quant.per_token_cast, q, fmt, npc, x_block_size=block, **flags)
        theirs = partial(tk.quant.per_token_cast, q, fmt, npc, x_block_size=block, **flags)
        cases.append((label, mine, theirs, _all_same_bits, nbytes(*q, *mine())))
    return cases


def cast_back_case(tk, tokens):
    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    q = ours.quant.per_token_cast(x, 'e4m3', 128, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    return 'e4m3 128/ch packed UE8M0 -> bf16 H7168', lambda: ours.quant.per_token_cast_back(q, 'bf16', 128), \
        lambda: tk.quant.per_token_cast_back(q, 'bf16', 128), _same_bits, nbytes(*q) + x.numel() * 2



def _fused_consistent(r):
    routed = r[0] >= 0
    positions = torch.arange(r[0].numel(), device=r[0].device)
    return torch.equal(r[3].flatten()[r[2][routed].long()].long(), positions[routed])


def _same_fused_layout(a, b):
    """Same segments, counts and padding bit for bit; within a segment the order is implementation-defined
    (ours is flat order), so the pairs are compared as a set per expert, and each inverse map must agree."""
    if a[7] != b[7] or not all(_same_bits(x, y) for x, y in zip((a[0], *a[4:7]), (b[0], *b[4:7]))):
        return False
    pairs = lambda r: torch.sort(r[0].long() * 2**32 + r[2].long()).values  # noqa: E731 - (expert, pair) keys
    return torch.equal(pairs(a), pairs(b)) and _fused_consistent(a) and _fused_consistent(b)


def fused_mapping_case(tk, tokens):
    idx = _routing(tokens)
    return 'E256 K8 align 128, host sync', lambda: ours.moe.get_fused_mapping(idx, 256, 0, 128), \
        lambda: tk.moe.get_fused_mapping(idx, 256, 0, 128), _same_fused_layout, nbytes(idx) + tokens * 8 * 4 * 2 + 3 * 256 * 4


def _fused(tokens):
    p2e, _, _, t2p, *_ = ours.moe.get_fused_mapping(_routing(tokens), 256, 0, 128)
    return p2e, t2p


def expand_case(tk, tokens):
    p2e, t2p = _fused(tokens)
    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    moved = nbytes(x, t2p, p2e) + p2e.numel() * 7168 * 2
    return 'bf16 H7168 E256 K8 align 128', lambda: ours.moe.expand_to_fused(x, t2p, p2e), \
        lambda: tk.moe.expand_to_fused(x, t2p, p2e), _same_bits, moved


def reduce_case(tk, tokens):
    p2e, t2p = _fused(tokens)
    x = torch.randn(p2e.numel(), 7168, device='cuda').bfloat16()
    w = torch.rand(t2p.shape, device='cuda')
    moved = int((t2p >= 0).sum()) * 7168 * 2 + nbytes(t2p, w) + tokens * 7168 * 2
    return 'bf16 H7168 K8 weights', lambda: ours.moe.reduce_fused(x, w, t2p), lambda: tk.moe.reduce_fused(x, w, t2p), _same_bits, moved


def _swiglu_routing(tokens, num_topk=8, num_experts=32):
    """A fused layout from 4x as many global experts, the others' masked, rows padded to 128 per expert."""
    from tile_kernels_aot import reference

    idx = torch.rand(tokens, 4 * num_experts, device='cuda').topk(num_topk, dim=-1).indices
    idx[idx >= num_experts] = -1
    p2e, _, p2tt, t2p, *_ = reference.get_fused_mapping(idx, num_experts, 0, 128)
    return p2e.int(), p2tt.int(), t2p.int().contiguous(), torch.rand(tokens, num_topk, device='cuda')


def swiglu_forward_case(tk, tokens):
    """Upstream's kernel uses tilelang's legacy reducer (T.alloc_reducer / T.finalize_reducer), which
    tilelang 0.1.15 does not lower; the case says so instead of timing nothing."""
    hidden = 2048
    x = torch.randn(tokens, 2 * hidden, device='cuda').bfloat16()
    p2tt = torch.arange(tokens, dtype=torch.int32, device='cuda')
    weights = torch.rand(-(-tokens // 8), 8, device='cuda')
    p2e = torch.zeros(tokens, dtype=torch.int32, device='cuda')
    args = (x, 'e4m3', 128, p2tt, weights, p2e, False, True, False, 10.0)
    try:
        if tk is not None:  # without upstream (benchmarks.host_overhead's fallback) ours alone is timed
            tk.quant.swiglu_forward_and_per_token_cast(*args)
    except Exception as exc:
        raise RuntimeError('upstream swiglu_forward_and_per_token_cast does not build here (it needs the legacy '
                           f'T.alloc_reducer lowering, gone in tilelang 0.1.15): {type(exc).__name__}: {exc}') from exc

    def compare(a, b):  # rows are all routed (pos_to_expert 0): everything is written and compared
        return _all_same_bits(a, b)

    return 'H2048 npc128 w, clamp 10', lambda: ours.quant.swiglu_forward_and_per_token_cast(*args), \
        lambda: tk.quant.swiglu_forward_and_per_token_cast(*args), compare, nbytes(x, p2tt, weights, p2e) + tokens * (hidden + 64)


def swiglu_channel_case(tk, tokens):
    x = torch.randn(max(tokens // 128 * 128, 128), 2 * 2048, device='cuda').bfloat16()
    args = (x, 'e4m3', 128, True, False, 10.0)
    return 'H2048 npt128 transposed, clamp 10', lambda: ours.quant.swiglu_forward_and_per_channel_cast_and_transpose(*args), \
        lambda: tk.quant.swiglu_forward_and_per_channel_cast_and_transpose(*args), _all_same_bits, nbytes(x) * 5 // 4 + x.shape[0] * 16 * 4


def swiglu_backward_case(tk, tokens):
    """Upstream's test layout: a fused layout aligned to the block width, x cast per (1, 128) block."""
    from tile_kernels_aot import reference

    hidden = 2048
    p2e, p2tt, t2p, weights = _swiglu_routing(max(tokens // 8, 1))
    rows = p2e.shape[0]
    x = reference.cast(torch.randn(rows, 2 * hidden, device='cuda').bfloat16(), 'e4m3', (1, 128))
    grad = torch.randn(rows, hidden, device='cuda').bfloat16()
    args = (x, grad, weights, p2tt, t2p, 128, True, 10.0)

    def compare(a, b):  # upstream's test: bitwise, weight_grad to 1e-4
        return _all_same_bits((a[0], *a[1], a[2]), (b[0], *b[1], b[2])) and torch.allclose(a[3], b[3], atol=1e-4, rtol=1e-4)

    moved = nbytes(*x, grad, weights, p2tt, t2p) + rows * hidden * (2 + 2 + 4) + rows * 2 * hidden // 128 * 4 + nbytes(weights)
    return f'{rows} rows H2048 npc128, clamp 10', lambda: ours.quant.swiglu_backward_and_per_token_cast(*args), \
        lambda: tk.quant.swiglu_backward_and_per_token_cast(*args), compare, moved


def per_block_cast_case(tk, tokens):
    """e4m3 (128, 128) blocks, row-major float32 scale factors (upstream leaves the unused bytes of packed
    UE8M0 words unset, so a packed layout would not compare bit for bit)."""
    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    return 'bf16 e4m3 (128,128) H7168', lambda: ours.quant.per_block_cast(x, 'e4m3', (128, 128)), \
        lambda: tk.quant.per_block_cast(x, 'e4m3', (128, 128)), _all_same_bits, nbytes(x) + x.numel() + (-(-tokens // 128)) * 56 * 4


def per_block_cast_lossless_case(tk, tokens):
    """e2m1 with packed UE8M0 (1, 32) scale factors (upstream's test input) to e4m3 on (1, 128) blocks, float32 sf."""
    x = torch.randn(tokens, 7168, device='cuda')
    q = ours.reference.cast(x, 'e2m1', (1, 32), round_sf=True, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    args = (q, 'e4m3', (1, 32), (1, 128))
    return 'e2m1 (1,32) -> e4m3 (1,128) H7168', lambda: ours.quant.per_block_cast_lossless(*args), \
        lambda: tk.quant.per_block_cast_lossless(*args), _all_same_bits, nbytes(*q) + x.numel() + tokens * 56 * 4


def per_channel_fused_case(tk, tokens):
    x = torch.randn(-(-tokens // 128) * 128, 7168, device='cuda').bfloat16()
    return 'bf16 128 tokens/ch H7168', lambda: ours.quant.per_channel_cast_fused(x, 'e4m3', 128), \
        lambda: tk.quant.per_channel_cast_fused(x, 'e4m3', 128), _all_same_bits, nbytes(x) + x.numel() + x.shape[0] // 128 * 7168 * 4


def per_channel_transpose_case(tk, tokens):
    x = torch.randn(-(-tokens // 128) * 128, 7168, device='cuda').bfloat16()
    return 'bf16 128 tokens/ch H7168', lambda: ours.quant.per_channel_cast_and_transpose(x, 'e4m3', 128), \
        lambda: tk.quant.per_channel_cast_and_transpose(x, 'e4m3', 128), _all_same_bits, nbytes(x) + x.numel() + x.shape[0] // 128 * 7168 * 4


def e5m6_cast_case(tk, tokens):
    from tile_kernels_aot.quant.e5m6 import per_token_cast_to_e5m6

    x = torch.randn(tokens, 7168, device='cuda').bfloat16()
    return 'bf16 H7168 round_sf', lambda: per_token_cast_to_e5m6(x, 7168, round_sf=True), \
        lambda: tk.quant.per_token_cast(x, 'e5m6', 7168, round_sf=True), _all_same_bits, nbytes(x) + tokens * (7168 * 3 // 2 + 4)


def e5m6_cast_back_case(tk, tokens):
    from tile_kernels_aot.quant.e5m6 import cast_back_from_e5m6, per_token_cast_to_e5m6

    data, sf = per_token_cast_to_e5m6(torch.randn(tokens, 7168, device='cuda').bfloat16(), 7168, round_sf=True)
    return 'to bf16 H7168', lambda: cast_back_from_e5m6((data, sf), 'bf16', (1, 7168)), \
        lambda: tk.quant.cast_back((data, sf), 'bf16', (1, 7168), x_special_fmt='e5m6'), _same_bits, nbytes(data, sf) + tokens * 7168 * 2


CASES = {
    'transpose.batched_transpose': transpose_case,
    'moe.topk_gate': topk_gate_case,
    'moe.topk_sum_and_topk_group_idx': topk_sum_case,
    'moe.top2_sum_gate': top2_sum_gate_case,
    'moe.normalize_weight': normalize_weight_case,
    'moe.group_count': group_count_case,
    'moe.aux_fi': aux_fi_case,
    'moe.inplace_unique_group_indices': unique_case,
    'moe.mask_indices_by_tp': mask_by_tp_case,
    'quant.per_token_cast': per_token_cast_case,
    'quant.per_token_requant': per_token_requant_case,
    'quant.cast_back': cast_back_case,
    'quant.swiglu_forward_and_per_token_cast': swiglu_forward_case,
    'quant.swiglu_forward_and_per_channel_cast_and_transpose': swiglu_channel_case,
    'quant.swiglu_backward_and_per_token_cast': swiglu_backward_case,
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
    **MHC_COMPOSITES,
}


def error_row(kernel: str, exc: Exception, label: str = '') -> dict:
    row = {'kernel': kernel, 'error': f'{type(exc).__name__}: {exc}'[:500]}
    if label:
        row['shape'] = label
    print(f'{kernel:34s} {label} ERROR {row["error"]}', flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=None)
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--tokens', type=int, default=8192)
    args = parser.parse_args()

    t0 = time.perf_counter()
    import tile_kernels as tk  # imports tilelang: seconds

    import_s = time.perf_counter() - t0
    import tilelang

    timer = Timer()
    copy_gbs = copy_bandwidth(timer)
    print(f'# upstream tile_kernels from {tk.__file__} (import {import_s:.1f} s, tilelang {tilelang.__version__}); '
          f'copy bandwidth {copy_gbs:.0f} GB/s')
    rows = []
    writer = RowWriter(args.out)

    def record(row: dict) -> None:
        rows.append(row)
        writer(row)

    record({'kernel': 'copy', 'gbs': copy_gbs, 'upstream_import_s': import_s, 'tilelang': tilelang.__version__,
            'upstream_version': getattr(tk, '__version__', None)})
    kernels, missing = select(CASES, args.kernels, installed_kernels() + list(MHC_COMPOSITES))
    for kernel in missing:
        record(no_case_row(kernel, 'benchmarks/upstream.py'))
    for kernel in kernels:
        label = ''
        try:
            for label, mine, theirs, compare, moved in cases_of(CASES[kernel], tk, args.tokens):
                t0 = time.perf_counter()
                expected = theirs()
                torch.cuda.synchronize()
                first_call_s = time.perf_counter() - t0
                verdict = compare(mine(), expected)  # a bool, or a dict with same_result and diagnostics
                verdict = {k: bool(v) for k, v in verdict.items()} if isinstance(verdict, dict) else {'same_result': bool(verdict)}
                same = verdict['same_result']
                ours_us, theirs_us = [], []
                for _ in range(3):  # interleaved
                    ours_us.append(timer.device_us(mine))
                    theirs_us.append(timer.device_us(theirs))
                row = {'kernel': kernel, 'shape': label, 'tokens': args.tokens, **verdict, 'upstream_first_call_s': first_call_s,
                       'ours_us': min(ours_us), 'upstream_us': min(theirs_us), 'ours_of_copy': moved / min(ours_us) / 1e3 / copy_gbs,
                       'upstream_of_copy': moved / min(theirs_us) / 1e3 / copy_gbs}
                record(row)
                print(f'{kernel:34s} {label:38s} same={same!s:5s} ours {row["ours_us"]:8.1f} us ({100 * row["ours_of_copy"]:5.1f}%)  '
                      f'upstream {row["upstream_us"]:8.1f} us ({100 * row["upstream_of_copy"]:5.1f}%)  first call {first_call_s:.2f} s', flush=True)
        except Exception as exc:  # report and go on: one upstream failure must not hide the other kernels
            record(error_row(kernel, exc, label))
    writer.close()
    return 0 if all(r.get('same_result', True) and 'error' not in r for r in rows) else 1


if __name__ == '__main__':
    sys.exit(main())
