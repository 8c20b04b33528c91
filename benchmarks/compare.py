"""Device time of the same cases in two runs of benchmarks.run: the ratio of each case, and a summary.

    python -m benchmarks.compare BASE NEW [--kernels GLOB] [--limit 1.02]

BASE and NEW are bench.jsonl files (benchmarks.run --out) or records in docs/measurements. Cases are matched by
kernel, spec, shape and token count; each row gives both medians and NEW / BASE. The summary gives, per kernel, the
median and the largest ratio, and the exit status is 1 when a kernel's median ratio is above --limit. Used to show
what a change to kernels costs: run the benchmark on the binaries before and after it, back to back on one GPU.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
from pathlib import Path


def cases(path: Path) -> dict[tuple, float]:
    """(kernel, spec, shape, tokens) -> median us, from raw benchmark rows or a record's 'case' lines."""
    out = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if row.get('type', 'case') != 'case' or 'spec' not in row or 'error' in row:
            continue
        us = row.get('us', row.get('median_us'))
        out[(row['kernel'], json.dumps(row['spec'], sort_keys=True), row['shape'], row['tokens'])] = us
    return out


def compare(base: dict[tuple, float], new: dict[tuple, float], pattern: str = '*') -> dict[str, list[float]]:
    """kernel -> the NEW / BASE ratios of its cases measured in both."""
    ratios: dict[str, list[float]] = {}
    for key in sorted(base.keys() & new.keys()):
        if fnmatch.fnmatchcase(key[0], pattern):
            ratios.setdefault(key[0], []).append(new[key] / base[key])
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('base', type=Path)
    parser.add_argument('new', type=Path)
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--limit', type=float, default=1.02, help='the largest median ratio per kernel that passes')
    args = parser.parse_args()
    base, new = cases(args.base), cases(args.new)
    ratios = compare(base, new, args.kernels)
    if not ratios:
        print('no case measured in both')
        return 1
    worst = 0.0
    for kernel, values in ratios.items():
        median = statistics.median(values)
        worst = max(worst, median)
        flag = '' if median <= args.limit else f'  above {args.limit}'
        print(f'{kernel:50s} {len(values):3d} cases  median {median:.3f}  max {max(values):.3f}{flag}')
    print(f'{sum(map(len, ratios.values()))} cases of {len(ratios)} kernels; the largest median ratio is {worst:.3f}')
    return 0 if worst <= args.limit else 1


if __name__ == '__main__':
    sys.exit(main())
