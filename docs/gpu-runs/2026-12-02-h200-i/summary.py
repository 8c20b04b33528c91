"""Medians per case of the alternating benchmark passes exp/ab.sh ran: python3 summary.py OUT VARIANT..."""
import glob
import json
import os
import statistics
import sys

out, variants = sys.argv[1], sys.argv[2:]
rows: dict = {}
for v in variants:
    for path in sorted(glob.glob(os.path.join(out, f'{v}-*.jsonl'))):
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r['kernel'] == 'copy':
                    rows.setdefault(('copy', ''), {}).setdefault(v, []).append(r['gbs'])
                    continue
                key = (json.dumps(r['spec'], sort_keys=True), r['shape'])
                rows.setdefault(key, {}).setdefault(v, []).append((r['us'], r['of_copy']))
for key, per in rows.items():
    if key[0] == 'copy':
        print('copy GB/s', {v: [round(x) for x in xs] for v, xs in per.items()})
        continue
    cells = []
    for v in variants:
        xs = per.get(v, [])
        if xs:
            times = ' '.join(f'{u:.1f}' for u, _ in xs)
            cells.append(f'{v}: {statistics.median(u for u, _ in xs):6.2f} us {100 * statistics.median(c for _, c in xs):5.1f}% [{times}]')
    print(' '.join(f'{k}={v}' for k, v in json.loads(key[0]).items()), key[1])
    print('   ', ' | '.join(cells))
