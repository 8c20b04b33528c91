"""Condense the raw output of one GPU run into a small record: docs/measurements/DATE-GPU[-N].jsonl.

    python -m benchmarks.record OUT_DIR [--commit SHA] [--gpu h200] [--out docs/measurements/] [--note TEXT ...]

OUT_DIR is what .ci/gpu-run.sh leaves: environment.txt, and where their steps ran bench.jsonl,
upstream.jsonl, junit.xml or pytest.log, cold_start.log, sanitize.log, adversarial.jsonl (benchmarks/adversarial.py), ab.json
with its rounds,
host.jsonl (benchmarks/host_overhead.py) and ep_moe.jsonl (the lines examples/ep_moe.py prints, one per torchrun launch). --out is a folder (the file is named
DATE-GPU.jsonl, with -2, -3, ... when that name is taken) or a .jsonl path. The commit comes from --commit, else
from environment.txt's `commit` line.

The record is one JSON object a line, each with a "type":

  environment  date, GPU and its compute capability, driver, torch, CUDA, Python, the wheels' commit and version, the tilelang that built them,
               upstream's tilelang and version, the copy bandwidth of the benchmark step and of the upstream step
  case         one benchmark case of benchmarks.run: kernel, spec, shape, tokens, median/min/max us over the timed
               calls (min and max are null where the raw row has none), GB/s, fraction of copy bandwidth and of a
               copy of the case's size; where decode sizes were measured, "decode" maps each token count to
               [device us per call in a replayed CUDA graph, host us per call]
  upstream     one case of benchmarks.upstream: ours and upstream's us (each the lowest of three interleaved medians),
               their fractions of copy, whether the results matched, upstream's first call; or the error
  error        a kernel the benchmark step could not time (no case for an installed kernel)
  cold_start   the processes of benchmarks/cold_start.py, ms
  tests        passed, failed, skipped and errors of the GPU tests (junit.xml and junit-alone.xml, else pytest's last line)
  sanitizer    per compute-sanitizer tool: the kernel selection where logged, specs and cases run, errors, exit status
  host         one case of benchmarks.host_overhead: host us per call of ours, of torch.neg on its input, of upstream's
  adversarial  per sanitizer (or none) of benchmarks.adversarial: bad-index cases run and held, invalid accesses reported,
               the cases that did not hold
  ab           one kernel of an A/B (.ci/gpu-run.sh ab: ab.json and the rounds ab-base-N.jsonl, ab-new-N.jsonl): the
               build put in place, the label, rounds, cases, the median and largest new / base ratio of its cases (each
               case's time a median over the rounds), and the control (the last base round against the first)
  ep_moe       one run of examples/ep_moe.py: ranks, tokens per rank, the layer's sizes, ms per step, tokens per second over
               all ranks, and the ms per step (and share of the step) in our kernels, NCCL and the expert GEMMs
  note         a sentence given with --note: what the run's output cannot say (why tests failed, what a later commit
               fixed); docs/benchmarks.md lists the notes under the records

Only what the raw files hold is written: a missing file leaves its lines out, a missing field is null. Pure Python
(no torch), so that it runs where the raw files are.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks import compare

FORMAT = 1


def _round(value, digits: int):
    if value is None:
        return None
    return round(float(value)) if digits == 0 else round(float(value), digits)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith('{')] if path.is_file() else []


def environment(text: str) -> dict:
    """The facts of environment.txt: the lines .ci/gpu-run.sh writes (a date, nvidia-smi's CSV line, the Python /
    torch / CUDA line, the wheels' file names, and `key value` lines such as `commit abc1234`)."""
    env: dict = {}
    for line in (raw.strip() for raw in text.splitlines()):
        if re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ', line):
            env['date'] = line
        elif line.count(',') >= 2 and 'MiB' in line:
            name, driver, memory, *clocks = (c.strip() for c in line.split(','))
            env.update(gpu=name, driver=driver, memory_mib=int(memory.split()[0]))
            if clocks:
                env['max_sm_clock_mhz'] = int(clocks[-1].split()[0])
        elif m := re.fullmatch(r'python (\S+) torch (\S+) cuda (\S+)', line):
            env.update(python=m[1], torch=m[2], cuda=m[3])
        elif line.endswith('.whl'):
            env.setdefault('wheels', []).append(line)
            if m := re.fullmatch(r'tile_kernels_aot(?:_\w+)?-([^-]+)-.*\.whl', line):
                env['version'] = m[1]
        elif m := re.fullmatch(r'(commit|compute_capability|kernels|tests|built_with_tilelang|built_with_nvcc) (.+)', line):
            env[m[1]] = m[2]
    return env


def gpu_short_name(gpu: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100': the first model-like word, lower case."""
    m = re.search(r'\b([A-Z]{1,2}\d{2,4}[A-Za-z]?)\b', gpu)
    return (m[1] if m else gpu.split()[-1]).lower()


def case_line(row: dict, default_tokens: int) -> dict:
    line = {'type': 'case', 'kernel': row['kernel'], 'spec': row['spec'], 'shape': row['shape'], 'tokens': row.get('tokens', default_tokens),
            'median_us': _round(row['us'], 2), 'min_us': _round(row.get('min_us'), 2), 'max_us': _round(row.get('max_us'), 2),
            'gbs': _round(row['gbs'], 0), 'of_copy': _round(row['of_copy'], 4), 'of_same_size_copy': _round(row.get('of_same_size_copy'), 4)}
    if 'decode' in row:
        line['decode'] = {t: [_round(d['graph_us'], 2), _round(d['host_us'], 1)] for t, d in sorted(row['decode'].items(), key=lambda kv: int(kv[0]))}
    return line


def upstream_line(row: dict) -> dict:
    if 'error' in row:
        return {'type': 'upstream', 'kernel': row['kernel'], 'shape': row.get('shape'), 'error': row['error']}
    return {'type': 'upstream', 'kernel': row['kernel'], 'shape': row['shape'], 'tokens': row.get('tokens'), 'same_result': row['same_result'],
            'ours_us': _round(row['ours_us'], 2), 'upstream_us': _round(row['upstream_us'], 2), 'ours_of_copy': _round(row['ours_of_copy'], 4),
            'upstream_of_copy': _round(row['upstream_of_copy'], 4), 'upstream_first_call_s': _round(row['upstream_first_call_s'], 2),
            **{k: v for k, v in row.items() if k != 'same_result' and isinstance(v, bool)}}  # a case's diagnostics (bit-for-bit flags)


def test_counts(out_dir: Path) -> dict | None:
    junits, log = sorted(out_dir.glob('junit*.xml')), out_dir / 'pytest.log'  # junit-alone.xml: the tests run after the workers
    if junits:
        suites = []
        for junit in junits:
            root = ET.parse(junit).getroot()
            suites += [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))
        total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ('tests', 'failures', 'errors', 'skipped')}
        return {'type': 'tests', 'passed': total['tests'] - total['failures'] - total['errors'] - total['skipped'], 'failed': total['failures'],
                'skipped': total['skipped'], 'errors': total['errors'], 'seconds': _round(sum(float(s.get('time', 0)) for s in suites), 1)}
    if log.is_file():
        last = next((line for line in reversed(log.read_text().splitlines()) if re.search(r'\d+ (passed|failed)', line)), None)
        if last is not None:
            counts = {word: int(n) for n, word in re.findall(r'(\d+) (passed|failed|skipped|errors?)', last)}
            seconds = re.search(r' in ([\d.]+)s', last)
            return {'type': 'tests', 'passed': counts.get('passed', 0), 'failed': counts.get('failed', 0), 'skipped': counts.get('skipped', 0),
                    'errors': counts.get('error', 0) + counts.get('errors', 0), 'seconds': _round(seconds[1], 1) if seconds else None}
    return None


def sanitizer_lines(text: str) -> list[dict]:
    """One line per tool of sanitize.log (sections `## TOOL[, kernels GLOB]`, and `## TOOL: FAILED (exit N)` where the
    tool's process failed): the kernel selection, specs and cases run, the errors compute-sanitizer counted (null where
    it printed no summary) and the exit status."""
    tools: dict[str, dict] = {}
    for block in re.split(r'^## ', text, flags=re.MULTILINE)[1:]:
        head, _, body = block.partition('\n')
        failed = re.fullmatch(r'(\S+): FAILED \(exit (\d+)\)', head.strip())
        tool, _, kernels = (failed[1], '', '') if failed else head.partition(', kernels ')
        line = tools.setdefault(tool.strip(), {'type': 'sanitizer', 'tool': tool.strip(), 'kernels': None, 'specs': None, 'cases': None,
                                               'errors': None, 'exit': 0})
        if kernels.strip():
            line['kernels'] = kernels.strip()
        if failed:
            line['exit'] = int(failed[2])
        if ran := re.search(r'(\d+) specs ran \((\d+) cases\)', body):
            line['specs'], line['cases'] = int(ran[1]), int(ran[2])
        if errors := re.search(r'ERROR SUMMARY: (\d+) errors?|\((\d+) errors?, \d+ warnings?\)', body):
            line['errors'] = int(errors[1] or errors[2])
    return list(tools.values())


def host_line(row: dict) -> dict:
    """A row of benchmarks.host_overhead, condensed."""
    return {'type': 'host', 'kernel': row['kernel'], 'shape': row['shape'], 'tokens': row['tokens'], 'ours_us': _round(row['ours_us'], 2),
            'ours_in_full_us': _round(row.get('ours_in_full_us'), 2), 'ours_ctypes_us': _round(row.get('ours_ctypes_us'), 2), 'torch_us': _round(row['torch_us'], 2), 'torch_op': row['torch_op'],
            'outputs': row.get('outputs'), 'torch_outputs_us': _round(row.get('torch_outputs_us'), 2), 'torch_outputs_op': row.get('torch_outputs_op'),
            'upstream_us': _round(row.get('upstream_us'), 2)}


def adversarial_lines(rows: list[dict]) -> list[dict]:
    """One line per sanitizer of benchmarks/adversarial.py's records: cases run and held, invalid accesses seen, and
    the names of the cases that did not hold."""
    out: dict[str, dict] = {}
    for row in rows:
        line = out.setdefault(row['sanitizer'], {'type': 'adversarial', 'sanitizer': row['sanitizer'], 'cases': 0, 'held': 0,
                                                 'invalid_accesses': 0, 'failed': []})
        line['cases'] += 1
        line['held'] += bool(row['passed'])
        line['invalid_accesses'] += row['invalid_accesses']
        if not row['passed']:
            line['failed'].append(row['case'])
    return list(out.values())


EP_MOE_KINDS = ('kernels', 'nccl', 'experts')
EP_MOE_LAYER = ('hidden', 'num_experts', 'num_topk', 'moe_intermediate', 'weight_sets')


def ep_moe_line(row: dict) -> dict:
    """A line examples/ep_moe.py printed, condensed."""
    line = {'type': 'ep_moe', 'world_size': row['world_size'], 'tokens_per_rank': row['tokens_per_rank'],
            'layer': {k: row.get(k) for k in EP_MOE_LAYER}, 'step_ms': _round(row['step_ms'], 3), 'tokens_per_s': _round(row['tokens_per_s'], 0)}
    for kind in EP_MOE_KINDS:
        line[f'{kind}_ms'], line[f'{kind}_share'] = _round(row[f'{kind}_ms'], 3), _round(row[f'{kind}_share'], 4)
    line['phases_ms'] = {k: _round(v, 3) for k, v in row.get('phases_ms', {}).items()}
    line['check_ok'] = row['check']['ok'] if 'check' in row else None
    return line


def ab_lines(out_dir: Path) -> list[dict]:
    """The 'ab' lines of an A/B's rounds, a line a kernel."""
    about = out_dir / 'ab.json'
    if not about.is_file():
        return []
    facts = json.loads(about.read_text())
    bases, news = (sorted(out_dir.glob(f'ab-{side}-*.jsonl'), key=lambda p: int(p.stem.rsplit('-', 1)[1])) for side in ('base', 'new'))
    if not bases or not news:
        return []
    ratios, control = compare.rounds(bases, news)
    return [{'type': 'ab', 'build': facts.get('build'), 'label': facts.get('label') or None, 'kernel': kernel,
             'rounds': min(len(bases), len(news)), 'cases': count, 'median_ratio': _round(median, 3),
             'max_ratio': _round(largest, 3), 'control_ratio': _round(control[kernel][1], 3) if kernel in control else None}
            for kernel, (count, median, largest) in ratios.items()]


def condense(out_dir: Path, commit: str | None = None, default_tokens: int = 8192) -> list[dict]:
    """The record's lines from a run's raw output folder."""
    env_file = out_dir / 'environment.txt'
    if not env_file.is_file():
        raise FileNotFoundError(f'{env_file}: no environment.txt, so no date, GPU or versions for the record')
    facts = environment(env_file.read_text())
    commit = commit or facts.get('commit')
    if not commit or commit == 'unknown':
        raise ValueError(f'{out_dir}: environment.txt names no commit; pass --commit SHA (the commit the wheels were built from)')
    bench, upstream = _lines(out_dir / 'bench.jsonl'), _lines(out_dir / 'upstream.jsonl')
    bench_copy = next((r for r in bench if r['kernel'] == 'copy'), {})
    upstream_copy = next((r for r in upstream if r['kernel'] == 'copy'), {})
    env = {'type': 'environment', 'format': FORMAT, 'date': facts.get('date'), 'gpu': facts.get('gpu') or bench_copy.get('gpu'),
           'compute_capability': facts.get('compute_capability'), 'driver': facts.get('driver'), 'memory_mib': facts.get('memory_mib'),
           'max_sm_clock_mhz': facts.get('max_sm_clock_mhz'),
           'torch': facts.get('torch'), 'cuda': facts.get('cuda'), 'python': facts.get('python'), 'commit': commit,
           'version': facts.get('version'), 'wheels': facts.get('wheels'), 'built_with_tilelang': facts.get('built_with_tilelang'),
           'built_with_nvcc': facts.get('built_with_nvcc'), 'kernels': facts.get('kernels'), 'tests_selection': facts.get('tests'),
           'copy_gbs': _round(bench_copy.get('gbs'), 1), 'upstream_copy_gbs': _round(upstream_copy.get('gbs'), 1),
           'upstream_tilelang': upstream_copy.get('tilelang'), 'upstream_version': upstream_copy.get('upstream_version'),
           'upstream_import_s': _round(upstream_copy.get('upstream_import_s'), 2)}
    if env['date'] is None or env['gpu'] is None:
        raise ValueError(f'{env_file}: no date or GPU name in it')
    lines = [env]
    for row in bench:
        if row['kernel'] != 'copy':
            lines.append({'type': 'error', 'kernel': row['kernel'], 'error': row['error']} if 'error' in row else case_line(row, default_tokens))
    lines += [upstream_line(r) for r in upstream if r['kernel'] != 'copy']
    cold: dict[str, list[dict]] = {}  # the processes of each case of benchmarks/cold_start.py
    for r in _lines(out_dir / 'cold_start.log'):
        cold.setdefault(r.get('what', 'ops'), []).append({k: _round(v, 2) for k, v in r.items() if k != 'what'})
    lines += [{'type': 'cold_start', 'what': what, 'runs': runs} for what, runs in cold.items()]
    lines += [ep_moe_line(r) for r in _lines(out_dir / 'ep_moe.jsonl') if r.get('what') == 'ep_moe']
    tests = test_counts(out_dir)
    if tests:
        lines.append(tests)
    sanitize = out_dir / 'sanitize.log'
    if sanitize.is_file():
        lines += sanitizer_lines(sanitize.read_text())
    lines += adversarial_lines(_lines(out_dir / 'adversarial.jsonl'))
    lines += [host_line(r) for r in _lines(out_dir / 'host.jsonl') if r.get('what') == 'host']
    lines += ab_lines(out_dir)
    return lines


def record_path(out: Path, env: dict, gpu: str | None) -> Path:
    """`out` itself if it names a .jsonl file, else DATE-GPU[-N].jsonl in that folder, N from 2 for a name taken."""
    if out.suffix == '.jsonl':
        return out
    stem = f'{env["date"][:10]}-{gpu or gpu_short_name(env["gpu"])}'
    path, n = out / f'{stem}.jsonl', 2
    while path.exists():
        path, n = out / f'{stem}-{n}.jsonl', n + 1
    return path


def dumps(lines: list[dict]) -> str:
    return ''.join(json.dumps(line, separators=(',', ':')) + '\n' for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('out_dir', type=Path, help="the run's raw output folder ($OUT of .ci/gpu-run.sh)")
    parser.add_argument('--commit', help="the commit the wheels were built from (default: environment.txt's)")
    parser.add_argument('--gpu', help="the GPU's short name in the file name (default: from the GPU's name, e.g. h200)")
    parser.add_argument('--out', type=Path, default=Path('docs/measurements'), help='a folder, or a .jsonl file (default: docs/measurements)')
    parser.add_argument('--tokens', type=int, default=8192, help='the token count of bench.jsonl rows that do not name theirs (default 8192)')
    parser.add_argument('--note', action='append', default=[],
                        help='a sentence on the run that its output cannot say (why tests failed, what was fixed after it); repeatable')
    args = parser.parse_args()
    lines = condense(args.out_dir, args.commit, args.tokens) + [{'type': 'note', 'text': text} for text in args.note]
    path = record_path(args.out, lines[0], args.gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(lines))
    counts = {t: sum(line['type'] == t for line in lines) for t in dict.fromkeys(line['type'] for line in lines)}
    print(f'{path}: ' + ', '.join(f'{n} {t}' for t, n in counts.items()) + f' ({path.stat().st_size} bytes)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
