"""Wheels: one per arch (cubins, manifest, .cu sources), the runtime, and the meta package.

  tile-kernels-aot          meta: depends on the runtime and on every arch wheel of this build
  tile-kernels-aot-runtime  the `tile_kernels_aot` package (pyproject.toml and setup.py at the repo root), as two wheels:
                            cp311-abi3-manylinux2014_<machine> with the C extension _driver_native (the fast launch
                            path), and py3-none-any without it (any other platform or Python; pip picks the first
                            where it fits)
  tile-kernels-aot-sm90a    `tile_kernels_aot_sm90a`: manifest.json, cubins/, sources/ (needs the runtime)
  tile-kernels-aot-sm100f   likewise for sm_100f

Names are plain PEP 440 versions with no local label, so PyPI accepts them; all but the native runtime are
py3-none-any since a cubin does not depend on the host CPU. The native runtime is built for the build machine's CPU;
its extension links nothing (no libc symbol, no shared library), which check_native_extension verifies, so the
manylinux2014 tag holds. Each wheel is built by setuptools' PEP 517 backend from a staged directory with a fixed
SOURCE_DATE_EPOCH, so two builds of one commit give identical bytes.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from build_tools.util import BuildError, sha256_bytes, write_if_different
from kernel_src.decl import Arch
from tile_kernels_aot import targets
from tile_kernels_aot.version import __version__

REPO_ROOT = Path(__file__).resolve().parent.parent
META_DIST = 'tile-kernels-aot'
RUNTIME_DIST = 'tile-kernels-aot-runtime'
NATIVE_RUNTIME = f'{RUNTIME_DIST}-native'  # the stage of the runtime wheel with the C extension (one distribution, two wheels)
MAX_WHEEL_BYTES = 50 * 1024 * 1024
# Zip entries cannot predate 1980; any fixed date makes the archives reproducible.
SOURCE_DATE_EPOCH = '315532800'


def arch_dist_name(arch: Arch) -> str:
    return targets.distribution_for(arch.target)


def _pyproject(name: str, description: str, dependencies: list[str], packages: list[str], package_data: dict[str, list[str]]) -> str:
    deps = ', '.join(f'"{d}"' for d in dependencies)
    pkgs = ', '.join(f'"{p}"' for p in packages)
    data = ''.join(f'"{k}" = [{", ".join(repr(g).replace(chr(39), chr(34)) for g in v)}]\n' for k, v in package_data.items())
    return f'''[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{__version__}"
description = "{description}"
readme = "README.md"
license = "MIT"
license-files = ["LICENSE"]
requires-python = ">=3.10"
dependencies = [{deps}]

[tool.setuptools]
packages = [{pkgs}]
include-package-data = false

[tool.setuptools.package-data]
{data}'''


def _stage_arch(arch: Arch, jobs: list, manifest: Path, build_dir: Path, stage: Path) -> None:
    pkg = targets.package_for(arch.target)
    root = stage / pkg
    root.mkdir(parents=True)
    (root / '__init__.py').write_text(
        f'"""Prebuilt {arch.target} kernels for tile-kernels-aot. Data only: the runtime reads manifest.json."""\n'
        f'TARGET = {arch.target!r}\n'
    )
    shutil.copyfile(manifest, root / 'manifest.json')
    for job in jobs:
        for suffix, folder in (('.cubin', 'cubins'), ('.cu', 'sources')):
            dest = root / folder / (job.relative_stem + suffix)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(job.path(build_dir, suffix), dest)
    (stage / 'README.md').write_text(
        f'# {arch_dist_name(arch)}\n\nPrebuilt `{arch.target}` cubins, their CUDA C++ sources and manifest for '
        f'[tile-kernels-aot]. Installed by `pip install tile-kernels-aot`; install it alone with the runtime '
        f'for a slim image. It runs on GPUs of compute capability {arch.sm // 10}.{arch.sm % 10} only.\n'
    )
    shutil.copyfile(REPO_ROOT / 'LICENSE', stage / 'LICENSE')
    (stage / 'pyproject.toml').write_text(_pyproject(
        arch_dist_name(arch), f'tile-kernels-aot prebuilt kernels for {arch.target}',
        [f'{RUNTIME_DIST}=={__version__}'], [pkg],
        {pkg: ['manifest.json', 'cubins/*/*.cubin', 'sources/*/*.cu']},
    ))


def _stage_runtime(stage: Path, native: bool) -> None:
    """The runtime's files; setup.py builds the C extension where its source is staged (native)."""
    for name in ('pyproject.toml', 'setup.py', 'README.md', 'LICENSE'):
        shutil.copyfile(REPO_ROOT / name, stage / name)
    ignore = ('__pycache__', '*.pyc', '*.so') + (() if native else ('*.c',))
    shutil.copytree(REPO_ROOT / 'tile_kernels_aot', stage / 'tile_kernels_aot', ignore=shutil.ignore_patterns(*ignore))


def native_platform_tag() -> str:
    return f'manylinux2014_{platform.machine()}'


def check_native_extension(wheel: Path) -> None:
    """The native runtime wheel holds the extension, and the extension needs no shared library and no versioned
    libc symbol (what manylinux2014 allows and more)."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.startswith('tile_kernels_aot/_driver_native') and n.endswith('.so')]
        if len(names) != 1:
            raise BuildError(f'{wheel.name} holds no compiled tile_kernels_aot._driver_native (is a C compiler installed?)')
        with tempfile.TemporaryDirectory() as tmp:
            so = Path(zf.extract(names[0], tmp))
            needed = subprocess.run(['objdump', '-p', str(so)], capture_output=True, text=True, check=True).stdout
            symbols = subprocess.run(['objdump', '-T', str(so)], capture_output=True, text=True, check=True).stdout
    if 'NEEDED' in needed or 'GLIBC_' in symbols:
        raise BuildError(f'{names[0]} in {wheel.name} links a shared library or versioned libc symbols: its manylinux2014 tag would not hold')


def _stage_meta(archs: list[Arch], stage: Path) -> None:
    (stage / 'README.md').write_text(
        '# tile-kernels-aot\n\nAhead-of-time compiled TileKernels: installs the runtime and the prebuilt kernels '
        f'for {", ".join(a.target for a in archs)}.\n'
    )
    shutil.copyfile(REPO_ROOT / 'LICENSE', stage / 'LICENSE')
    deps = [f'{RUNTIME_DIST}=={__version__}'] + [f'{arch_dist_name(a)}=={__version__}' for a in archs]
    (stage / 'pyproject.toml').write_text(_pyproject(META_DIST, 'Ahead-of-time compiled TileKernels (meta package)', deps, [], {}))


def _tree_hash(root: Path) -> str:
    files = sorted(p for p in root.rglob('*') if p.is_file())
    return sha256_bytes(b''.join(p.relative_to(root).as_posix().encode() + b'\0' + p.read_bytes() for p in files))


def _run_backend(stage: Path, out_dir: Path, plat_name: str | None = None) -> Path:
    env = {**os.environ, 'SOURCE_DATE_EPOCH': SOURCE_DATE_EPOCH, 'PYTHONDONTWRITEBYTECODE': '1'}
    settings = {'--build-option': ['--plat-name', plat_name]} if plat_name else None
    code = 'import json, sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1], config_settings=json.loads(sys.argv[2])))'
    result = subprocess.run([sys.executable, '-c', code, str(out_dir), json.dumps(settings)], cwd=stage, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f'building the wheel in {stage} failed:\n{result.stdout}\n{result.stderr}')
    return out_dir / result.stdout.strip().splitlines()[-1]


def build_wheels(jobs: list, manifests: dict[str, Path], build_dir: Path, out: Path) -> list[Path]:
    """Stage and build every wheel; write them to `out` only once all of them succeeded."""
    archs = sorted({j.arch for j in jobs}, key=lambda a: a.target)
    stages = {}
    staging_root = build_dir / 'wheels'
    for name, fill in [(RUNTIME_DIST, lambda s: _stage_runtime(s, False)), (NATIVE_RUNTIME, lambda s: _stage_runtime(s, True)),
                       (META_DIST, lambda s: _stage_meta(archs, s))] + [
        (arch_dist_name(a), lambda s, a=a: _stage_arch(a, [j for j in jobs if j.arch == a], manifests[a.target], build_dir, s))
        for a in archs
    ]:
        stage = staging_root / name
        shutil.rmtree(stage, ignore_errors=True)  # never let setuptools see a previous build/ or egg-info
        stage.mkdir(parents=True)
        fill(stage)
        stages[name] = stage

    cache_root = staging_root / 'cache'  # a folder per staged wheel: the two runtime wheels share a name
    for leftover in staging_root.glob('tmp*'):  # a build killed while setuptools ran (the build folder is locked: none is live)
        shutil.rmtree(leftover, ignore_errors=True)
    built: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(dir=staging_root) as tmp:
        for name, stage in stages.items():
            digest = _tree_hash(stage)
            cache = cache_root / name
            cache.mkdir(parents=True, exist_ok=True)
            stamp = cache / 'tree.sha256'
            cached = sorted(cache.glob('*.whl'))
            if stamp.exists() and stamp.read_text() == digest and len(cached) == 1:
                built[name] = cached[0]
                print(f'wheel {cached[0].name}: up to date', flush=True)
                continue
            native = name == NATIVE_RUNTIME
            wheel = _run_backend(stage, Path(tmp), native_platform_tag() if native else None)
            if native:
                check_native_extension(wheel)
            size = wheel.stat().st_size
            if size > MAX_WHEEL_BYTES:
                raise BuildError(f'{wheel.name} is {size / 2**20:.1f} MiB, over the {MAX_WHEEL_BYTES // 2**20} MiB limit')
            for old in cached:
                old.unlink()
            final = cache / wheel.name
            os.replace(wheel, final)
            write_if_different(stamp, digest)
            built[name] = final
            print(f'wheel {final.name}: {size / 1024:.0f} KiB', flush=True)
    # Only now, with every wheel built, touch the output directory.
    return install_wheels(built, out)


def install_wheels(built: dict[str, Path], out: Path) -> list[Path]:
    """Copy the wheels into `out`, each to a hidden temporary name first and then renamed, so that the folder holds
    whole wheels only, wherever the build stops; an unchanged wheel is left as it is."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    written = []
    for wheel in built.values():
        dest = out / wheel.name
        if not dest.exists() or dest.read_bytes() != wheel.read_bytes():
            tmp_dest = dest.with_name(f'.{dest.name}.{os.getpid()}.tmp')
            try:
                shutil.copyfile(wheel, tmp_dest)
                os.replace(tmp_dest, dest)
            finally:
                tmp_dest.unlink(missing_ok=True)
        written.append(dest)
    return sorted(written)


def remove_stale_temporaries(out: Path) -> None:
    """Delete the temporary copies (``.<wheel>.<pid>.tmp``) that a killed build left in `out`; a live build's stay."""
    for tmp in out.glob('.*.whl.*.tmp'):
        pid = tmp.name.rsplit('.', 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
