"""Per-kernel device time of one op call, ours and upstream's, from torch.profiler (CUDA activity).

    python -m benchmarks.profile_kernels [--kernels PATTERN]

Where benchmarks.upstream shows a gap, this tells which launch (or memset / copy) it comes from.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_times(fn, repeats: int = 5) -> list[tuple[str, float]]:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time / repeats
    return sorted(totals.items(), key=lambda kv: -kv[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--tokens', type=int, default=8192)
    args = parser.parse_args()
    import tile_kernels as tk

    from benchmarks.run import cases_of, installed_kernels, no_case_row, select
    from benchmarks.upstream import CASES

    kernels, missing = select(CASES, args.kernels, installed_kernels())
    for kernel in missing:
        no_case_row(kernel, 'benchmarks/upstream.py')
    for kernel in kernels:
        try:
            for label, mine, theirs, _, _ in cases_of(CASES[kernel], tk, args.tokens):
                for who, fn in (('ours', mine), ('upstream', theirs)):
                    parts = kernel_times(fn)
                    print(f'{kernel} [{label}] {who}: total {sum(t for _, t in parts):.1f} us = '
                          + ', '.join(f'{name[:60]} {t:.1f}' for name, t in parts), flush=True)
        except Exception as exc:  # report and go on
            print(f'{kernel}: {type(exc).__name__}: {str(exc)[:200]}', flush=True)
    return 1 if missing else 0


if __name__ == '__main__':
    sys.exit(main())
