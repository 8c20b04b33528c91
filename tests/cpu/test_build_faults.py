"""Build faults: two builds in one folder, a build killed mid-way, missing or wrong tools, a wheel cut short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import build_tools.__main__ as cli
from build_tools import build as build_module, ninja, wheels
from build_tools.lock import LOCK_NAME, BuildLock
from build_tools.util import BuildError

from .conftest import build_subset

CHECKOUT = Path(__file__).resolve().parents[2]


def python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, '-c', textwrap.dedent(code)], cwd=CHECKOUT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


# -- one build per folder ----------------------------------------------------------------------------------


def test_a_second_build_in_the_same_folder_is_refused(tmp_path):
    with BuildLock(tmp_path / 'build'):
        assert (tmp_path / 'build' / LOCK_NAME).read_text() == f'{os.getpid()}\n'
        with pytest.raises(BuildError) as info:
            BuildLock(tmp_path / 'build').__enter__()
    assert str(info.value) == (f'another build (process {os.getpid()}) is using the build folder {tmp_path / "build"}; wait for '
                               'it to finish, or give this one another --build-dir')
    with BuildLock(tmp_path / 'build'):  # released on exit
        pass
    with BuildLock(tmp_path / 'other'), BuildLock(tmp_path / 'build'):  # other folders are independent
        pass


def test_build_takes_the_lock_before_it_writes_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build_module, 'toolchain', lambda: {'tilelang': '0.1.15', 'nvcc': '13.0.88'})
    monkeypatch.setattr(build_module, '_lower_stale', lambda *a: pytest.fail('lowered inside a locked folder'))
    args = cli.parse_args(['--arch', 'sm90', '--no-wheels', '--build-dir', str(tmp_path / 'build')])
    with BuildLock(tmp_path / 'build'):
        with pytest.raises(BuildError, match='another build .* is using the build folder'):
            build_module.build(args)
    monkeypatch.setattr(cli, 'missing_tools', lambda wheels: None)
    with BuildLock(tmp_path / 'build'):
        assert cli.main(['--arch', 'sm90', '--no-wheels', '--build-dir', str(tmp_path / 'build')]) == 1
    err = capsys.readouterr().err
    assert err.startswith('build failed: another build (process ') and err.count('\n') == 1


def test_a_lock_held_by_another_process_and_its_death(tmp_path):
    holder = python(f'''
        from build_tools.lock import BuildLock
        import time
        with BuildLock({str(tmp_path / 'build')!r}):
            print('locked', flush=True)
            time.sleep(600)
    ''')
    try:
        assert holder.stdout.readline() == 'locked\n'
        with pytest.raises(BuildError, match=f'another build \\(process {holder.pid}\\)'):
            BuildLock(tmp_path / 'build').__enter__()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The lock file still names the dead process; the kernel dropped its flock, so the lock is free.
    assert (tmp_path / 'build' / LOCK_NAME).read_text() == f'{holder.pid}\n'
    with BuildLock(tmp_path / 'build'):
        assert (tmp_path / 'build' / LOCK_NAME).read_text() == f'{os.getpid()}\n'


def test_a_stale_lock_file_is_taken(tmp_path):
    (tmp_path / 'build').mkdir()
    (tmp_path / 'build' / LOCK_NAME).write_text('999999999\n')  # no such process, no flock
    with BuildLock(tmp_path / 'build'):
        pass


# -- tools -------------------------------------------------------------------------------------------------


def run_main(capsys, argv):
    code = cli.main(argv)
    return code, capsys.readouterr().err


@pytest.fixture
def no_build(monkeypatch):
    monkeypatch.setattr(cli, 'build', lambda args: pytest.fail('the build ran with a wrong tool'))


def test_tilelang_at_another_version_is_one_line(capsys, monkeypatch, no_build):
    import importlib.metadata

    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, 'version', lambda name: '0.1.14' if name == 'tilelang' else real(name))
    code, err = run_main(capsys, ['--arch', 'sm90'])
    assert code == 1
    assert err == (f"python -m build_tools: tilelang 0.1.14 is installed; the build needs tilelang=={build_module.required_tilelang()}, "
                   "the version its lowering is verified with: pip install -e '.[build]'\n")


def test_the_pinned_tilelang_is_pyproject_s():
    assert build_module.required_tilelang() == '0.1.15'
    assert build_module.tilelang_version() == '0.1.15'


def fake_nvcc(tmp_path: Path, script: str) -> Path:
    path = tmp_path / 'bin' / 'nvcc'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('#!/bin/sh\n' + script + '\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize('script, message', [
    ('echo "Cuda compilation tools, release 12.4, V12.4.131"', 'is CUDA 12.4.131; the build needs CUDA 13.0 or newer (put it on PATH or set CUDA_HOME)'),
    ('echo "nvcc: NVIDIA (R) Cuda compiler driver"', "does not say its version (exit status 0: 'nvcc: NVIDIA (R) Cuda compiler driver')"),
    ('echo "libcudart.so: cannot open" >&2; exit 127', "does not say its version (exit status 127: 'libcudart.so: cannot open')"),
])
def test_nvcc_too_old_or_broken_is_one_line(capsys, monkeypatch, tmp_path, no_build, script, message):
    nvcc = fake_nvcc(tmp_path, script)
    monkeypatch.setattr(ninja.shutil, 'which', lambda name: str(nvcc))
    code, err = run_main(capsys, ['--arch', 'sm90'])
    assert code == 1 and err == f'python -m build_tools: nvcc at {nvcc} {message}\n'


def test_nvcc_that_cannot_run_is_one_line(capsys, monkeypatch, tmp_path, no_build):
    nvcc = tmp_path / 'nvcc'
    nvcc.write_text('not a program')  # not executable
    monkeypatch.setattr(ninja.shutil, 'which', lambda name: str(nvcc))
    code, err = run_main(capsys, ['--arch', 'sm90'])
    assert code == 1 and err.startswith(f'python -m build_tools: nvcc at {nvcc} does not run: ') and err.count('\n') == 1


def test_the_installed_tools_pass():
    assert cli.missing_tools(wheels=True) is None
    assert tuple(int(x) for x in ninja.nvcc_version().split('.')[:2]) >= ninja.NVCC_MIN


# -- wheels are whole or absent ----------------------------------------------------------------------------


def test_a_copy_cut_short_leaves_no_file_in_the_output_folder(tmp_path, monkeypatch):
    out = tmp_path / 'dist'
    out.mkdir()
    wheel = tmp_path / 'cache' / 'tile_kernels_aot-0.1.0-py3-none-any.whl'
    wheel.parent.mkdir()
    wheel.write_bytes(b'PK' + bytes(4096))

    def copy_half(src, dst):
        Path(dst).write_bytes(Path(src).read_bytes()[:100])
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(wheels.shutil, 'copyfile', copy_half)
    monkeypatch.setattr(wheels, '_run_backend', lambda stage, out_dir: pytest.fail('not reached'))
    with pytest.raises(OSError, match='No space left'):
        wheels.install_wheels({'tile-kernels-aot': wheel}, out)
    assert list(out.iterdir()) == []


def test_temporaries_of_dead_builds_are_removed(tmp_path):
    dead = tmp_path / '.tile_kernels_aot-0.1.0-py3-none-any.whl.999999999.tmp'
    live = tmp_path / f'.tile_kernels_aot-0.1.0-py3-none-any.whl.{os.getpid()}.tmp'
    other = tmp_path / '.hidden'
    for path in (dead, live, other):
        path.write_bytes(b'PK')
    wheels.remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


# -- a build killed with SIGKILL resumes -------------------------------------------------------------------


def run_until(root: Path, marker) -> str:
    """Start the subset build of `root` in its own process group and SIGKILL the group (python, the lowering
    workers, ninja, nvcc) as soon as it prints a line for which `marker` is true. Returns the output so far."""
    proc = python(f'''
        import sys
        from pathlib import Path
        from tests.cpu.conftest import build_subset
        build_subset(Path({str(root)!r}))
    ''', start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if marker(line):
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    output = ''.join(lines)
    assert proc.returncode == -signal.SIGKILL, f'the build was not killed at {marker!r}:\n{output}'
    time.sleep(0.5)  # let the killed group's last processes go
    return output


@pytest.mark.build
def test_a_build_killed_while_lowering_and_while_compiling_resumes_to_identical_wheels(built, tmp_path, capsys):
    root = tmp_path / 'resumed'
    first = run_until(root, lambda line: line.startswith('[1/6] lowered'))
    assert 'lowering 6 of 6 kernels' in first
    second = run_until(root, lambda line: line.startswith('[1/6] nvcc '))  # the next cubins are under way
    assert 'lowering 5 of 6 kernels' in second or 'lowering 4 of 6 kernels' in second, second
    assert 'nvcc: compiling 6 of 6 cubins' in second, second
    assert not (root / 'dist').exists()  # no wheel, not even a part of one
    build_subset(root)
    third = capsys.readouterr().out
    assert 'lowering: all 6 kernels up to date' in third
    assert 'nvcc: compiling ' in third and 'of 6 cubins' in third
    expected = sorted(p.name for p in (built / 'dist').iterdir())
    assert sorted(p.name for p in (root / 'dist').iterdir()) == expected  # whole wheels, no temporaries
    # The runtime wheel packs the checkout's tile_kernels_aot as it is at the time, so only the wheels that the build
    # makes are compared here (test_build.py's two-build test compares the runtime wheel).
    for name in (n for n in expected if 'runtime' not in n):
        assert (root / 'dist' / name).read_bytes() == (built / 'dist' / name).read_bytes(), name
    for target in ('sm_90a', 'sm_100f'):
        assert (root / 'build' / target / 'manifest.json').read_bytes() == (built / 'build' / target / 'manifest.json').read_bytes()
