"""Device time of the same cases in two sets of runs of benchmarks.run: the ratio of each case, and a summary.

    python -m benchmarks.compare BASE NEW [--kernels GLOB] [--limit 1.02]

BASE and NEW are bench.jsonl files (benchmarks.run --out) or records in docs/measurements, or comma-separated lists
of them: runs of one side taken in turn with the other's (base, new, new, base, ...), each case's time being the
median over its side's runs. Cases are matched by kernel, spec, shape and token count; each gives NEW / BASE. The
summary gives, per kernel, the median and the largest ratio, and the exit status is 1 when a kernel's median ratio is
above --limit. With two or more BASE runs it also gives each kernel's median ratio of the last BASE run to the first
(the control: what the same binaries measure against themselves). Used to show what a change to kernels costs: run
the benchmark on the binaries before and after it, back to back on one GPU (.ci/gpu-run.sh ab).
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


def median_cases(paths: list[Path]) -> dict[tuple, float]:
    """Each case's median time over the runs `paths` that measured it."""
    runs = [cases(path) for path in paths]
    keys = dict.fromkeys(key for run in runs for key in run)
    return {key: statistics.median(run[key] for run in runs if key in run) for key in keys}


def summary(ratios: dict[str, list[float]]) -> dict[str, tuple[int, float, float]]:
    """kernel -> (cases, median ratio, largest ratio)."""
    return {kernel: (len(values), statistics.median(values), max(values)) for kernel, values in ratios.items()}


def rounds(base_runs: list[Path], new_runs: list[Path], pattern: str = '*') -> tuple[dict, dict]:
    """An A/B of runs taken in turn: (kernel -> summary of NEW / BASE over the case medians, kernel -> summary of the
    control, the last BASE run against the first; empty with one BASE run)."""
    ratios = summary(compare(median_cases(base_runs), median_cases(new_runs), pattern))
    control = summary(compare(cases(base_runs[0]), cases(base_runs[-1]), pattern)) if len(base_runs) > 1 else {}
    return ratios, control


def compare(base: dict[tuple, float], new: dict[tuple, float], pattern: str = '*') -> dict[str, list[float]]:
    """kernel -> the NEW / BASE ratios of its cases measured in both."""
    ratios: dict[str, list[float]] = {}
    for key in sorted(base.keys() & new.keys()):
        if fnmatch.fnmatchcase(key[0], pattern):
            ratios.setdefault(key[0], []).append(new[key] / base[key])
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('base', help='a run, or runs separated by commas')
    parser.add_argument('new', help='a run, or runs separated by commas')
    parser.add_argument('--kernels', default='*')
    parser.add_argument('--limit', type=float, default=1.02, help='the largest median ratio per kernel that passes')
    args = parser.parse_args()
    base_runs, new_runs = ([Path(p) for p in side.split(',')] for side in (args.base, args.new))
    ratios, control = rounds(base_runs, new_runs, args.kernels)
    if not ratios:
        print('no case measured in both')
        return 1
    worst = 0.0
    for kernel, (count, median, largest) in ratios.items():
        worst = max(worst, median)
        flag = '' if median <= args.limit else f'  above {args.limit}'
        same = f'  control {control[kernel][1]:.3f}' if kernel in control else ''
        print(f'{kernel:50s} {count:3d} cases  median {median:.3f}  max {largest:.3f}{same}{flag}')
    runs = f' ({len(base_runs)} and {len(new_runs)} runs)' if len(base_runs) + len(new_runs) > 2 else ''
    print(f'{sum(count for count, _, _ in ratios.values())} cases of {len(ratios)} kernels{runs}; the largest median ratio is {worst:.3f}')
    return 0 if worst <= args.limit else 1


if __name__ == '__main__':
    sys.exit(main())
