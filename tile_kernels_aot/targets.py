"""Which binary target runs on which GPU. Pure functions of explicit facts, so they are tested on CPU.

SASS compatibility rules (NVIDIA, CUDA 12.9+):
  sm_XYa   runs only on compute capability X.Y exactly ('a' = arch-specific features: wgmma, setmaxnreg,
           tcgen05). The cubin ELF header cannot tell sm_100a from sm_100, hence the manifest records it.
  sm_XYf   runs on the family: major X, minor >= Y (sm_100f on 10.0 and 10.3).
  sm_XY    runs on major X, minor >= Y.
Among the installed targets that run on a device we prefer an exact 'a' target, then 'f', then plain,
then the newest. tile-kernels-aot builds sm_90a (H100/H200/GH200) and sm_100a (B200/GB200).
"""

from __future__ import annotations

import re

KNOWN_TARGETS = ('sm_90a', 'sm_100a')
_TARGET_RE = re.compile(r'^sm_(\d+)([af]?)$')
_PREFERENCE = {'a': 0, 'f': 1, '': 2}


def parse_target(target: str) -> tuple[int, int, str]:
    match = _TARGET_RE.match(target)
    if not match:
        raise ValueError(f'bad target {target!r}: expected sm_<digits>[a|f], e.g. sm_90a')
    sm = int(match.group(1))
    return sm // 10, sm % 10, match.group(2)


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


def install_advice(capability: tuple[int, int]) -> str:
    for target in KNOWN_TARGETS:
        if runs_on(target, capability)[0]:
            return f'Install the binaries for it: pip install {distribution_for(target)} (or pip install tile-kernels-aot for all arches).'
    shipped = ', '.join(f'{t} (compute capability {".".join(map(str, parse_target(t)[:2]))})' for t in KNOWN_TARGETS)
    return (f'tile-kernels-aot ships binaries for {shipped} only; this GPU needs a new target in '
            'kernel_src/decl.py ARCHS and tile_kernels_aot/targets.py KNOWN_TARGETS, then a rebuild.')
