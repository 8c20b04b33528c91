"""docs/benchmarks.md, the README's performance table, docs/benchmarks.png and the GPU-run table of docs/reliability.md,
from the records in docs/measurements.

    python -m benchmarks.report [--check]

The newest record (by its date) is the primary one. A kernel it did not measure (a run of a kernel selection) is
shown from the newest record of the same GPU that did; the comparison with upstream likewise, per kernel. Every table
names the record, date and commit its rows come from. The PNG needs matplotlib (`pip install -e '.[plot]'`); without
it the tables are still written and the plot is skipped with a message. --check writes nothing and exits 1 when a
generated file differs from what is committed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MEASUREMENTS = REPO / 'docs' / 'measurements'
BENCHMARKS_MD = REPO / 'docs' / 'benchmarks.md'
BENCHMARKS_PNG = REPO / 'docs' / 'benchmarks.png'
README = REPO / 'README.md'
BEGIN = '<!-- BEGIN GENERATED: performance (python -m benchmarks.report) -->'
END = '<!-- END GENERATED: performance -->'
RELIABILITY_MD = REPO / 'docs' / 'reliability.md'
RELIABILITY_BEGIN = '<!-- BEGIN GENERATED: reliability (python -m benchmarks.report) -->'
RELIABILITY_END = '<!-- END GENERATED: reliability -->'


@dataclasses.dataclass(eq=False)  # compared and hashed by identity
class Record:
    name: str  # the file's stem, e.g. 2026-12-02-h200
    env: dict
    lines: list[dict]

    def of_type(self, kind: str) -> list[dict]:
        return [line for line in self.lines if line['type'] == kind]

    def kernels(self, kind: str) -> list[str]:
        return list(dict.fromkeys(line['kernel'] for line in self.of_type(kind)))

    @property
    def link(self) -> str:
        return f'[{self.name}](measurements/{self.name}.jsonl)'

    @property
    def when(self) -> str:
        return self.env['date'][:10]

    @property
    def gpu(self) -> str:
        return self.env['gpu']

    @property
    def commit(self) -> str:
        return f'`{self.env["commit"]}`'


def load_records(folder: Path = MEASUREMENTS) -> list[Record]:
    """Every record in `folder`, newest first."""
    found = []
    for path in folder.glob('*.jsonl'):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if not lines or lines[0].get('type') != 'environment':
            raise ValueError(f'{path}: the first line is not the environment line')
        found.append(Record(path.stem, lines[0], lines[1:]))
    if not found:
        raise FileNotFoundError(f'no record in {folder}: condense a GPU run with `python -m benchmarks.record OUT_DIR`')
    return sorted(found, key=lambda r: (r.env['date'], r.name), reverse=True)


@dataclasses.dataclass
class Sources:
    """Which record each kernel's figures come from. The primary record is the newest with benchmark cases; a kernel's
    cases come from the newest record of the primary's GPU that has them, its comparison with upstream from the newest
    record of any GPU that has one, each table naming the GPU of every record it uses. The host times all come from the
    newest record that has any: one run, every op timed the same way against its references."""
    primary: Record
    records: list[Record]  # every record, newest first
    cases: dict[str, Record]
    upstream: dict[str, Record]
    host: dict[str, Record]

    @classmethod
    def of(cls, records: list[Record]) -> Sources:
        primary = next((r for r in records if r.of_type('case')), records[0])
        host = next(([r] for r in records if r.of_type('host')), [])
        pools = {'case': [r for r in records if r.gpu == primary.gpu], 'upstream': records, 'host': host}
        picked: dict[str, dict[str, Record]] = {}
        for kind, pool in pools.items():
            chosen: dict[str, Record] = {}
            for record in pool:
                for kernel in record.kernels(kind):
                    chosen.setdefault(kernel, record)
            # Kernels in the order of the record that measured the most of them (a full run's manifest order).
            order = dict.fromkeys(k for r in sorted(pool, key=lambda r: -len(r.kernels(kind))) for k in r.kernels(kind))
            picked[kind] = {k: chosen[k] for k in order}
        return cls(primary, records, picked['case'], picked['upstream'], picked['host'])

    def used(self) -> list[Record]:
        return [r for r in self.records
                if r is self.primary or r in self.cases.values() or r in self.upstream.values() or r in self.host.values()]


def main_record(by_kernel: dict[str, Record]) -> Record:
    """The record most of a table's kernels come from (the first such, newest first, on a tie)."""
    records = list(dict.fromkeys(by_kernel.values()))
    return max(records, key=lambda r: sum(1 for k in by_kernel if by_kernel[k] is r))


def wrap(text: str) -> str:
    """Prose lines of at most 120 characters, as in the rest of the docs."""
    return textwrap.fill(text, 118, break_long_words=False, break_on_hyphens=False)


def us(value) -> str:
    return '—' if value is None else f'{value:.1f}'


def pct(value, digits: int = 1) -> str:
    return '—' if value is None else f'{100 * value:.{digits}f}%'


def spec_text(spec: dict) -> str:
    return ', '.join(f'{k}={v}' for k, v in spec.items())


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header), *('| ' + ' | '.join(row) + ' |' for row in rows)]


def headline_rows(sources: Sources) -> list[tuple[str, dict, Record]]:
    """Per kernel compared with upstream, its first case (the upstream step lists the headline case first)."""
    rows = []
    for kernel, record in sources.upstream.items():
        rows.append((kernel, next(line for line in record.of_type('upstream') if line['kernel'] == kernel), record))
    return rows


def measured_on(by_kernel: dict[str, Record]) -> str:
    """'2026-12-02 at commit `abc`' for the record most kernels come from, then the others with their kernels."""
    main = main_record(by_kernel)
    text = f'{main.gpu}, {main.when} at commit {main.commit}'
    for other in dict.fromkeys(r for r in by_kernel.values() if r is not main):
        kernels = ', '.join(k for k in by_kernel if by_kernel[k] is other)
        text += f' ({kernels}: {other.gpu}, {other.when} at commit {other.commit})'
    return text


def readme_region(sources: Sources) -> str:
    rows = []
    for kernel, line, _ in headline_rows(sources):
        op = kernel.split('.', 1)[1]
        if 'error' in line:
            rows.append([op, 'upstream fails', '—', '—', '—'])
            continue
        mark = '' if line['same_result'] else ' (results differ)'
        rows.append([op, line['shape'] + mark, us(line['ours_us']), us(line['upstream_us']), pct(line['ours_of_copy'], 0)])
    tokens = {line.get('tokens') for _, line, _ in headline_rows(sources) if 'error' not in line}
    caption = (f'Device time at {"/".join(str(t) for t in sorted(tokens))} tokens, ours and upstream TileKernels (JIT) on the same inputs in '
               f'one process; "of copy": ours as a fraction of copy bandwidth. {measured_on(sources.upstream)}. '
               'Every case: [docs/benchmarks.md](docs/benchmarks.md).')
    return '\n'.join([BEGIN, *table(['op', 'case', 'ours (us)', 'upstream (us)', 'of copy'], rows), '', wrap(caption), END])


def replace_region(text: str, region: str, begin: str = BEGIN, end_mark: str = END) -> str:
    start, end = text.find(begin), text.find(end_mark)
    if start < 0 or end < start:
        raise ValueError(f'no region between {begin!r} and {end_mark!r}')
    return text[:start] + region + text[end + len(end_mark):]


def adversarial_text(lines: list[dict]) -> str:
    """'memcheck: 62 of 62 held, 0 invalid accesses' per sanitizer, with the cases that did not hold."""
    parts = []
    for a in lines:
        text = f'{a["sanitizer"] or "no sanitizer"}: {a["held"]} of {a["cases"]} held, {a["invalid_accesses"]} invalid accesses'
        parts.append(text + (f' (not held: {", ".join(a["failed"])})' if a['failed'] else ''))
    return '; '.join(parts) or '—'


def reliability_region(records: list[Record]) -> str:
    """The GPU runs that recorded tests, compute-sanitizer or adversarial-index results, newest first."""
    rows = []
    for r in records:
        tests = next(iter(r.of_type('tests')), None)
        if not (tests or r.of_type('sanitizer') or r.of_type('adversarial')):
            continue
        rows.append([r.link, r.env['date'][:10], r.env['gpu'], r.commit,
                     f'{tests["passed"]} passed, {tests["failed"]} failed, {tests["skipped"]} skipped' if tests else '—',
                     sanitizer_text(r.of_type('sanitizer')), adversarial_text(r.of_type('adversarial'))])
    body = (table(['record', 'date', 'GPU', 'commit', 'GPU tests', 'compute-sanitizer', 'adversarial indices'], rows)
            if rows else ['No GPU run has recorded tests, sanitizer or adversarial-index results yet.'])
    # The links are relative to docs/, where both this page and benchmarks.md live.
    return '\n'.join([RELIABILITY_BEGIN, *body, *ab_tables(records), RELIABILITY_END])


def ab_tables(records: list[Record]) -> list[str]:
    """A table a recorded A/B, newest first: each kernel's median new / base ratio over its cases and the control."""
    out = []
    for r in records:
        lines = r.of_type('ab')
        if not lines:
            continue
        first = lines[0]
        label = f'{first["label"]}: ' if first.get('label') else ''
        out += ['', f'A/B, {label}{r.link} ({r.when}, {r.gpu}, {r.commit}) against `{first["build"]}` in place '
                    f'("new"), {first["rounds"]} rounds each:', '']
        out += table(['kernel', 'cases', 'new / base, median', 'control (base / base)'],
                     [[line['kernel'], str(line['cases']), f'{line["median_ratio"]:.3f}',
                       '—' if line['control_ratio'] is None else f'{line["control_ratio"]:.3f}'] for line in lines])
    return out


METHOD = '''\
How each figure is taken (benchmarks/run.py): device time between CUDA events while the GPU is kept busy by a sleep,
so host launch cost is not counted; L2 flushed by reading 256 MB before each of 30 timed calls; the median, minimum
and maximum of those calls. Bandwidth counts each input read once and each output written once, as a fraction of a
device-to-device copy of 235 MB measured in the same run ("of copy"), and as the time of a copy that moves as many
bytes as the case, timed the same way, over the case's time ("of a copy of its size"): a kernel of 20-30 us pays the
fixed costs of a launch of its size, which the large copy spreads thin. Decode columns: device time per call from
replaying a CUDA graph of 100 calls, and host time per call (Timer.host_us, as below). A spec whose inputs take
different paths through its kernel has a row per path.

The comparison with upstream (benchmarks/upstream.py) runs both on the same inputs in one process, checks that the
results agree (bit for bit where upstream's own tests compare bit for bit) and times them interleaved; each side's
time is the lowest of three medians. get_fused_mapping and top2_sum_gate include the host sync that upstream's
signature implies. Records: one per GPU run, condensed from its raw output by `python -m benchmarks.record`; this
page and the README's table are generated from them by `python -m benchmarks.report`.'''


def uses(record: Record, by_kernel: dict[str, Record], what: str) -> str:
    """What a record supplies to one table: `what` of every kernel, of every kernel but some, or of the ones named."""
    mine = [k for k in by_kernel if by_kernel[k] is record]
    others = [k for k in by_kernel if by_kernel[k] is not record]
    if not mine:
        return ''
    if not others:
        return f'{what} of every kernel'
    if len(mine) > len(others):
        return f'{what} of every kernel but {", ".join(others)}'
    return f'{what} of {", ".join(mine)}'


def sanitizer_text(lines: list[dict]) -> str:
    """'memcheck, racecheck: 12 specs, 0 errors': tools with the same outcome together."""
    groups: dict[str, list[str]] = {}
    for s in lines:
        ran = f'{s["specs"]} specs' if s['specs'] is not None else 'stopped before its summary'
        outcome = f'{ran}, {s["errors"]} errors' + ('' if s['exit'] == 0 else f', exit {s["exit"]}')
        if s.get('kernels'):
            outcome += f' ({s["kernels"]})'
        groups.setdefault(outcome, []).append(s['tool'])
    return '; '.join(f'{", ".join(tools)}: {outcome}' for outcome, tools in groups.items()) or '—'


def records_table(sources: Sources) -> list[str]:
    rows = []
    for r in sources.used():
        e = r.env
        tests = next(iter(r.of_type('tests')), None)
        use = '; '.join(filter(None, (uses(r, sources.cases, 'the cases'), uses(r, sources.upstream, 'the comparison with upstream'),
                                      uses(r, sources.host, 'the host times'))))
        rows.append([
            r.link, e['date'][:16].replace('T', ' '), e['gpu'], e.get('driver') or '—', f'{e.get("torch")} / CUDA {e.get("cuda")}', r.commit,
            f'{e["copy_gbs"]:.0f}' if e.get('copy_gbs') else '—',
            f'{tests["passed"]} passed, {tests["failed"]} failed, {tests["skipped"]} skipped' if tests else '—',
            sanitizer_text(r.of_type('sanitizer')), use or '—'])
    notes = [f'- {r.link}: {n["text"]}' for r in sources.used() for n in r.of_type('note')]
    return table(['record', 'date (UTC)', 'GPU', 'driver', 'torch', 'commit', 'copy (GB/s)', 'GPU tests', 'compute-sanitizer', 'used for'],
                 rows) + ([''] + notes if notes else [])


def upstream_table(sources: Sources) -> list[str]:
    rows = []
    for kernel, record in sources.upstream.items():
        for line in (x for x in record.of_type('upstream') if x['kernel'] == kernel):
            if 'error' in line:
                reason = line['error'].splitlines()[0].split(' (')[0][:160]
                rows.append([kernel, line.get('shape') or '', f'upstream fails: {reason}', '', '', '', '', '', ''])
                continue
            rows.append([kernel, line['shape'], 'yes' if line['same_result'] else '**no**', us(line['ours_us']), us(line['upstream_us']),
                         f'{line["ours_us"] / line["upstream_us"]:.2f}', pct(line['ours_of_copy']), pct(line['upstream_of_copy']),
                         f'{line["upstream_first_call_s"]:.2f}'])
    return table(['kernel', 'case', 'same result', 'ours (us)', 'upstream (us)', 'ours / upstream', 'ours, of copy', 'upstream, of copy',
                  "upstream's first call (s)"], rows)


def kernel_section(kernel: str, record: Record, main: Record) -> list[str]:
    cases = [line for line in record.of_type('case') if line['kernel'] == kernel]
    tokens = sorted({c['tokens'] for c in cases})
    where = f'{len(cases)} cases, {"/".join(map(str, tokens))} tokens'
    if record is not main:
        where += f'; from {record.link}, {record.when}, commit {record.commit}'
    decode_sizes = list(dict.fromkeys(t for c in cases for t in c.get('decode', {})))
    header = ['spec', 'shape', 'median (us)', 'min', 'max', 'GB/s', 'of copy', 'of a copy of its size']
    if decode_sizes:
        header += [f'decode T={" / ".join(decode_sizes)}: device us (graph)', 'host us per call']
    rows = []
    for c in cases:
        row = [spec_text(c['spec']), c['shape'], us(c['median_us']), us(c['min_us']), us(c['max_us']), f'{c["gbs"]:.0f}', pct(c['of_copy']),
               pct(c.get('of_same_size_copy'))]
        if decode_sizes:
            d = c.get('decode', {})
            row += [' / '.join(f'{d[t][0]:.2f}' if t in d else '—' for t in decode_sizes),
                    ' / '.join(f'{d[t][1]:.1f}' if t in d else '—' for t in decode_sizes)]
        rows.append(row)
    return [f'### {kernel}', '', wrap(where + '.'), '', *table(header, rows), '']


COLD_START_CASES = {
    'ops': 'the first call of three ops',
    'mhc': "the first mhc_pre of a DeepSeek-V4-Flash sublayer (8192 tokens), grad off, then with mhc_post and the backward",
    'mhc-upstream': "the same mhc_pre through upstream TileKernels, which JIT-compiles its kernels (empty TileLang cache)",
}


def cold_start_table(record: Record) -> list[str]:
    out = []
    for line in record.of_type('cold_start'):
        what, runs = line.get('what', 'ops'), line['runs']
        rows = [[key, *(f'{r[key]:.1f}' for r in runs), f'{statistics.median(r[key] for r in runs):.1f}'] for key in runs[0]]
        library = 'upstream TileKernels' if what.endswith('upstream') else '`tile_kernels_aot`'
        out += [f'## Cold start: {what}', '',
                wrap(f'A fresh process (benchmarks/cold_start.py {what}), after `import torch` and CUDA init: the import of {library} and '
                     f'{COLD_START_CASES.get(what, what)}, ms. From {record.link} ({record.gpu}), {record.when}, commit {record.commit}.'), '',
                *table(['', *(f'process {i + 1}' for i in range(len(runs))), 'median'], rows), '']
    return out


def ep_moe_table(record: Record) -> list[str]:
    """The runs of examples/ep_moe.py in one record: throughput and where a step's time goes."""
    rows = []
    for line in record.of_type('ep_moe'):
        layer = line['layer']
        shape = f'H{layer["hidden"]} E{layer["num_experts"]} K{layer["num_topk"]} I{layer["moe_intermediate"]}'
        rows.append([str(line['world_size']), str(line['tokens_per_rank']), shape, f'{line["step_ms"]:.2f}', f'{line["tokens_per_s"]:,.0f}',
                     *(f'{line[f"{kind}_ms"]:.2f} ({pct(line[f"{kind}_share"], 0)})' for kind in ('kernels', 'nccl', 'experts'))])
    return ['## Expert-parallel MoE layer', '',
            wrap('examples/ep_moe.py under torchrun, one GPU per rank: gate, fused layout, e4m3 dispatch and reduce_fused (our kernels), '
                 'the all_to_all_single exchanges (NCCL) and the local experts as torch GEMMs; ms per step (CUDA events around each phase, '
                 f'the slowest rank) and the share of the step. From {record.link} ({record.gpu}), {record.when}, commit {record.commit}.'), '',
            *table(['ranks', 'tokens per rank', 'layer', 'step (ms)', 'tokens/s', 'our kernels, ms', 'NCCL, ms', 'expert GEMMs, ms'], rows), '']


def host_table(sources: Sources) -> list[str]:
    """benchmarks.host_overhead's cases, each op's from the newest record that has it: host us per call, ours against
    torch and upstream timed in the same process."""
    rows = []
    for line in (x for kernel, record in sources.host.items() for x in record.of_type('host') if x['kernel'] == kernel):
        upstream, in_full, through_ctypes = line.get('upstream_us'), line.get('ours_in_full_us'), line.get('ours_ctypes_us')
        outputs, outputs_us = line.get('outputs'), line.get('torch_outputs_us')
        rows.append([line['kernel'].split('.', 1)[1], line['shape'], f'{line["ours_us"]:.1f}', f'{in_full:.1f}' if in_full else '—',
                     f'{through_ctypes:.1f}' if through_ctypes else '—', f'{line["torch_us"]:.1f}', f'{line["ours_us"] / line["torch_us"]:.2f}',
                     '—' if outputs is None else str(outputs), f'{outputs_us:.1f}' if outputs_us else '—',
                     f'{line["ours_us"] / outputs_us:.2f}' if outputs_us else '—', f'{upstream:.1f}' if upstream else '—',
                     f'{line["ours_us"] / upstream:.2f}' if upstream else '—'])
    tokens = '/'.join(str(t) for t in dict.fromkeys(x['tokens'] for r in dict.fromkeys(sources.host.values()) for x in r.of_type('host')))
    return ['## Host time per call', '',
            wrap(f'benchmarks/host_overhead.py at {tokens} tokens: 2000 calls timed on the host in bursts of 16, each burst '
                 'started on an idle device, so that no call waits for the device (the median burst, the lowest of three '
                 'interleaved rounds); "in full" is the op with launch plans off (every call checks its arguments '
                 'again), "via ctypes" the op without the runtime\'s C extension (its launch plan replayed in Python, the driver call '
                 'made through ctypes), '
                 '"torch" is torch.neg on the op\'s largest floating-point input; for an op that returns N > 1 new buffers '
                 '(the "outputs" column), "torch, N outputs" is torch._foreach_neg over N references to that input, one torch '
                 'launch that allocates as many outputs as the op (cut to the elements one launch covers); all in the same '
                 f'process, each row\'s references timed in its own run. Measured {measured_on(sources.host)}.'), '',
            *table(['op', 'case', 'ours (us)', 'in full (us)', 'via ctypes (us)', 'torch (us)', 'ours / torch', 'outputs',
                    'torch, N outputs (us)', 'ours / that', 'upstream (us)', 'ours / upstream'], rows), '']


def not_run(env: dict) -> str:
    """The arch whose binaries the record's GPU did not run (SM100 unless the GPU is compute capability 10.x)."""
    return 'SM90' if str(env.get('compute_capability') or '').startswith('10') else 'SM100'


def benchmarks_md(sources: Sources) -> str:
    env = sources.primary.env
    out = ['# Benchmarks', '',
           '<!-- Generated by `python -m benchmarks.report` from docs/measurements/*.jsonl: edit the generator, not this file. -->', '',
           f'Measured on {" and ".join(dict.fromkeys([sources.primary.gpu, *(r.gpu for r in sources.used())]))}; {not_run(env)} binaries are compiled and checked, '
           'not run.', '',
           '## Records', '', *records_table(sources), '', '## Method', '', METHOD, '']
    if sources.upstream:
        first = next(iter(sources.upstream.values()))
        versions = ', '.join(f'{label} {first.env[key]}' for label, key in (('upstream', 'upstream_version'), ('its tilelang', 'upstream_tilelang'))
                             if first.env.get(key))
        out += ['## Against upstream TileKernels', '',
                wrap(f'Measured {measured_on(sources.upstream)}' + (f' ({versions})' if versions else '')
                     + (f'; importing upstream took {first.env["upstream_import_s"]:.1f} s.' if first.env.get('upstream_import_s') else '.')), '',
                *upstream_table(sources), '']
    out += ['## Every case', '', wrap(f'Measured {measured_on(sources.cases)}.'), '']
    for kernel, record in sources.cases.items():
        out += kernel_section(kernel, record, main_record(sources.cases))
    errors = [(r, e) for r in sources.used() for e in r.of_type('error')]
    if errors:
        out += ['## Gaps', '', *(wrap(f'- {e["kernel"]} ({r.link}): {e["error"]}') for r, e in errors), '']
    cold = next((r for r in sources.records if r.of_type('cold_start')), None)
    if cold is not None:
        out += cold_start_table(cold)
    if sources.host:
        out += host_table(sources)
    ep_moe = next((r for r in sources.records if r.of_type('ep_moe')), None)
    if ep_moe is not None:
        out += ep_moe_table(ep_moe)
    return '\n'.join(out).rstrip('\n') + '\n'


def plot(sources: Sources, path: Path) -> str:
    """Ours against upstream per op (us, log scale) and each side's fraction of copy, from the README's rows."""
    try:
        import matplotlib
    except ImportError:
        return f'{path}: skipped, matplotlib is not installed (pip install -e ".[plot]")'
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    rows = [(k.split('.', 1)[1], line) for k, line, _ in headline_rows(sources) if 'error' not in line][::-1]
    names = [name for name, _ in rows]
    y = range(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.32 * len(rows) + 1.6), sharey=True)
    for axis, key, label, offset in ((left, 'ours_us', 'ours', -0.2), (left, 'upstream_us', 'upstream', 0.2),
                                     (right, 'ours_of_copy', 'ours', -0.2), (right, 'upstream_of_copy', 'upstream', 0.2)):
        axis.barh([i + offset for i in y], [line[key] * (100 if 'of_copy' in key else 1) for _, line in rows], height=0.4, label=label)
    left.set_xscale('log')
    left.set_xlabel('device time (us, log scale)')
    right.set_xlabel('bandwidth, % of a device-to-device copy')
    right.axvline(100, color='grey', linewidth=0.8)
    left.set_yticks(list(y), names, fontsize=8)
    left.legend(loc='lower right', fontsize=8)
    fig.suptitle(measured_on(sources.upstream).replace('`', ''), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={'Software': None})
    plt.close(fig)
    return f'{path}: written'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--check', action='store_true', help='write nothing; exit 1 if a generated file or region is stale')
    args = parser.parse_args()
    sources = Sources.of(load_records())
    generated = {BENCHMARKS_MD: benchmarks_md(sources), README: replace_region(README.read_text(), readme_region(sources)),
                 RELIABILITY_MD: replace_region(RELIABILITY_MD.read_text(), reliability_region(load_records()), RELIABILITY_BEGIN,
                                                RELIABILITY_END)}
    if args.check:
        stale = [str(p.relative_to(REPO)) for p, text in generated.items() if p.read_text() != text]
        print('stale: ' + ', '.join(stale) + ' (run python -m benchmarks.report)' if stale else 'up to date')
        return 1 if stale else 0
    for path, text in generated.items():
        path.write_text(text)
        print(f'{path.relative_to(REPO)}: written')
    print(plot(sources, BENCHMARKS_PNG))
    return 0


if __name__ == '__main__':
    sys.exit(main())
