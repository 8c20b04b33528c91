"""Markdown tables from one GPU session's logs (bench.jsonl, upstream.jsonl, cold_start.log), for docs/.

    python benchmarks/report.py RUN_DIR > table.md
"""

import json
import statistics
import sys
from pathlib import Path


def spec_text(spec: dict) -> str:
    return ', '.join(f'{k}={v}' for k, v in spec.items())


def main(run_dir: str) -> None:
    root = Path(run_dir)
    rows = [json.loads(line) for line in (root / 'bench.jsonl').read_text().splitlines()]
    copy = rows[0]
    print(f'Copy bandwidth measured in the same run: {copy["gbs"]:.0f} GB/s (bytes read + written).\n')
    same_size = all('of_same_size_copy' in r for r in rows[1:])  # (runs before the twenty-first session have no such column)
    for kernel in sorted({r['kernel'] for r in rows[1:]}):
        print(f'### {kernel}\n')
        decode = any('decode' in r for r in rows if r['kernel'] == kernel)
        header = '| spec | shape | time (us) | GB/s | of copy |' + (' of a copy of its size |' if same_size else '')
        if decode:
            header += ' decode T=1 / 32 / 128: device us (graph) | host us per call |'
        print(header)
        print('|' + ' --- |' * (header.count('|') - 1))
        for r in sorted((r for r in rows if r['kernel'] == kernel), key=lambda r: spec_text(r['spec'])):
            line = f'| {spec_text(r["spec"])} | {r["shape"]} | {r["us"]:.1f} | {r["gbs"]:.0f} | {100 * r["of_copy"]:.1f}% |'
            if same_size:
                line += f' {100 * r["of_same_size_copy"]:.1f}% |'
            if decode:
                d = r.get('decode', {})
                line += ' ' + ' / '.join(f'{d[t]["graph_us"]:.1f}' for t in sorted(d, key=int)) + ' |'
                line += ' ' + ' / '.join(f'{d[t]["host_us"]:.1f}' for t in sorted(d, key=int)) + ' |'
            print(line)
        print()
    upstream = root / 'upstream.jsonl'
    if upstream.exists():
        up = [json.loads(line) for line in upstream.read_text().splitlines()]
        print(f'### Against upstream TileKernels v1 (JIT), same inputs, same process (upstream import {up[0]["upstream_import_s"]:.1f} s)\n')
        print('| kernel | shape | same result | ours (us) | upstream (us) | ours / upstream | upstream first call (s) |')
        print('|' + ' --- |' * 7)
        for r in up[1:]:
            if 'error' in r:
                print(f'| {r["kernel"]} | | failed: {r["error"].splitlines()[0][:120]} | | | | |')
                continue
            print(f'| {r["kernel"]} | {r["shape"]} | {"yes" if r["same_result"] else "**no**"} | {r["ours_us"]:.1f} | '
                  f'{r["upstream_us"]:.1f} | {r["ours_us"] / r["upstream_us"]:.2f} | {r["upstream_first_call_s"]:.2f} |')
        print()
    cold = root / 'cold_start.log'
    if cold.exists():
        runs = [json.loads(line) for line in cold.read_text().splitlines() if line.startswith('{')]
        print('### Cold start (fresh process, after `import torch` and CUDA init)\n')
        print('| | ' + ' | '.join(f'run {i + 1}' for i in range(len(runs))) + ' | median |')
        print('|' + ' --- |' * (len(runs) + 2))
        for key in runs[0]:
            values = [r[key] for r in runs]
            print(f'| {key} | ' + ' | '.join(f'{v:.1f}' for v in values) + f' | {statistics.median(values):.1f} |')


if __name__ == '__main__':
    main(sys.argv[1])
