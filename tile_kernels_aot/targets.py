"""Which binary target runs on which GPU, and what to install when none does. Pure functions of explicit
facts (plus `find_checkout`, which gathers the facts of a source tree), so they are tested on CPU.

SASS compatibility rules (NVIDIA, CUDA 12.9+):
  sm_XYa   runs only on compute capability X.Y exactly ('a' = arch-specific features: wgmma, setmaxnreg,
           tcgen05). The cubin ELF header cannot tell sm_100a from sm_100, hence the manifest records it.
  sm_XYf   runs on the family: major X, minor >= Y (sm_100f on 10.0 and 10.3).
  sm_XY    runs on major X, minor >= Y.
Among the installed targets that run on a device we prefer an exact 'a' target, then 'f', then plain,
then the newest. tile-kernels-aot builds sm_90a (H100/H200/GH200, whose kernels may use Hopper-only
instructions) and sm_100f (the Blackwell datacenter family: B200/GB200 at 10.0, B300/GB300 at 10.3). No
kernel needs an instruction specific to 10.0: the sm_100f cubins have the SASS of sm_100a ones.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

KNOWN_TARGETS = ('sm_90a', 'sm_100f')
# The GPUs each target serves, for the README and for UnsupportedDeviceError.
SERVED_GPUS = {'sm_90a': 'H100, H200, GH200', 'sm_100f': 'B200, GB200, B300, GB300'}
_TARGET_RE = re.compile(r'^sm_(\d+)([af]?)$')
_PREFERENCE = {'a': 0, 'f': 1, '': 2}


def parse_target(target: str) -> tuple[int, int, str]:
    match = _TARGET_RE.match(target)
    if not match:
        raise ValueError(f'bad target {target!r}: expected sm_<digits>[a|f], e.g. sm_90a')
    sm = int(match.group(1))
    return sm // 10, sm % 10, match.group(2)


def family(target: str) -> str:
    """The family a target belongs to, the key of per-arch tuning: sm_90a -> sm_90, sm_100a and sm_100f ->
    sm_100 (the SASS of a family target and of its 'a' target agree wherever no arch-specific instruction is
    used, and so do their register and vector trade-offs)."""
    major, _, _ = parse_target(target)
    return f'sm_{major}0'


def package_for(target: str) -> str:
    """Import name of the arch package holding `target` binaries: sm_90a -> tile_kernels_aot_sm90a."""
    return 'tile_kernels_aot_' + target.replace('_', '')


def distribution_for(target: str) -> str:
    return 'tile-kernels-aot-' + target.replace('_', '')


def runs_on(target: str, capability: tuple[int, int]) -> tuple[bool, str]:
    """Whether `target` SASS runs on a GPU of `capability`, and why (or why not)."""
    major, minor, suffix = parse_target(target)
    cc_major, cc_minor = capability
    if suffix == 'a':
        ok = (cc_major, cc_minor) == (major, minor)
        rule = f'{target} runs only on compute capability {major}.{minor}'
    else:
        ok = cc_major == major and cc_minor >= minor
        rule = f'{target} runs on compute capability {major}.{minor} to {major}.9'
    return ok, rule


def choose_target(capability: tuple[int, int], installed: list[str]) -> tuple[str | None, list[str]]:
    """The best installed target for a device, and one line of reasoning per installed target."""
    accepted, reasons = [], []
    for target in installed:
        ok, rule = runs_on(target, capability)
        reasons.append(f'{target}: {"accepted" if ok else "rejected"} ({rule})')
        if ok:
            accepted.append(target)
    if not accepted:
        return None, reasons
    best = min(accepted, key=lambda t: (_PREFERENCE[parse_target(t)[2]], -(parse_target(t)[0] * 10 + parse_target(t)[1])))
    return best, reasons


def _capabilities(target: str) -> str:
    major, minor, suffix = parse_target(target)
    return f'compute capability {major}.{minor}' if suffix == 'a' else f'compute capability {major}.{minor} to {major}.9'


def cli_arch(target: str) -> str:
    """The name `python -m build_tools --arch` takes for a target: sm_90a -> sm90."""
    major, minor, _ = parse_target(target)
    return f'sm{major}{minor}'


@dataclasses.dataclass(frozen=True)
class Checkout:
    """A source tree of tile-kernels-aot and the binaries it holds."""

    root: Path
    built: tuple[str, ...] = ()  # targets with build/<target>/manifest.json (a folder the loader can read)
    wheels: tuple[str, ...] = ()  # targets with an arch wheel in dist/


def find_checkout(root: Path) -> Checkout | None:
    """The checkout at `root` (the folder above the package) if it is one: kernel_src/, build/ or dist/ is
    there. An installed runtime's folder above is site-packages, which has none of them."""
    root = Path(root)
    if not any((root / name).is_dir() for name in ('kernel_src', 'build', 'dist')):
        return None
    built = tuple(t for t in KNOWN_TARGETS if (root / 'build' / t / 'manifest.json').is_file())
    wheels = tuple(t for t in KNOWN_TARGETS if any((root / 'dist').glob(f'{package_for(t)}-*.whl')))
    return Checkout(root, built, wheels)


def install_advice(capability: tuple[int, int], checkout: Checkout | None = None) -> str:
    """What to do when no installed binaries run on a GPU of `capability`. In a development checkout the local
    build comes first: its build/<target> folder, its wheels in dist/, or the command that builds them."""
    for target in KNOWN_TARGETS:
        if runs_on(target, capability)[0]:
            break
    else:
        shipped = '; '.join(f'{t} ({_capabilities(t)}: {SERVED_GPUS[t]})' for t in KNOWN_TARGETS)
        return (f'tile-kernels-aot serves {shipped} only; this GPU needs a new target in '
                'tile_kernels_aot/targets.py KNOWN_TARGETS (the build takes its arches from there), then a rebuild.')
    pypi = f'pip install {distribution_for(target)} (or pip install tile-kernels-aot for all arches)'
    if checkout is None:
        return f'Install the binaries for it: {pypi}.'
    folder = checkout.root / 'build' / target
    lines = [f'In this development checkout ({checkout.root}):']
    if target in checkout.built:
        lines.append(f'  use its build: TILE_KERNELS_AOT_KERNEL_DIRS={folder} (python -m pytest in the checkout sets it itself)')
    if target in checkout.wheels:
        lines.append(f'  install its wheels: pip install --find-links {checkout.root / "dist"} tile-kernels-aot')
    if len(lines) == 1:
        lines.append(f'  build them: python -m build_tools --arch {cli_arch(target)}, then set '
                     f'TILE_KERNELS_AOT_KERNEL_DIRS={folder} or pip install --find-links {checkout.root / "dist"} tile-kernels-aot')
    lines.append(f'Released binaries: {pypi}.')
    return '\n'.join(lines)
