"""Every prebuilt spec once, on benchmarks.run's inputs at a small token count, for compute-sanitizer.

    compute-sanitizer --tool memcheck --error-exitcode 1 python -m benchmarks.sanitize [--kernels GLOB] [--tokens N]

The GPU tests compare results; this checks what they cannot see: an out-of-bounds or misaligned access that
happens to land in memory the test does not look at (memcheck), shared-memory races (racecheck) and barrier
misuse such as a named barrier some threads of a group never reach (synccheck). The default token count (130)
is not a multiple of any block or tile, so every kernel's masked edge runs. An installed kernel without a case in
benchmarks.run makes the exit status 1.
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.run import CASES, cases_of, installed_kernels, no_case_row, select
from tile_kernels_aot._select import prebuilt_specs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--tokens', type=int, default=130)
    args = parser.parse_args()
    count = specs = 0
    kernels, missing = select(CASES, args.kernels, installed_kernels())
    for kernel in missing:
        no_case_row(kernel, 'benchmarks/run.py')
    for kernel in kernels:
        for spec in prebuilt_specs(kernel, 0):
            specs += 1
            for label, fn, _ in cases_of(CASES[kernel], spec, args.tokens):
                fn()
                torch.cuda.synchronize()
                count += 1
                print(f'ran {kernel} {spec} {label}', flush=True)
    print(f'{specs} specs ran ({count} cases)')
    return 0 if count and not missing else 1


if __name__ == '__main__':
    sys.exit(main())
