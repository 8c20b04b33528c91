"""An arch package folder that is BASE with the kernels of BUILD in place of its own: the "after" side of an A/B.

    python -m benchmarks.overlay BASE BUILD OUT

BASE is an arch package or build folder (e.g. the installed tile_kernels_aot_sm90a, or build/sm_90a), BUILD a build
folder of the same target holding some kernels (`python -m build_tools --kernels ... --no-wheels --build-dir DIR`),
OUT a new folder. Point TILE_KERNELS_AOT_KERNEL_DIRS at OUT and every kernel loads: those of BUILD from BUILD's
binaries, the rest from BASE's. (A build folder alone would serve only its own kernels, since the loader takes one
package per target.) benchmarks.compare then compares a run on BASE with a run on OUT.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def overlay(base: Path, build: Path, out: Path) -> list[str]:
    """Write OUT; returns the kernels taken from BUILD."""
    base_manifest = json.loads((base / 'manifest.json').read_text())
    build_manifest = json.loads((build / 'manifest.json').read_text())
    if build_manifest['target'] != base_manifest['target']:
        raise ValueError(f'{build} is for {build_manifest["target"]}, {base} for {base_manifest["target"]}')
    if out.exists():
        raise FileExistsError(f'{out} exists: overlay writes a new folder')
    shutil.copytree(base, out, ignore=shutil.ignore_patterns('__pycache__', '*.py'))
    replaced = sorted(build_manifest['kernels'])
    for name in replaced:
        base_manifest['kernels'][name] = build_manifest['kernels'][name]
        provenance = build_manifest.get('provenance', {}).get('kernels', {})
        if name in provenance:
            base_manifest.setdefault('provenance', {}).setdefault('kernels', {})[name] = provenance[name]
        for folder in ('cubins', 'sources', 'meta'):
            if (build / folder / name).exists():
                shutil.rmtree(out / folder / name, ignore_errors=True)
                shutil.copytree(build / folder / name, out / folder / name)
    (out / 'manifest.json').write_text(json.dumps(base_manifest, indent=1, sort_keys=True))
    return replaced


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('base', type=Path)
    parser.add_argument('build', type=Path)
    parser.add_argument('out', type=Path)
    args = parser.parse_args()
    replaced = overlay(args.base, args.build, args.out)
    print(f'{args.out}: {args.base} with {len(replaced)} kernels of {args.build}: {", ".join(replaced)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
