"""The build: (kernel, spec, arch) jobs -> lowered .cu -> .cubin (ninja + nvcc) -> manifest -> wheels.

Everything is derived from the kernel declarations in kernel_src.registry and the arguments here.
Every step is incremental: lowering is skipped when the job's input hash (kernel sources, spec, arch,
tilelang version, pass configs) matches the one recorded beside the .cu; nvcc is skipped by ninja when
the .cu did not change; a wheel is rebuilt only when its staged content changed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import fnmatch
import functools
import json
import multiprocessing
import os
import time
from pathlib import Path

from build_tools import ninja, wheels
from build_tools.lock import BuildLock
from build_tools.cubin_info import frame_bytes
from build_tools.util import BuildError, Progress, duration, plural, sha256_bytes, stable_json, write_if_different
from kernel_src.decl import Arch, KernelDecl
from tile_kernels_aot.cubin import cubin_sm, target_sm
from tile_kernels_aot.manifest import (
    KernelInfo, Manifest, entry_from_plain, manifest_from_json, manifest_to_json,
)
from tile_kernels_aot.version import __version__

REPO_ROOT = Path(__file__).resolve().parent.parent
KERNEL_SRC = REPO_ROOT / 'kernel_src'


@dataclasses.dataclass(frozen=True)
class BuildArgs:
    archs: tuple[Arch, ...]
    kernels: tuple[str, ...] = ('*',)  # fnmatch patterns over kernel names
    specs_file: Path | None = None  # extra specs: a JSON list of {"kernel": ..., "params": {...}}, or JSON Lines
    jobs: int = max(os.cpu_count() or 1, 1)
    out: Path = REPO_ROOT / 'dist'
    build_dir: Path = REPO_ROOT / 'build'
    wheels: bool = True
    prebuilt: bool = True  # False: only the specs from specs_file
    registry: str = 'kernel_src.registry'  # module with DECLS; tests point it at fixture kernels
    # Wheels from a build that leaves out kernels or prebuilt specs (--kernels, --only-specs). The loader takes one
    # arch package per target, so such a wheel, installed, replaces the release's and every kernel it lacks is gone:
    # the build refuses it unless asked for (--partial-wheels).
    partial_wheels: bool = False


@dataclasses.dataclass(frozen=True)
class Job:
    decl: KernelDecl
    params: dict
    arch: Arch

    @property
    def key(self) -> str:
        return self.decl.key(self.params)

    @property
    def ident(self) -> tuple[str, str, str]:
        return (self.decl.name, self.key, self.arch.target)

    @property
    def label(self) -> str:
        return f'{self.decl.name}[{self.key}] for {self.arch.target}'

    @property
    def relative_stem(self) -> str:
        return f'{self.decl.name}/{self.decl.file_stem(self.params)}'

    def path(self, build_dir: Path, suffix: str) -> Path:
        """build/<target>/{sources,cubins,meta}/<kernel>/<stem><suffix>: build/<target> is laid out like
        an installed arch package, so TILE_KERNELS_AOT_KERNEL_DIRS can point straight at it."""
        folder = {'.cu': 'sources', '.cubin': 'cubins', '.json': 'meta'}[suffix]
        return build_dir / self.arch.target / folder / (self.relative_stem + suffix)


def registry(module: str) -> dict[str, KernelDecl]:
    import importlib

    return importlib.import_module(module).DECLS


def select_decls(patterns: tuple[str, ...], decls: dict[str, KernelDecl]) -> list[KernelDecl]:
    chosen = [d for name, d in sorted(decls.items()) if any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    if not chosen:
        raise BuildError(f'no kernel matches {", ".join(patterns)}; kernels: {", ".join(sorted(decls))}')
    return chosen


def read_specs_file(path: Path, decls: dict[str, KernelDecl]) -> dict[str, list[dict]]:
    """Extra specs from a file of {"kernel": name, "params": {...}} objects: a JSON list of them, or JSON Lines (one
    object a line, blank lines allowed), the form TILE_KERNELS_AOT_RECORD_MISSES writes."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BuildError(f'--specs {path}: {exc}') from exc
    items = _spec_items(path, text)
    extra: dict[str, list[dict]] = {}
    for where, item in items:
        name = item.get('kernel') if isinstance(item, dict) else None
        if name not in decls:
            raise BuildError(f'--specs {path}: {where}: unknown kernel {name!r}; kernels: {", ".join(sorted(decls))}')
        params = item.get('params', {})
        if not isinstance(params, dict):
            raise BuildError(f'--specs {path}: {where} ({name}): "params" must be an object, got {params!r}')
        try:
            extra.setdefault(name, []).append(decls[name].normalize(params))
        except (TypeError, ValueError) as exc:
            raise BuildError(f'--specs {path}: {where} ({name}): {exc}') from exc
    return extra


def _spec_items(path: Path, text: str) -> list[tuple[str, object]]:
    """(where, item) of each spec in a specs file's text: 'item N' of a JSON list, 'line N' of JSON Lines."""
    expected = 'expected a JSON list of {"kernel": ..., "params": {...}} or one such object a line'
    if not text.strip():
        return []
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # JSON Lines with more than one line, or malformed: read line by line
    if isinstance(whole, list):
        return [(f'item {i}', item) for i, item in enumerate(whole)]
    if isinstance(whole, dict) and len([line for line in text.splitlines() if line.strip()]) > 1:
        return [('item 0', whole)]  # one object over several lines
    if whole is not None and not isinstance(whole, dict):
        raise BuildError(f'--specs {path}: {expected}')
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BuildError(f'--specs {path}: line {number}: {exc}; {expected}') from exc
        if not isinstance(item, dict):
            raise BuildError(f'--specs {path}: line {number}: {expected}')
        items.append((f'line {number}', item))
    return items


def plan(args: BuildArgs) -> list[Job]:
    decls = registry(args.registry)
    extra = read_specs_file(args.specs_file, decls) if args.specs_file else {}
    if not args.prebuilt and not extra:
        raise BuildError('--only-specs needs a --specs file that names at least one spec')
    selected = select_decls(args.kernels, decls)
    if args.wheels and not args.partial_wheels and (len(selected) < len(decls) or not args.prebuilt):
        left_out = f'{len(decls) - len(selected)} of the {len(decls)} kernels' if len(selected) < len(decls) else 'the prebuilt specs'
        raise BuildError(f'this build leaves out {left_out} (--kernels / --only-specs), so its arch wheel would replace an '
                         'installed one without them. Build every kernel (drop --kernels and --only-specs: only stale '
                         'specs are lowered again), or add --no-wheels and point TILE_KERNELS_AOT_KERNEL_DIRS at the '
                         'build folder, or add --partial-wheels if a wheel of only these kernels is what you want')
    jobs: dict[tuple[str, str, str], Job] = {}
    for arch in args.archs:
        for decl in selected:
            for params in (decl.specs() if args.prebuilt else []) + extra.get(decl.name, []):
                job = Job(decl, params, arch)
                jobs.setdefault(job.ident, job)
    return [jobs[k] for k in sorted(jobs)]


def kernel_sources_hash(decl: KernelDecl) -> str:
    """Hash of the sources that define a kernel's code: the module of its factory and every kernel_src
    module it imports, directly or through others. Editing one kernel family's file re-lowers only that
    family, not every kernel of the package.
    models.py and registry.py only decide which specs and kernels exist, so editing them re-lowers nothing."""
    return _sources_hash(decl.factory.__module__)


@functools.cache
def _sources_hash(module: str) -> str:
    files = sorted(_kernel_src_closure(module))
    return sha256_bytes(b''.join(_hash_name(p).encode() + b'\0' + p.read_bytes() for p in files))


def _hash_name(path: Path) -> str:
    """A file's name in the hash: never absolute, so that checkouts at other paths hash alike (a registry
    module given with --registry may live outside kernel_src, e.g. the tests' fixture kernels)."""
    for root in (KERNEL_SRC, REPO_ROOT):
        if path.is_relative_to(root):
            return path.relative_to(root).as_posix()
    return path.name


def _kernel_src_closure(module: str) -> set[Path]:
    """The files of `module` and of the kernel_src modules it imports, transitively: the imports are read
    with ast (a relative or absolute `kernel_src.` import counts, anything else is a library) and the files
    found with importlib's finder, which imports only the parent packages."""
    import ast
    import importlib.util

    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        try:
            spec = importlib.util.find_spec(name)
        except ModuleNotFoundError:  # `from kernel_src.x import name` where name is not a module
            continue
        if spec is None or not spec.origin or not spec.origin.endswith('.py'):
            continue
        path = Path(spec.origin)
        if path in seen or path.name in ('models.py', 'registry.py'):
            continue
        seen.add(path)
        if path.name == '__init__.py':
            seen.update(path.parent.glob('*.cuh'))  # a package's CUDA headers (kernel_src.cuda) count with it
        package = name.rsplit('.', 1)[0] if path.name != '__init__.py' else name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ''
                if node.level:
                    parts = package.split('.')
                    base = '.'.join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                # `from pkg import mod` may name a module as well as an attribute: try both.
                todo += [base] + [f'{base}.{alias.name}' for alias in node.names]
            elif isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
        todo = [n for n in todo if n == 'kernel_src' or n.startswith('kernel_src.')]
    return seen


INSTALL_BUILD_TOOLS = "pip install -e '.[build]'"


@functools.cache
def required_tilelang() -> str:
    """The tilelang version that pyproject's build extra pins: lowered sources, and so cubins, depend on it."""
    import tomllib

    extra = tomllib.loads((REPO_ROOT / 'pyproject.toml').read_text())['project']['optional-dependencies']['build']
    return next(r for r in extra if r.startswith('tilelang==')).partition('==')[2]


def tilelang_version() -> str:
    """The installed tilelang's version, read without importing it; a one-line BuildError unless it is the pinned one."""
    import importlib.metadata

    try:
        installed = importlib.metadata.version('tilelang')
    except importlib.metadata.PackageNotFoundError:
        raise BuildError(f"the Python package 'tilelang' is missing (it lowers the kernels): {INSTALL_BUILD_TOOLS}") from None
    if installed != required_tilelang():
        raise BuildError(f'tilelang {installed} is installed; the build needs tilelang=={required_tilelang()}, the version its '
                         f'lowering is verified with: {INSTALL_BUILD_TOOLS}')
    return installed


def toolchain() -> dict:
    return {'tilelang': tilelang_version(), 'nvcc': ninja.nvcc_version()}


LOWERING_CODE = Path(__file__).with_name('lower.py')


def job_input_hash(job: Job, sources_hash: str, tools: dict) -> str:
    """Everything a job's .cu and launch metadata depend on: the kernel's sources, the spec, the target,
    the pass configs, tilelang, and our own lowering code (which decides what the metadata holds)."""
    return sha256_bytes(stable_json({
        'kernel': job.decl.name, 'params': job.params, 'target': job.arch.target, 'sources': sources_hash,
        'pass_configs': dict(job.decl.pass_configs), 'tilelang': tools['tilelang'],
        'lowering': sha256_bytes(LOWERING_CODE.read_bytes()),
    }).encode())


def _lower_stale(jobs: list[Job], build_dir: Path, n_workers: int, tools: dict, registry_module: str) -> None:
    hashes = {d.name: kernel_sources_hash(d) for d in {j.decl.name: j.decl for j in jobs}.values()}
    stale = []
    for job in jobs:
        meta_path = job.path(build_dir, '.json')
        want = job_input_hash(job, hashes[job.decl.name], tools)
        if meta_path.exists() and job.path(build_dir, '.cu').exists():
            if json.loads(meta_path.read_text()).get('input_hash') == want:
                continue
        stale.append((job, want))
    if not stale:
        print(f'lowering: all {len(jobs)} kernels up to date', flush=True)
        return
    workers = plural(n_workers, 'process', 'processes')
    print(f'lowering {len(stale)} of {len(jobs)} kernels with {workers}', flush=True)
    from build_tools.lower import lower_job

    failures = []
    progress = Progress(len(stale))
    # spawn, not fork: tilelang and torch hold threads and CUDA-less state that forking copies badly.
    ctx = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx) as pool:
        futures = {pool.submit(lower_job, (registry_module, job.decl.name, job.params, job.arch.target)): (job, want) for job, want in stale}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            job, want = futures[future]
            _, lowered, error = future.result()
            if error is not None:
                failures.append(f'{job.label}:\n{error}')
                print(f'[{done}/{len(stale)}] FAILED {job.label}', flush=True)
                continue
            header = f'// tile-kernels-aot: {job.decl.name}[{job.key}] for {job.arch.target}, lowered by tilelang {tools["tilelang"]}\n'
            write_if_different(job.path(build_dir, '.cu'), header + lowered.source)
            meta = {'input_hash': want, 'kernel': job.decl.name, 'params': job.params, 'target': job.arch.target, **lowered.launch}
            write_if_different(job.path(build_dir, '.json'), json.dumps(meta, indent=1, sort_keys=True) + '\n')
            print(f'[{done}/{len(stale)}] lowered {job.label} ({progress.status(done)})', flush=True)
    if failures:
        raise BuildError(f'{len(failures)} kernel(s) failed to lower:\n\n' + '\n\n'.join(failures))
    print(f'lowering: {progress.summary("kernel", workers)}', flush=True)


def write_manifests(jobs: list[Job], build_dir: Path, tools: dict) -> dict[str, Path]:
    include_names = list(ninja.include_dirs())
    paths = {}
    for arch in sorted({j.arch for j in jobs}, key=lambda a: a.target):
        kernels: dict[str, KernelInfo] = {}
        kernel_provenance: dict[str, dict] = {}
        for job in (j for j in jobs if j.arch == arch):
            meta = json.loads(job.path(build_dir, '.json').read_text())
            cubin_path = job.path(build_dir, '.cubin')
            data = cubin_path.read_bytes()
            if cubin_sm(data) != target_sm(arch.target):
                raise BuildError(f'{job.label}: cubin ELF says sm_{cubin_sm(data)}, expected {arch.target}')
            local_bytes = frame_bytes(data)
            if local_bytes:
                raise BuildError(f'{job.label}: ptxas gave each thread {local_bytes} bytes of local memory (register spills '
                                 'or a local array in memory); raise its register cap (fewer CTAs per SM) or restructure')
            entry = entry_from_plain(dict(
                kernel=job.decl.name, key=job.key, params=job.params, target=arch.target,
                cubin=f'cubins/{job.relative_stem}.cubin', sha256=sha256_bytes(data), source=f'sources/{job.relative_stem}.cu',
                buffers=meta['buffers'], scalars=meta['scalars'], launches=meta['launches'],
                constants=job.decl.constants_for(arch, job.params),
            ))
            info = kernels.setdefault(job.decl.name, KernelInfo(job.decl.name, job.decl.params, {}))
            info.entries[job.key] = entry
            kernel_provenance[job.decl.name] = {
                'pass_configs': dict(job.decl.pass_configs),
                'kernel_sources_sha256': kernel_sources_hash(job.decl),
                'nvcc_flags': ninja.device_flags(arch, dict(job.decl.pass_configs)) + [f'-I{name}' for name in include_names],
            }
        manifest = Manifest(
            target=arch.target, package=wheels.arch_dist_name(arch), version=__version__,
            provenance={'tilelang': tools['tilelang'], 'nvcc': tools['nvcc'], 'kernels': kernel_provenance},
            kernels=kernels,
        )
        text = manifest_to_json(manifest)
        manifest_from_json(text)  # the loader must be able to read what we ship
        path = build_dir / arch.target / 'manifest.json'
        write_if_different(path, text)
        paths[arch.target] = path
    return paths


def build(args: BuildArgs) -> list[Path]:
    """Run the whole build; returns the wheels written to args.out (empty when args.wheels is False)."""
    start = time.monotonic()
    build_dir = Path(args.build_dir).resolve()
    jobs = plan(args)
    tools = toolchain()
    with BuildLock(build_dir):
        return _build_locked(args, build_dir, jobs, tools, start)


def _build_locked(args: BuildArgs, build_dir: Path, jobs: list[Job], tools: dict, start: float) -> list[Path]:
    print(f'tile-kernels-aot {__version__}: {plural(len(jobs), "kernel binary", "kernel binaries")} '
          f'for {", ".join(a.target for a in args.archs)} '
          f'(tilelang {tools["tilelang"]}, nvcc {tools["nvcc"]})', flush=True)
    _lower_stale(jobs, build_dir, max(1, min(args.jobs, len(jobs))), tools, args.registry)

    compiles = [(job.path(build_dir, '.cu'), job.path(build_dir, '.cubin'), ninja.device_flags(job.arch, dict(job.decl.pass_configs))) for job in jobs]
    ninja.write_ninja(build_dir, compiles)
    ninja.run_ninja(build_dir, args.jobs, [c[1] for c in compiles])

    manifests = write_manifests(jobs, build_dir, tools)
    built: list[Path] = []
    if args.wheels:
        built = wheels.build_wheels(jobs, manifests, build_dir, Path(args.out).resolve())
    else:
        print(where_the_binaries_are(manifests), flush=True)
    print(f'done in {duration(time.monotonic() - start)}', flush=True)
    return built


def where_the_binaries_are(manifests: dict[str, Path]) -> str:
    """What a build without wheels tells: the folder of each target, and how the loader finds them."""
    folders = [manifests[target].parent for target in sorted(manifests)]
    lines = ['no wheels (--no-wheels); manifest.json, cubins/ and sources/ of each target are in:']
    lines += [f'  {folder}' for folder in folders]
    lines.append(f'to load them: export TILE_KERNELS_AOT_KERNEL_DIRS={os.pathsep.join(map(str, folders))}')
    return '\n'.join(lines)

