"""python -m build_tools --arch {sm90,sm100,all} [--kernels PATTERN] [--specs FILE] [--jobs N] [--out DIR] [--no-wheels]"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from build_tools.build import REPO_ROOT, BuildArgs, build
from build_tools.util import BuildError
from kernel_src.decl import ARCHS, Arch

DESCRIPTION = """Build tile-kernels-aot wheels: lower every kernel spec with tilelang for the chosen GPU
architectures, compile the CUDA sources to cubins with nvcc (through ninja), write the manifest and
package per-arch wheels, the runtime wheel and the meta package. Needs nvcc, no GPU."""


def parse_args(argv: list[str] | None = None) -> BuildArgs:
    parser = argparse.ArgumentParser(prog='python -m build_tools', description=DESCRIPTION)
    parser.add_argument('--arch', required=True, help=f'{", ".join(a.cli_name for a in ARCHS)} or all (comma-separated list allowed)')
    parser.add_argument('--kernels', default='*', help='glob(s) over kernel names, comma-separated, e.g. "moe.*,transpose.*"')
    parser.add_argument('--specs', type=Path, default=None, help='JSON file of extra specs: [{"kernel": ..., "params": {...}}]')
    parser.add_argument('--only-specs', action='store_true', help='build only the specs of --specs, not the prebuilt list')
    parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1, help='parallel lowering processes and nvcc jobs')
    parser.add_argument('--out', type=Path, default=REPO_ROOT / 'dist', help='where the wheels go (default: dist/)')
    parser.add_argument('--build-dir', type=Path, default=REPO_ROOT / 'build', help='intermediate files (default: build/)')
    parser.add_argument('--no-wheels', action='store_true', help='stop after the manifests')
    parser.add_argument('--partial-wheels', action='store_true',
                        help='package wheels even when --kernels or --only-specs leave kernels or specs out (such an '
                             'arch wheel, installed, replaces the full one)')
    parser.add_argument('--registry', default='kernel_src.registry', help='module whose DECLS to build (default: kernel_src.registry)')
    ns = parser.parse_args(argv)
    names = [n.strip() for n in ns.arch.split(',') if n.strip()]
    try:
        archs = ARCHS if names == ['all'] else tuple(Arch.parse(n) for n in names)
    except ValueError as exc:
        parser.error(str(exc))
    if ns.jobs < 1:
        parser.error('--jobs must be at least 1')
    return BuildArgs(
        archs=archs, kernels=tuple(p.strip() for p in ns.kernels.split(',') if p.strip()), specs_file=ns.specs,
        jobs=ns.jobs, out=ns.out, build_dir=ns.build_dir, wheels=not ns.no_wheels, prebuilt=not ns.only_specs, registry=ns.registry,
        partial_wheels=ns.partial_wheels,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        wheels = build(args)
    except BuildError as exc:
        print(f'build failed: {exc}', file=sys.stderr)
        return 1
    for wheel in wheels:
        print(wheel)
    return 0


if __name__ == '__main__':
    sys.exit(main())
