"""Adversarial index and gating values, one case a process, for compute-sanitizer memcheck.

    python -m benchmarks.adversarial --list
    python -m benchmarks.adversarial --case NAME        one case: the call, then a synchronisation
    python -m benchmarks.adversarial --all [--cases GLOB] [--sample] [--sanitizer memcheck] [--out FILE.jsonl] [--jobs N]

Each case spoils one entry of a valid call of a routing, gather or scatter op (or one score of a gating op) with a
bad value: just past the end, 2**31 - 1, an int64 past 2**32, a negative int64 below -2**31, NaN, infinity. The
package's rule (kernel_src/bounds.py) fixes the outcome of each: a negative index is padding and the call succeeds;
any other bad value stops the kernel, with "device-side assert triggered" (or, for the kernels that check with a
predicated trap, "unspecified launch failure"), and masks the value so that nothing outside the tensors is touched;
inplace_unique_group_indices only compares its values, and succeeds on any. `--all` runs every case in a fresh process
(a failed check ends the CUDA context), N at once, under the sanitizer when asked, and
checks both: the outcome, and that the sanitizer reports no invalid or out-of-bounds access. The exit status is 1
when any case breaks either. The checks are off (TILE_KERNELS_AOT_CHECK_INDICES unset), so what is tested is the
kernels' own.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

E, K, T = 256, 8, 64  # experts, top-k, tokens
ASSERT = 'device-side assert triggered'
TRAP = 'unspecified launch failure'
PADDING = 'ok'
# What compute-sanitizer memcheck prints for an access outside an allocation (global, shared or local memory).
INVALID_ACCESS = re.compile(r'Invalid __(global|shared|local)__ (read|write)|Out of bounds|out of range|Misaligned', re.IGNORECASE)


def _routing(dtype=torch.int64) -> torch.Tensor:
    gen = torch.Generator(device='cuda').manual_seed(0)
    idx = torch.rand(T, E, device='cuda', generator=gen).topk(K, dim=-1).indices.to(dtype)
    idx[::5, -1] = -1
    return idx.contiguous()


def _spoiled(t: torch.Tensor, position: tuple[int, ...], value) -> torch.Tensor:
    bad = t.clone()
    bad[position] = value
    return bad


def _fused(alignment: int = 16):
    from tile_kernels_aot import moe

    pos_to_expert, _, pos_to_token_topk, token_topk_to_pos, *_ = moe.get_fused_mapping(_routing(), E, 0, alignment)
    return pos_to_expert, pos_to_token_topk, token_topk_to_pos


def _first_valid(pos_to_token_topk: torch.Tensor) -> int:
    return int((pos_to_token_topk >= 0).int().argmax())


def _counting(op: str, value: int, dtype) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        bad = _spoiled(_routing(dtype), (3, 1), value)
        return {'group_count': lambda: moe.group_count(bad, E), 'aux_fi': lambda: moe.aux_fi(bad, E, K),
                'inplace_unique_group_indices': lambda: moe.inplace_unique_group_indices(bad, E),
                'get_fused_mapping': lambda: moe.get_fused_mapping(bad, E, 0, 16)}[op]()
    return call


def _expand(value_of: Callable[[int], int], with_sf: bool) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        pos_to_expert, _, t2p = _fused()
        bad = _spoiled(t2p, (2, 1), value_of(pos_to_expert.shape[0]))
        x = torch.randn(T, 7168, device='cuda', dtype=torch.bfloat16)
        if with_sf:
            return moe.expand_to_fused_with_sf((x, torch.rand(T, 56, device='cuda')), 128, bad, pos_to_expert)
        return moe.expand_to_fused(x, bad, pos_to_expert)
    return call


def _reduce(value_of: Callable[[int], int]) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        pos_to_expert, _, t2p = _fused()
        n = pos_to_expert.shape[0]
        fused = torch.randn(n, 7168, device='cuda', dtype=torch.bfloat16)
        return moe.reduce_fused(fused, torch.rand(T, K, device='cuda'), _spoiled(t2p, (2, 1), value_of(n)))
    return call


def _swiglu_forward(value: int, in_dtype) -> Callable[[], object]:
    from tile_kernels_aot import quant

    def call():
        pos_to_expert, p2t, _ = _fused()
        x = torch.randn(pos_to_expert.shape[0], 2 * 2048, device='cuda', dtype=in_dtype)
        bad = _spoiled(p2t, (_first_valid(p2t),), value)
        return quant.swiglu_forward_and_per_token_cast(x, 'e4m3', 128, bad, torch.rand(T, K, device='cuda'), pos_to_expert)
    return call


def _swiglu_backward(value: int) -> Callable[[], object]:
    from tile_kernels_aot import quant, reference

    def call():
        pos_to_expert, p2t, t2p = _fused(alignment=128)
        n, hidden = pos_to_expert.shape[0], 2048
        x = reference.cast(torch.randn(n, 2 * hidden, device='cuda', dtype=torch.bfloat16), 'e4m3', (1, 128))
        grad_out = torch.randn(n, hidden, device='cuda', dtype=torch.bfloat16)
        bad = _spoiled(p2t, (_first_valid(p2t),), value)
        return quant.swiglu_backward_and_per_token_cast(x, grad_out, torch.rand(T, K, device='cuda'), bad, t2p, 128)
    return call


def _per_channel(value: int) -> Callable[[], object]:
    from tile_kernels_aot import quant

    def call():
        x = torch.randn(T, 7168, device='cuda', dtype=torch.bfloat16)
        pos = torch.randint(-1, T, (256,), device='cuda', dtype=torch.int32, generator=torch.Generator(device='cuda').manual_seed(0))
        return quant.per_channel_cast_fused(x, 'e4m3', 128, pos_to_token=_spoiled(pos, (17,), value))
    return call


def _top2_args(logits=None, bias=None):
    from tile_kernels_aot._select import prebuilt_specs

    spec = prebuilt_specs('moe.top2_sum_gate', 0)[0]
    e, k = spec['num_experts'], spec['num_topk']
    logits = torch.randn(T, e, device='cuda') if logits is None else logits
    bias = torch.zeros(e, device='cuda') if bias is None else bias
    return e, k, (logits, bias, k, spec['num_topk_groups'], spec['num_groups'], False, 0, 1.0, 0, 1, 0, 1, 'sigmoid')


def _top2_fixed(value: int) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        e, k, args = _top2_args()
        fixed = torch.zeros(T, dtype=torch.bool, device='cuda')
        fixed[5] = True
        unmapped = _spoiled(torch.randint(0, e, (T, k), device='cuda'), (5, 2), value)
        return moe.top2_sum_gate(*args, fix_routing_mask=fixed, unmapped_topk_idx=unmapped)
    return call


def _top2_counts(value: int) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        e, _, args = _top2_args()
        physical_map = torch.randint(0, e, (e, 3), device='cuda', dtype=torch.int32)
        # Every expert's count is the bad value, so whichever experts the random logits pick, a lookup meets it.
        counts = torch.full((e,), value, device='cuda', dtype=torch.int32)
        return moe.top2_sum_gate(*args, to_physical_map=physical_map, logical_count=counts)
    return call


def _top2_scores(value: float, which: str) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        _, _, args = _top2_args()
        if which == 'logits':
            return moe.top2_sum_gate(_spoiled(args[0], (3, 4), value), *args[1:])
        return moe.top2_sum_gate(args[0], _spoiled(args[1], (4,), value), *args[2:])
    return call


def _gate(op: str, value: float) -> Callable[[], object]:
    from tile_kernels_aot import moe

    def call():
        scores = _spoiled(torch.randn(T, E, device='cuda'), (4, 7), value)
        if op == 'topk_gate':
            return moe.topk_gate(scores, K)
        return moe.topk_sum_and_topk_group_idx(scores.view(T, 8, E // 8), 2, 4)
    return call


def _engram_hash(value: int) -> Callable[[], object]:
    from tile_kernels_aot import engram
    from tile_kernels_aot._select import prebuilt_specs

    def call():
        spec = prebuilt_specs('engram.engram_hash', 0)[0]
        n, m, layers = spec['max_ngram_size'], spec['tables_per_ngram'], 2
        gen = torch.Generator(device='cuda').manual_seed(0)
        ids = torch.randint(0, 2**20, (T, n), device='cuda', dtype=torch.int32, generator=gen)
        multipliers = torch.randint(1, 2**40, (layers, n), device='cuda', dtype=torch.int64, generator=gen)
        vocab = _spoiled(torch.randint(1000, 5000, (layers, n - 1, m), device='cuda', dtype=torch.int32, generator=gen), (1, 0, 0), value)
        offsets = torch.zeros(layers, (n - 1) * m, device='cuda', dtype=torch.int32)
        return engram.engram_hash(ids, multipliers, vocab, offsets)
    return call


def cases() -> dict[str, tuple[str, Callable[[], object]]]:
    """Every case by name: (the expected outcome, the call)."""
    out: dict[str, tuple[str, Callable[[], object]]] = {}
    # inplace_unique_group_indices only compares its values: any value is deduplicated, none is out of range.
    stops = {'group_count': TRAP, 'aux_fi': TRAP, 'inplace_unique_group_indices': PADDING, 'get_fused_mapping': ASSERT}
    for op, stop in stops.items():
        for dtype, name in ((torch.int64, 'i64'), (torch.int32, 'i32')):
            for value in (E, 2**31 - 1):
                out[f'{op}.{name}.{value}'] = (stop, _counting(op, value, dtype))
        out[f'{op}.i64.{2**32 + 1}'] = (stop, _counting(op, 2**32 + 1, torch.int64))
        out[f'{op}.i64.{-2**40}'] = (PADDING, _counting(op, -2**40, torch.int64))
    past, huge = (lambda n: n), (lambda n: 2**31 - 1)
    for label, value_of in (('past', past), ('huge', huge)):
        out[f'expand_to_fused.{label}'] = (ASSERT, _expand(value_of, False))
        out[f'expand_to_fused_with_sf.{label}'] = (ASSERT, _expand(value_of, True))
        out[f'reduce_fused.{label}'] = (ASSERT, _reduce(value_of))
    for value in (T * K, 2**31 - 1):
        out[f'swiglu_forward_and_per_token_cast.bf16.{value}'] = (TRAP, _swiglu_forward(value, torch.bfloat16))
        out[f'swiglu_forward_and_per_token_cast.f32.{value}'] = (ASSERT, _swiglu_forward(value, torch.float32))
        out[f'swiglu_backward_and_per_token_cast.{value}'] = (ASSERT, _swiglu_backward(value))
    for value in (T, 2**31 - 1):
        out[f'per_channel_cast_fused.{value}'] = (ASSERT, _per_channel(value))
    for value in (-1, 2**40, 10**6):
        out[f'top2_sum_gate.unmapped_topk_idx.{value}'] = (TRAP, _top2_fixed(value))
    for value in (0, 4, 2**31 - 1, -5):
        out[f'top2_sum_gate.logical_count.{value}'] = (TRAP, _top2_counts(value))
    for value in (0, -3):
        out[f'engram_hash.vocab_sizes.{value}'] = (ASSERT, _engram_hash(value))
    for value in (float('nan'), float('inf'), -float('inf')):
        for which in ('logits', 'bias'):
            out[f'top2_sum_gate.{which}.{value}'] = (TRAP, _top2_scores(value, which))
        out[f'topk_sum_and_topk_group_idx.{value}'] = (TRAP, _gate('topk_sum_and_topk_group_idx', value))
        out[f'topk_gate.{value}'] = (TRAP if value != value else PADDING, _gate('topk_gate', value))  # infinities rank
    return out


def sample() -> list[str]:
    """A smaller selection: the first case of each op, argument or dtype, and outcome, and every int64 value that a
    wrapping read would turn into a valid index."""
    seen, names = set(), []
    for name, (expected, _) in cases().items():
        op, variant = name.split('.')[:2]
        key = (op, variant, expected)
        if key not in seen or name.endswith(f'.{2**32 + 1}'):
            seen.add(key)
            names.append(name)
    return names


def run_case(name: str) -> int:
    _, call = cases()[name]
    call()
    torch.cuda.synchronize()
    print(f'{name}: {PADDING}', flush=True)
    return 0


def outcome_of(output: str, returncode: int) -> str:
    if returncode == 0:
        return PADDING
    for expected in (ASSERT, TRAP):
        if expected in output:
            return expected
    return f'exit {returncode}'


def run_one(name: str, expected: str, sanitizer: str | None, env: dict) -> tuple[dict, str | None]:
    """Case `name` in a process of its own (under `sanitizer` if given): its record, and the sanitizer's first report of
    an invalid access (None without one)."""
    command = [sys.executable, '-m', 'benchmarks.adversarial', '--case', name]
    if sanitizer:
        command = ['compute-sanitizer', '--tool', sanitizer, '--print-limit', '20', *command]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    output = result.stdout + result.stderr
    found = outcome_of(output, result.returncode)
    invalid = [line.strip() for line in output.splitlines() if INVALID_ACCESS.search(line)]
    record = {'case': name, 'expected': expected, 'found': found, 'invalid_accesses': len(invalid), 'sanitizer': sanitizer or '',
              'passed': found == expected and not invalid}
    return record, (invalid[0] if invalid else None)


def run_all(pattern: str, sanitizer: str | None, out_path: str | None, only_sample: bool = False, jobs: int = 1) -> int:
    """Every chosen case, `jobs` processes at a time (each has its own CUDA context, so a case's device-side assert
    ends only its own process); records and lines in case order."""
    env = {k: v for k, v in os.environ.items() if k != 'TILE_KERNELS_AOT_CHECK_INDICES'}
    chosen = set(sample()) if only_sample else None
    todo = [(name, expected) for name, (expected, _) in cases().items()
            if fnmatch.fnmatchcase(name, pattern) and (chosen is None or name in chosen)]
    records = []
    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        for record, first_invalid in pool.map(lambda case: run_one(*case, sanitizer, env), todo):
            records.append(record)
            print(f"{'ok  ' if record['passed'] else 'FAIL'} {record['case']}: expected {record['expected']!r}, got {record['found']!r}"
                  + (f"; {record['invalid_accesses']} invalid accesses, first: {first_invalid}" if first_invalid else ''), flush=True)
    failures = sum(not r['passed'] for r in records)
    print(f'{len(records) - failures} of {len(records)} adversarial cases held' + (f' under {sanitizer}' if sanitizer else ''))
    if out_path:
        with open(out_path, 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in records)
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument('--list', action='store_true')
    group.add_argument('--case')
    group.add_argument('--all', action='store_true')
    parser.add_argument('--cases', default='*', help='with --all: a glob over case names')
    parser.add_argument('--sample', action='store_true', help='with --all: only the cases of sample()')
    parser.add_argument('--sanitizer', help='a compute-sanitizer tool to run each case under, e.g. memcheck')
    parser.add_argument('--out', help='JSON Lines, one record a case')
    parser.add_argument('--jobs', type=int, default=1, help='with --all: cases run at once, each in its own process')
    args = parser.parse_args()
    if args.list:
        for name, (expected, _) in cases().items():
            print(f'{name}\t{expected}')
        return 0
    if args.case:
        return run_case(args.case)
    return run_all(args.cases, args.sanitizer, args.out, args.sample, args.jobs)


if __name__ == '__main__':
    sys.exit(main())
