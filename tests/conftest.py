"""Test settings shared by every test: the gpu marker, per-test seeds, which binaries the tests load, and what
ran where."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from tile_kernels_aot import targets
from tile_kernels_aot._select import KERNEL_DIRS_ENV
CHECKOUT = Path(__file__).resolve().parent.parent
_set_by_conftest = pytest.StashKey[bool]()


def local_kernel_dirs(root: Path, environ: Mapping[str, str]) -> list[Path]:
    """The checkout's build/<target> folders that hold a manifest, which the tests load when the environment
    names no kernel folders: `python -m build_tools` then `python -m pytest` tests what was just built, with
    no install step. A TILE_KERNELS_AOT_KERNEL_DIRS that is set, even empty (installed packages only), wins."""
    if KERNEL_DIRS_ENV in environ:
        return []
    checkout = targets.find_checkout(root)
    return [] if checkout is None else [root / 'build' / target for target in checkout.built]


def binaries_line() -> str:
    """Where the loader finds each target's binaries, and how many, for pytest's header."""
    from tile_kernels_aot import _select

    _select.reset()
    try:
        packages = _select.installed_packages()
        found = [(p, sum(len(info.entries) for info in p.manifest.kernels.values()), len(p.manifest.kernels)) for p in packages]
    except (OSError, ValueError) as exc:
        return f'binaries: cannot read them: {exc}'
    finally:
        _select.reset()
    if not found:
        return 'binaries: none (python -m build_tools --arch all builds them into build/, which the tests then load)'
    return 'binaries: ' + '; '.join(
        f'{p.target} {p.root}' + ('' if p.origin.startswith(KERNEL_DIRS_ENV) else f' ({p.origin})') + f', {specs} spec(s) of {kernels} kernel(s)'
        for p, specs, kernels in found)


def pytest_configure(config):
    dirs = local_kernel_dirs(CHECKOUT, os.environ)
    if dirs:
        # Before any test module asks the loader for binaries (the GPU tests do at collection).
        os.environ[KERNEL_DIRS_ENV] = os.pathsep.join(map(str, dirs))
        config.stash[_set_by_conftest] = True


def pytest_report_header(config):
    import tile_kernels_aot

    lines = [f'tile_kernels_aot {tile_kernels_aot.__version__} from {tile_kernels_aot.__file__}', f'torch {torch.__version__}']
    lines.append(binaries_line())
    if config.stash.get(_set_by_conftest, False):
        lines.append(f'  (this checkout\'s build/, set by tests/conftest.py; an empty {KERNEL_DIRS_ENV}= loads the installed packages)')
    if torch.cuda.is_available():
        lines.append(f'GPU: {torch.cuda.get_device_name(0)}, compute capability {torch.cuda.get_device_capability(0)}')
    else:
        lines.append('GPU: none (tests marked gpu are skipped)')
    return lines


def pytest_runtest_setup(item):
    if item.get_closest_marker('gpu') and not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU')


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    # Every test starts without launch plans, so that one that patches an op's internals (its choice of binary) never
    # meets a plan an earlier test recorded (tile_kernels_aot._plans).
    from tile_kernels_aot import _plans

    _plans.clear()


@pytest.fixture(autouse=True)
def _seed(request):
    # A seed per test id: reruns are reproducible and tests do not depend on their order.
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:4], 'little')
    torch.manual_seed(seed)
