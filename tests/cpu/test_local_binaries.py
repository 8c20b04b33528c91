"""A development checkout's own binaries: the tests load build/<target> without an install step, pytest's header says
which binaries they use, and a GPU with no binaries is told about the local build before PyPI."""

from __future__ import annotations

from pathlib import Path

import pytest

from tile_kernels_aot import _select, targets
from tile_kernels_aot.errors import UnsupportedDeviceError
from tile_kernels_aot.manifest import Manifest, manifest_to_json

from ..conftest import KERNEL_DIRS_ENV, binaries_line, local_kernel_dirs

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_checkout(root: Path, built=(), wheels=(), half_built=()) -> Path:
    (root / 'kernel_src').mkdir(parents=True)
    for target in built:
        folder = root / 'build' / target
        folder.mkdir(parents=True)
        (folder / 'manifest.json').write_text(manifest_to_json(Manifest(target, targets.distribution_for(target), '0.1.0', {}, {})))
    for target in half_built:  # lowering started, no manifest yet
        (root / 'build' / target / 'sources').mkdir(parents=True)
    for target in wheels:
        (root / 'dist').mkdir(exist_ok=True)
        (root / 'dist' / f'{targets.package_for(target)}-0.1.0-py3-none-any.whl').write_bytes(b'')
    return root


def test_a_checkout_is_found_with_what_it_holds(tmp_path):
    assert targets.find_checkout(tmp_path) is None  # e.g. site-packages
    root = make_checkout(tmp_path / 'repo', built=['sm_90a'], wheels=['sm_100f'], half_built=['sm_100f'])
    assert targets.find_checkout(root) == targets.Checkout(root, built=('sm_90a',), wheels=('sm_100f',))
    assert targets.find_checkout(REPO_ROOT) is not None


def test_tests_load_the_checkouts_build_when_the_environment_names_nothing(tmp_path):
    root = make_checkout(tmp_path, built=['sm_90a', 'sm_100f'])
    assert local_kernel_dirs(root, {}) == [root / 'build' / 'sm_90a', root / 'build' / 'sm_100f']
    assert local_kernel_dirs(root, {KERNEL_DIRS_ENV: '/elsewhere/sm_90a'}) == []
    assert local_kernel_dirs(root, {KERNEL_DIRS_ENV: ''}) == []  # set but empty: the installed packages only


def test_tests_use_installed_packages_without_a_build(tmp_path):
    assert local_kernel_dirs(make_checkout(tmp_path / 'a', half_built=['sm_90a']), {}) == []
    assert local_kernel_dirs(tmp_path / 'copy-of-the-tests', {}) == []  # the GPU machine's copy has no build/


def test_header_names_the_binaries(tmp_path, monkeypatch):
    root = make_checkout(tmp_path / 'repo', built=['sm_90a'])
    site = make_checkout(tmp_path / 'site', built=['sm_100f']) / 'build'  # an installed package holds a manifest alike
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: site / target if target == 'sm_100f' else None)
    monkeypatch.setenv(KERNEL_DIRS_ENV, str(root / 'build' / 'sm_90a'))
    assert binaries_line() == (f"binaries: sm_90a {root / 'build' / 'sm_90a'}, 0 spec(s) of 0 kernel(s); "
                               f"sm_100f {site / 'sm_100f'} (tile-kernels-aot-sm100f), 0 spec(s) of 0 kernel(s)")
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    monkeypatch.setenv(KERNEL_DIRS_ENV, '')
    assert binaries_line() == 'binaries: none (python -m build_tools --arch all builds them into build/, which the tests then load)'
    monkeypatch.setenv(KERNEL_DIRS_ENV, str(tmp_path / 'nothing'))
    assert binaries_line() == (f'binaries: cannot read them: {KERNEL_DIRS_ENV} names {tmp_path / "nothing"}, which is not a folder; '
                               f'fix or unset {KERNEL_DIRS_ENV}')


def test_advice_outside_a_checkout_is_the_release():
    assert targets.install_advice((9, 0)) == (
        'Install the binaries for it: pip install tile-kernels-aot-sm90a (or pip install tile-kernels-aot for all arches).')


def test_advice_in_a_fresh_checkout_is_the_build_command(tmp_path):
    dist, build = tmp_path / 'dist', tmp_path / 'build' / 'sm_90a'
    assert targets.install_advice((9, 0), targets.Checkout(tmp_path)) == (
        f'In this development checkout ({tmp_path}):\n'
        f'  build them: python -m build_tools --arch sm90, then set TILE_KERNELS_AOT_KERNEL_DIRS={build} '
        f'or pip install --find-links {dist} tile-kernels-aot\n'
        'Released binaries: pip install tile-kernels-aot-sm90a (or pip install tile-kernels-aot for all arches).')


def test_advice_in_a_built_checkout_names_build_and_dist(tmp_path):
    checkout = targets.Checkout(tmp_path, built=('sm_100f',), wheels=('sm_100f',))
    assert targets.install_advice((10, 0), checkout) == (
        f'In this development checkout ({tmp_path}):\n'
        f'  use its build: TILE_KERNELS_AOT_KERNEL_DIRS={tmp_path / "build" / "sm_100f"} (python -m pytest in the checkout sets it itself)\n'
        f'  install its wheels: pip install --find-links {tmp_path / "dist"} tile-kernels-aot\n'
        'Released binaries: pip install tile-kernels-aot-sm100f (or pip install tile-kernels-aot for all arches).')
    # The other arch's build does not serve this GPU: build it.
    assert '--arch sm90,' in targets.install_advice((9, 0), checkout)


def test_advice_for_a_gpu_no_target_serves():
    assert targets.install_advice((8, 0), targets.Checkout(Path('/repo'))) == (
        'tile-kernels-aot serves sm_90a (compute capability 9.0: H100, H200, GH200); '
        'sm_100f (compute capability 10.0 to 10.9: B200, GB200, B300, GB300) only; '
        'this GPU needs a new target in tile_kernels_aot/targets.py KNOWN_TARGETS (the build takes its arches from there), '
        'then a rebuild.')


def test_unsupported_device_error_in_a_checkout_names_the_local_build(monkeypatch):
    monkeypatch.setenv(KERNEL_DIRS_ENV, '')
    monkeypatch.setattr(_select, 'find_arch_package', lambda target: None)
    monkeypatch.setattr(_select, 'device_facts', lambda index: ('NVIDIA H200', (9, 0)))
    seen = []
    monkeypatch.setattr(targets, 'find_checkout', lambda root: seen.append(root) or targets.Checkout(root))
    _select.reset()
    try:
        with pytest.raises(UnsupportedDeviceError) as info:
            _select.package_for_device(0)
    finally:
        _select.reset()
    assert seen == [REPO_ROOT]  # the folder above the package that is running
    message = str(info.value)
    assert 'Installed arch packages: none.' in message
    assert f'In this development checkout ({REPO_ROOT}):\n  build them: python -m build_tools --arch sm90' in message
    assert 'pip install tile-kernels-aot-sm90a' in message
