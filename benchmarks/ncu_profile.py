"""Hardware counters of chosen kernels, ours and upstream's, one call each under Nsight Compute.

    ncu --profile-from-start off --nvtx --clock-control none --section SpeedOfLight ... \\
        python -m benchmarks.ncu_profile SELECTOR [SELECTOR ...] [--upstream KERNEL ...]

A SELECTOR is `kernel` or `kernel:word,word` and picks the prebuilt specs of that kernel whose JSON holds
every word (e.g. `quant.cast_back:"fmt":"e4m3","out_dtype":"float32"`). Each picked call runs once
to warm up, then once between cudaProfilerStart/Stop inside an NVTX range named after the spec, so the
report says which spec each block of counters belongs to. --upstream adds upstream's JIT kernel of
benchmarks.upstream's case for that kernel (needs tile_kernels on the path).
Where the event timings of benchmarks.run show a gap, this says whether it is DRAM, issue or latency.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.run import CASES
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('selectors', nargs='*')
    parser.add_argument('--upstream', nargs='*', default=[])
    parser.add_argument('--tokens', type=int, default=8192)
    args = parser.parse_args()
    for selector in args.selectors:
        kernel, _, words = selector.partition(':')
        for spec in prebuilt_specs(kernel, 0):
            text = json.dumps(spec, separators=(',', ':'), sort_keys=True)
            if all(w in text for w in words.split(',') if w):
                label, fn, _ = CASES[kernel](spec, args.tokens)
                profiled(f'ours {kernel} {text} {label}', fn)
    if args.upstream:
        import tile_kernels as tk

        from benchmarks.upstream import CASES as UPSTREAM_CASES

        for kernel in args.upstream:
            label, _, theirs, _, _ = UPSTREAM_CASES[kernel](tk, args.tokens)
            profiled(f'upstream {kernel} {label}', theirs)
    return 0


if __name__ == '__main__':
    sys.exit(main())
