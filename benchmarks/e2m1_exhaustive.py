"""Exhaustive check of the kernels' e2m1 rounding: all 2^32 float32 bit patterns, the emulated instruction
sequence of kernel_src.quant.common.e2m1_top_nibble against the reference's compares
(tests/cpu/test_e2m1_code.py runs the same comparison on a representative subset).

    python -m benchmarks.e2m1_exhaustive [--chunk-log2 24] [--finite]

--finite checks e2m1_finite_top_nibble instead, over the patterns it is for: finite, below E2M1_UNCLAMPED_BOUND.

CPU only, tens of minutes on two cores. NaN inputs, whose codes depend on the sequence's final max(s, 1), are covered
by tests/cpu/test_e2m1_code.py with several payloads of both signs. Exits non-zero and prints the first mismatches if any.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from kernel_src.quant.common import E2M1_UNCLAMPED_BOUND
from tests.cpu.test_e2m1_code import emulated_e2m1_codes, emulated_finite_e2m1_codes, reference_e2m1_codes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--chunk-log2', type=int, default=24)
    parser.add_argument('--finite', action='store_true', help='e2m1_finite_top_nibble, finite values below the bound')
    args = parser.parse_args()
    chunk = 1 << args.chunk_log2
    start, mismatches = time.time(), 0
    for first in range(-(1 << 31), 1 << 31, chunk):
        bits = torch.arange(first, first + chunk, dtype=torch.int32)
        if args.finite:
            v = bits.view(torch.float32)
            bits = bits[v.isfinite() & (v.abs() < E2M1_UNCLAMPED_BOUND)]
        emulated = emulated_finite_e2m1_codes(bits) if args.finite else emulated_e2m1_codes(bits)
        bad = (emulated != reference_e2m1_codes(bits)).nonzero().flatten()
        if bad.numel():
            mismatches += bad.numel()
            print(f'{bad.numel()} mismatches from {first & 0xFFFFFFFF:#010x}, first {int(bits[bad[0]]) & 0xFFFFFFFF:#010x}')
        if (first + chunk) % (1 << 28) == 0:
            print(f'  checked up to {(first + chunk) & 0xFFFFFFFF:#010x}, {time.time() - start:.0f} s', flush=True)
    print(f'all 2^32 float32 patterns{" finite below the bound" if args.finite else ""}: {mismatches} mismatches, {time.time() - start:.0f} s')
    return 1 if mismatches else 0


if __name__ == '__main__':
    sys.exit(main())
