"""python -m tile_kernels_aot {doctor,list,version}: check a host before a deploy, and see what is installed."""

from __future__ import annotations

import argparse
import ctypes
import difflib
import fnmatch
import json
import os
import sys
from collections.abc import Callable

from tile_kernels_aot import _select, targets
from tile_kernels_aot.errors import TileKernelsAOTError
from tile_kernels_aot.version import __version__

PROG = 'python -m tile_kernels_aot'
DESCRIPTION = """Inspect the tile-kernels-aot install. doctor: check that this host's GPUs can run the kernels (driver,
arch package, the sha256 of every cubin, one launch of each kernel family against its reference). list: the prebuilt
specs of each installed arch package (no GPU needed). version: the runtime's and each arch package's versions."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    commands = parser.add_subparsers(dest='command', required=True, metavar='{doctor,list,version}')
    doctor_parser = commands.add_parser('doctor', help='check the driver, the arch package, every cubin and one launch per family',
                                        allow_abbrev=False)
    doctor_parser.add_argument('--device', type=int, action='append', metavar='N',
                               help='check CUDA device N only (repeatable; default: every visible device)')
    list_parser = commands.add_parser('list', help='prebuilt specs per kernel of each installed arch package', allow_abbrev=False)
    list_parser.add_argument('patterns', nargs='*', metavar='GLOB', help='kernel names or globs, e.g. "moe.*" (default: all)')
    list_parser.add_argument('--target', help='only the arch package of this target (sm_90a, sm_100f)')
    list_parser.add_argument('--json', action='store_true',
                             help='one {"kernel": ..., "params": {...}} line per spec, the form `python -m build_tools --specs` reads')
    commands.add_parser('version', help='versions of the runtime, torch and each installed arch package', allow_abbrev=False)
    args = parser.parse_args(argv)
    try:
        if args.command == 'doctor':
            return doctor(args.device)
        if args.command == 'list':
            return list_specs(args.patterns, args.target, args.json)
        return version()
    except (TileKernelsAOTError, OSError, ValueError) as exc:  # a broken install: one line, not a traceback
        return _failed(args.command, _first_line(exc))


def _failed(command: str, reason: str) -> int:
    print(f'{PROG} {command}: {reason}', file=sys.stderr)
    return 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f'{type(exc).__name__}: {text[0] if text else ""}'


# -- version --------------------------------------------------------------------------------------------------------


def version() -> int:
    import torch

    import tile_kernels_aot

    print(f'tile-kernels-aot {__version__} ({os.path.dirname(tile_kernels_aot.__file__)})')
    print(f'torch {torch.__version__} (CUDA {torch.version.cuda or "none"})')
    packages = _select.installed_packages()
    for package in packages:
        manifest = package.manifest
        built_with = ', '.join(f'{tool} {manifest.provenance[tool]}' for tool in ('tilelang', 'nvcc') if tool in manifest.provenance)
        print(f'{package.target}: {manifest.package} {manifest.version} ({package.origin}; built with {built_with or "unknown tools"})')
    if not packages:
        print('arch packages: none installed')
    return 0


# -- list -----------------------------------------------------------------------------------------------------------


def list_specs(patterns: list[str], target: str | None, as_json: bool) -> int:
    packages = [p for p in _select.installed_packages() if target is None or p.target == target]
    if not packages:
        installed = ', '.join(p.target for p in _select.installed_packages())
        if target is not None and installed:
            return _failed('list', f'no arch package for {target} is installed (installed: {installed})')
        return _failed('list', 'no arch package is installed: pip install tile-kernels-aot, or point '
                               f'{_select.KERNEL_DIRS_ENV} at a build folder such as build/sm_90a')
    names = sorted({name for p in packages for name in p.manifest.kernels})
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            close = difflib.get_close_matches(pattern, names, n=4, cutoff=0.6)
            return _failed('list', f'no installed kernel matches {pattern!r}' + (f'; close names: {", ".join(close)}' if close else ''))
    chosen = [n for n in names if not patterns or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if as_json:
        seen = set()
        for package in packages:
            for name in chosen:
                info = package.manifest.kernels.get(name)
                for key, entry in sorted(info.entries.items()) if info else ():
                    if (name, key) not in seen:
                        seen.add((name, key))
                        print(json.dumps({'kernel': name, 'params': entry.params}))
        return 0
    for package in packages:
        kernels = [package.manifest.kernels[n] for n in chosen if n in package.manifest.kernels]
        print(f'{package.target} ({package.origin}): {_count(len(kernels), "kernel")}, '
              f'{_count(sum(len(k.entries) for k in kernels), "spec")}')
        for info in kernels:
            print(f'  {info.name}: {_count(len(info.entries), "spec")}')
            for key in sorted(info.entries):
                print(f'    {key}')
    return 0


def _count(n: int, noun: str) -> str:
    return f'{n} {noun}' + ('' if n == 1 else 's')


# -- doctor ---------------------------------------------------------------------------------------------------------


def driver_version() -> str:
    """The CUDA driver's version ('13.0'), from libcuda.so.1 (cuDriverGetVersion needs no cuInit)."""
    lib = ctypes.CDLL('libcuda.so.1')
    value = ctypes.c_int()
    code = lib.cuDriverGetVersion(ctypes.byref(value))
    if code:
        raise OSError(f'cuDriverGetVersion returned {code}')
    return f'{value.value // 1000}.{value.value % 1000 // 10}'


def no_gpu_reason() -> str | None:
    """Why torch sees no CUDA GPU, or None when it sees one."""
    import torch

    if torch.version.cuda is None:
        return f'no CUDA GPU: torch {torch.__version__} is built without CUDA'
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        visible = os.environ.get('CUDA_VISIBLE_DEVICES')
        where = f' (CUDA_VISIBLE_DEVICES={visible!r})' if visible is not None else ''
        return f'no CUDA GPU: torch {torch.__version__} finds no usable device{where}; check nvidia-smi and the driver'
    return None


def check_transpose(device: int) -> str:
    import torch

    import tile_kernels_aot

    x = torch.randn(256, 7168, device=f'cuda:{device}').bfloat16()
    _same('transpose.transpose', tile_kernels_aot.transpose.transpose(x), tile_kernels_aot.reference.transpose(x))
    return 'transpose.transpose bf16 [256, 7168]'


def check_moe(device: int) -> str:
    import torch

    import tile_kernels_aot

    scores = torch.randn(512, 256, device=f'cuda:{device}')
    idx = tile_kernels_aot.moe.topk_gate(scores, 8)
    _same('moe.topk_gate', idx, tile_kernels_aot.reference.stable_topk(scores, 8))
    _same('moe.group_count', tile_kernels_aot.moe.group_count(idx, 256), tile_kernels_aot.reference.group_count(idx, 256))
    return 'moe.topk_gate [512, 256] top 8, moe.group_count'


def check_quant(device: int) -> str:
    import torch

    import tile_kernels_aot

    x = torch.randn(512, 7168, device=f'cuda:{device}').bfloat16()
    q, sf = tile_kernels_aot.quant.per_token_cast(x, 'e4m3', 128)
    q_ref, sf_ref = tile_kernels_aot.reference.cast(x, 'e4m3', (1, 128))
    _same('quant.per_token_cast (data)', q.view(torch.uint8), q_ref.view(torch.uint8))
    _same('quant.per_token_cast (scales)', sf, sf_ref)
    _same('quant.cast_back', tile_kernels_aot.quant.cast_back((q, sf), 'bf16', (1, 128)),
          tile_kernels_aot.reference.cast_back((q_ref, sf_ref), 'bf16', (1, 128)))
    return 'quant.per_token_cast bf16 [512, 7168] e4m3 128/ch, quant.cast_back'


def _same(op: str, out, ref) -> None:
    """Bitwise equality (fp8 tensors are compared as bytes by the caller)."""
    import torch

    if out.shape != ref.shape or out.dtype != ref.dtype:
        raise AssertionError(f'{op} gives {out.dtype} {list(out.shape)}, the reference {ref.dtype} {list(ref.shape)}')
    if not torch.equal(out, ref):
        raise AssertionError(f'{op} differs from the reference in {int((out != ref).sum())} of {out.numel()} elements')


# One launch of each kernel family, checked bitwise against its pure-torch reference.
FAMILY_CHECKS: dict[str, Callable[[int], str]] = {'moe': check_moe, 'quant': check_quant, 'transpose': check_transpose}


class _Report:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def ok(self, text: str) -> None:
        print(f'ok    {text}', flush=True)

    def skip(self, text: str) -> None:
        print(f'skip  {text}', flush=True)

    def fail(self, text: str) -> None:
        print(f'FAIL  {text}', flush=True)
        self.problems.append(text)


def doctor(devices: list[int] | None = None) -> int:
    reason = no_gpu_reason()
    if reason is not None:
        return _failed('doctor', reason)
    import torch

    from tile_kernels_aot import _driver

    report = _Report()
    try:
        report.ok(f'CUDA driver {driver_version()} (libcuda.so.1), torch {torch.__version__} built for CUDA {torch.version.cuda}')
        _driver.driver()
    except (OSError, TileKernelsAOTError) as exc:
        return _failed('doctor', f'the CUDA driver does not load: {_first_line(exc)}')
    count = torch.cuda.device_count()
    for index in devices if devices else range(count):
        if not 0 <= index < count:
            report.fail(f'device {index}: no such device ({count} visible)')
            continue
        _check_device(report, index)
    if report.problems:
        first = report.problems[0]
        more = f' (and {len(report.problems) - 1} more above)' if len(report.problems) > 1 else ''
        return _failed('doctor', f'{first}{more}')
    print('doctor: OK', flush=True)
    return 0


_verified: dict[str, list[str]] = {}  # arch package root -> its problems, so that devices sharing it verify it once


def _check_device(report: _Report, index: int) -> None:
    name, capability = _select.device_facts(index)
    cc = f'{capability[0]}.{capability[1]}'
    report.ok(f'device {index}: {name}, compute capability {cc}')
    try:
        package = _select.package_for_device(index)
    except TileKernelsAOTError as exc:
        report.fail(f'device {index}: {_first_line(exc)}')
        return
    _, reasons = targets.choose_target(capability, [p.target for p in _select.installed_packages()])
    report.ok(f'device {index}: served by {package.target} from {package.origin}, because ' + '; '.join(reasons))
    _verify_cubins(report, package)
    families = sorted({name.partition('.')[0] for name in package.manifest.kernels})
    for family in families:
        check = FAMILY_CHECKS.get(family)
        if check is None:
            report.skip(f'device {index}: {family}: no launch check for this family')
            continue
        try:
            with torch_device(index):
                what = check(index)
                synchronize(index)
        except Exception as exc:  # noqa: BLE001 - any failure of the launch is the finding
            report.fail(f'device {index}: {family} launch: {_first_line(exc)}')
        else:
            report.ok(f'device {index}: {family}: {what} equal to the reference')


def torch_device(index: int):
    import torch

    return torch.cuda.device(index)


def synchronize(index: int) -> None:
    import torch

    torch.cuda.synchronize(index)


def _verify_cubins(report: _Report, package: _select.ArchPackage) -> None:
    """Read every cubin of the package and check its sha256 and ELF arch against the manifest, whatever
    TILE_KERNELS_AOT_VERIFY_SHA256 says."""
    from tile_kernels_aot._launch import LoadedKernel

    key = str(package.root)
    if key in _verified:
        return
    problems = _verified[key] = []
    entries = [e for info in package.manifest.kernels.values() for e in info.entries.values()]
    for entry in entries:
        try:
            LoadedKernel(entry, package.root, verify_sha256=True, package=package.origin).image()
        except TileKernelsAOTError as exc:
            problems.append(_first_line(exc))
    if problems:
        for problem in problems[:5]:
            report.fail(f'{package.target}: {problem}')
        if len(problems) > 5:
            report.fail(f'{package.target}: {len(problems) - 5} more cubins fail the same checks')
    else:
        report.ok(f'{package.target}: sha256 and ELF arch of all {_count(len(entries), "cubin")} match the manifest')


if __name__ == '__main__':
    sys.exit(main())
