"""Hardware counters of chosen kernels, ours and upstream's, one call each under Nsight Compute.

    ncu --profile-from-start off --nvtx --clock-control none --section SpeedOfLight ... \\
        python -m benchmarks.ncu_profile SELECTOR [SELECTOR ...] [--upstream KERNEL ...]

A SELECTOR is `kernel` or `kernel:word,word` and picks the prebuilt specs of that kernel whose JSON holds
every word (e.g. `quant.cast_back:"fmt":"e4m3","out_dtype":"float32"`). Each picked call runs once
to warm up, then once between cudaProfilerStart/Stop inside an NVTX range named after the spec, so the
report says which spec each block of counters belongs to. --upstream adds upstream's JIT kernel of
benchmarks.upstream's case for that kernel (needs tile_kernels on the path).
Where the event timings of benchmarks.run show a gap, this says whether it is DRAM, issue or latency.

    python -m benchmarks.ncu_profile --table NCU_LOG     (the report's key counters as a markdown table)
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import torch

from benchmarks.run import CASES, cases_of
from tile_kernels_aot._select import prebuilt_specs


def profiled(label: str, fn) -> None:
    fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(label)
    torch.cuda.cudart().cudaProfilerStart()
    fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    torch.cuda.nvtx.range_pop()
    print(f'profiled: {label}', flush=True)


TABLE_COUNTERS = {  # ncu's metric name -> column heading
    'Duration': 'us', 'DRAM Throughput': 'DRAM %', 'Issued Instructions': 'warp instructions (M)',
    'Issued Warp Per Scheduler': 'issued per scheduler-cycle', 'Active Warps Per Scheduler': 'active warps',
    'Eligible Warps Per Scheduler': 'eligible warps', 'Registers Per Thread': 'registers',
    'Theoretical Occupancy': 'occupancy %', 'Warp Cycles Per Issued Instruction': 'cycles per instruction', 'L2 Hit Rate': 'L2 hit %',
}


def table(report: str) -> str:
    """One row per profiled call of an ncu text report (--print-units base), named by its NVTX range."""
    lines = ['| call | ' + ' | '.join(TABLE_COUNTERS.values()) + ' |', '| --- |' + ' --- |' * len(TABLE_COUNTERS)]
    for block in re.split(r'\n  (?=\S+ \(\d+, \d+, \d+\)x)', report)[1:]:
        label = re.search(r'<0,(.*?)>', block)
        cells = []
        for name in TABLE_COUNTERS:
            value = re.search(r'\n\s+' + re.escape(name) + r'\s+(?:\S+\s+)?([\d,.]+)\n', block)
            number = float(value.group(1).replace(',', '')) if value else float('nan')
            cells.append(f'{number / 1e3:.1f}' if name == 'Duration' else f'{number / 1e6:.1f}' if name == 'Issued Instructions' else f'{number:g}')
        lines.append(f'| {label.group(1) if label else block.splitlines()[0]} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('selectors', nargs='*')
    parser.add_argument('--upstream', nargs='*', default=[])
    parser.add_argument('--tokens', type=int, default=8192)
    parser.add_argument('--table', metavar='NCU_LOG', help='print the key counters of a report instead of profiling')
    args = parser.parse_args()
    if args.table:
        with open(args.table) as f:
            print(table(f.read()))
        return 0
    for selector in args.selectors:
        kernel, _, words = selector.partition(':')
        for spec in prebuilt_specs(kernel, 0):
            text = json.dumps(spec, separators=(',', ':'), sort_keys=True)
            if all(w in text for w in words.split(',') if w):
                for label, fn, _ in cases_of(CASES[kernel], spec, args.tokens):
                    profiled(f'ours {kernel} {text} {label}', fn)
    if args.upstream:
        import tile_kernels as tk

        from benchmarks.upstream import CASES as UPSTREAM_CASES

        for kernel in args.upstream:
            for label, _, theirs, _, _ in cases_of(UPSTREAM_CASES[kernel], tk, args.tokens):
                profiled(f'upstream {kernel} {label}', theirs)
    return 0


if __name__ == '__main__':
    sys.exit(main())
