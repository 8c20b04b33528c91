"""python -m build_tools --arch {sm90,sm100,all} [--kernels PATTERN] [--specs FILE] [--jobs N] [--out DIR] [--no-wheels]"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from build_tools.build import INSTALL_BUILD_TOOLS, REPO_ROOT, BuildArgs, build, tilelang_version
from build_tools.util import BuildError
from kernel_src.decl import ARCHS, Arch

DESCRIPTION = """Build tile-kernels-aot wheels: lower every kernel spec with tilelang for the chosen GPU
architectures, compile the CUDA sources to cubins with nvcc (through ninja), write the manifest and
package per-arch wheels, the runtime wheel and the meta package. Needs nvcc, no GPU."""


def arch_names(arch: Arch) -> tuple[str, ...]:
    """Every spelling --arch takes for `arch`: sm90, sm90a, sm_90a (the wheels carry sm90a and sm_90a)."""
    return tuple(dict.fromkeys((arch.cli_name, arch.target.replace('_', ''), arch.target)))


ARCH_NAMES = {name: arch for arch in ARCHS for name in arch_names(arch)}


def parse_archs(value: str) -> tuple[Arch, ...]:
    """A comma-separated list of arch names or 'all', case-insensitive."""
    names = [n.strip().lower() for n in value.split(',') if n.strip()]
    if 'all' in names:
        return ARCHS
    unknown = [n for n in names if n not in ARCH_NAMES]
    if unknown or not names:
        accepted = ', '.join([*ARCH_NAMES, 'all'])
        raise ValueError(f'unknown arch {", ".join(unknown) or repr(value)}; accepted (case-insensitive, comma-separated): {accepted}')
    return tuple(dict.fromkeys(ARCH_NAMES[n] for n in names))


def parse_args(argv: list[str] | None = None) -> BuildArgs:
    # allow_abbrev=False: a mistyped flag such as --no-wheel is an error, never another flag's prefix.
    parser = argparse.ArgumentParser(prog='python -m build_tools', description=DESCRIPTION, allow_abbrev=False)
    parser.add_argument('--arch', required=True,
                        help=f'{", ".join(ARCH_NAMES)} or all (case-insensitive; a comma-separated list allowed)')
    parser.add_argument('--kernels', default='*', help='glob(s) over kernel names, comma-separated, e.g. "moe.*,transpose.*"')
    parser.add_argument('--specs', type=Path, default=None, help='file of extra specs: a JSON list [{"kernel": ..., "params": {...}}] or JSON Lines, '
                        'one such object a line (what TILE_KERNELS_AOT_RECORD_MISSES writes)')
    parser.add_argument('--only-specs', action='store_true', help='build only the specs of --specs, not the prebuilt list')
    parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1, help='parallel lowering processes and nvcc jobs')
    parser.add_argument('--out', type=Path, default=REPO_ROOT / 'dist', help='where the wheels go (default: dist/)')
    parser.add_argument('--build-dir', type=Path, default=REPO_ROOT / 'build', help='intermediate files (default: build/)')
    parser.add_argument('--no-wheels', action='store_true', help='stop after the manifests (the binaries stay in the build folder)')
    parser.add_argument('--partial-wheels', action='store_true',
                        help='package wheels even when --kernels or --only-specs leave kernels or specs out (such an '
                             'arch wheel, installed, replaces the full one)')
    parser.add_argument('--registry', default='kernel_src.registry', help='module whose DECLS to build (default: kernel_src.registry)')
    ns = parser.parse_args(argv)
    try:
        archs = parse_archs(ns.arch)
    except ValueError as exc:
        parser.error(f'--arch: {exc}')
    if ns.jobs < 1:
        parser.error('--jobs must be at least 1')
    return BuildArgs(
        archs=archs, kernels=tuple(p.strip() for p in ns.kernels.split(',') if p.strip()), specs_file=ns.specs,
        jobs=ns.jobs, out=ns.out, build_dir=ns.build_dir, wheels=not ns.no_wheels, prebuilt=not ns.only_specs, registry=ns.registry,
        partial_wheels=ns.partial_wheels,
    )


# The modules of pyproject's build extra, and what each is for.
BUILD_MODULES = {'tilelang': 'it lowers the kernels', 'ninja': 'it drives nvcc', 'setuptools': 'it packs the wheels'}


def missing_tools(wheels: bool) -> str | None:
    """One line naming what the build lacks or has at the wrong version and how to fix it, or None when everything is there."""
    from build_tools import ninja

    for module, purpose in BUILD_MODULES.items():
        if (wheels or module != 'setuptools') and importlib.util.find_spec(module) is None:
            return f"the Python package '{module}' is missing ({purpose}): {INSTALL_BUILD_TOOLS}"
    try:
        tilelang_version()  # the pinned one
        ninja.nvcc_version()  # found, runs, and new enough
    except BuildError as exc:
        return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = missing_tools(args.wheels)
    if problem is not None:
        print(f'python -m build_tools: {problem}', file=sys.stderr)
        return 1
    try:
        wheels = build(args)
    except BuildError as exc:
        print(f'build failed: {exc}', file=sys.stderr)
        return 1
    except ModuleNotFoundError as exc:
        if exc.name not in BUILD_MODULES:
            raise
        print(f"python -m build_tools: the Python package '{exc.name}' is missing: {INSTALL_BUILD_TOOLS}", file=sys.stderr)
        return 1
    for wheel in wheels:
        print(wheel)
    return 0


if __name__ == '__main__':
    sys.exit(main())
