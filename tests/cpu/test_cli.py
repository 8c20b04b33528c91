"""`python -m build_tools` as a user meets it: flags, arch names, progress, where the output goes, and the one-line
errors for a missing tool. No lowering and no nvcc: the build steps are replaced or fed tiny inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from build_tools import __main__ as cli
from build_tools import build as build_module
from build_tools import ninja
from build_tools.util import BuildError, Progress, duration
from kernel_src.decl import Arch


def usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        cli.parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize('argv, message', [
    (['--arch', 'sm90', '--no-wheel'], 'unrecognized arguments: --no-wheel'),  # a prefix of --no-wheels
    (['--arch', 'sm90', '--partial'], 'unrecognized arguments: --partial'),
    (['--arc', 'sm90'], 'the following arguments are required: --arch'),
])
def test_abbreviated_flags_are_refused(capsys, argv, message):
    assert message in usage_error(capsys, argv)


def test_full_flags_still_parse():
    args = cli.parse_args(['--arch', 'sm90', '--no-wheels', '--partial-wheels', '--jobs', '3'])
    assert not args.wheels and args.partial_wheels and args.jobs == 3


@pytest.mark.parametrize('name, targets', [
    ('sm90', ['sm_90a']), ('sm90a', ['sm_90a']), ('sm_90a', ['sm_90a']), ('SM90A', ['sm_90a']), ('Sm_90A', ['sm_90a']),
    ('sm100', ['sm_100f']), ('sm100f', ['sm_100f']), ('sm_100f', ['sm_100f']), ('SM_100F', ['sm_100f']),
    ('all', ['sm_90a', 'sm_100f']), ('ALL', ['sm_90a', 'sm_100f']),
    ('sm_100f,sm90', ['sm_100f', 'sm_90a']), ('sm90, sm90a', ['sm_90a']),
])
def test_every_spelling_of_an_arch_is_accepted(name, targets):
    assert [a.target for a in cli.parse_args(['--arch', name, '--no-wheels']).archs] == targets


@pytest.mark.parametrize('name', ['sm80', 'sm_90', 'sm100a', 'hopper', ','])
def test_unknown_arch_lists_the_accepted_names(capsys, name):
    err = usage_error(capsys, ['--arch', name])
    assert 'accepted (case-insensitive, comma-separated): sm90, sm90a, sm_90a, sm100, sm100f, sm_100f, all' in err


def test_progress_reports_elapsed_time_and_an_estimate():
    now = [100.0]
    progress = Progress(5, clock=lambda: now[0])
    now[0] = 110.0
    assert progress.status(1) == '10 s, about 40 s left'
    now[0] = 400.0
    assert progress.status(4) == '5.0 min, about 75 s left'
    assert progress.status(5) == '5.0 min'
    assert progress.summary('cubin', '2 jobs') == '5 cubins in 5.0 min (60.0 s per cubin on this machine with 2 jobs)'
    assert duration(119.4) == '119 s' and duration(870) == '14.5 min'


def fake_compiles(root: Path, names: list[str]) -> list[Path]:
    """A build.ninja whose rule copies a file: ninja's own progress and incremental logic, no nvcc."""
    lines = ['rule nvcc', '  command = cp $in $out', '  description = nvcc $out', '']
    for name in names:
        (root / f'{name}.cu').write_text(name)
        lines.append(f'build {name}.cubin: nvcc {name}.cu')
    (root / 'build.ninja').write_text('\n'.join(lines) + '\n')
    return [root / f'{name}.cubin' for name in names]


def test_nvcc_phase_prints_a_heading_progress_and_the_time_per_cubin(tmp_path, capsys):
    targets = fake_compiles(tmp_path, ['a', 'b', 'c'])
    ninja.run_ninja(tmp_path, 2, targets)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == 'nvcc: compiling 3 of 3 cubins with 2 jobs'
    assert [line.split(' nvcc ')[0] for line in lines[1:4]] == ['[1/3]', '[2/3]', '[3/3]']
    assert 'left)' in lines[1] and lines[3].endswith(' s)')  # an estimate while cubins remain, the time at the end
    assert lines[4].startswith('nvcc: 3 cubins in ') and lines[4].endswith(' s per cubin on this machine with 2 jobs)')

    (tmp_path / 'b.cu').write_text('changed')
    ninja.run_ninja(tmp_path, 1, targets)
    assert capsys.readouterr().out.splitlines()[0] == 'nvcc: compiling 1 of 3 cubins with 1 job'
    ninja.run_ninja(tmp_path, 2, targets)
    assert capsys.readouterr().out == 'nvcc: all 3 cubins up to date\n'


def test_no_wheels_says_where_the_binaries_are(tmp_path, monkeypatch, capsys):
    manifests = {t: tmp_path / 'build' / t / 'manifest.json' for t in ('sm_90a', 'sm_100f')}
    monkeypatch.setattr(build_module, 'plan', lambda args: [])
    monkeypatch.setattr(build_module, 'toolchain', lambda: {'tilelang': '0.1.15', 'nvcc': '13.0.88'})
    monkeypatch.setattr(build_module, '_lower_stale', lambda *a: None)
    monkeypatch.setattr(build_module.ninja, 'write_ninja', lambda *a: None)
    monkeypatch.setattr(build_module.ninja, 'run_ninja', lambda *a: None)
    monkeypatch.setattr(build_module, 'write_manifests', lambda *a: manifests)
    args = cli.parse_args(['--arch', 'all', '--no-wheels', '--build-dir', str(tmp_path / 'build')])
    assert build_module.build(args) == []
    out = capsys.readouterr().out
    folders = f"{tmp_path / 'build' / 'sm_100f'}:{tmp_path / 'build' / 'sm_90a'}"
    assert (f"no wheels (--no-wheels); manifest.json, cubins/ and sources/ of each target are in:\n"
            f"  {tmp_path / 'build' / 'sm_100f'}\n  {tmp_path / 'build' / 'sm_90a'}\n"
            f"to load them: export TILE_KERNELS_AOT_KERNEL_DIRS={folders}\n") in out


def run_main(capsys, argv: list[str]) -> tuple[int, str]:
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.err


@pytest.fixture
def no_build(monkeypatch):
    """main() must stop before the build when a tool is missing."""
    monkeypatch.setattr(cli, 'build', lambda args: pytest.fail('the build ran without its tools'))


@pytest.mark.parametrize('module, purpose', [('ninja', 'it drives nvcc'), ('tilelang', 'it lowers the kernels'),
                                             ('setuptools', 'it packs the wheels')])
def test_a_missing_build_module_is_one_line_naming_the_install(capsys, monkeypatch, no_build, module, purpose):
    monkeypatch.setitem(sys.modules, module, None)  # find_spec answers None, import raises ModuleNotFoundError
    code, err = run_main(capsys, ['--arch', 'sm90'])
    assert code == 1
    assert err == f"python -m build_tools: the Python package '{module}' is missing ({purpose}): pip install -e '.[build]'\n"


def test_setuptools_is_needed_for_wheels_only(monkeypatch):
    monkeypatch.setitem(sys.modules, 'setuptools', None)
    assert cli.missing_tools(wheels=False) is None
    assert 'setuptools' in cli.missing_tools(wheels=True)


def test_missing_nvcc_is_one_line(capsys, monkeypatch, tmp_path, no_build):
    monkeypatch.setattr(ninja.shutil, 'which', lambda name: None)
    monkeypatch.setenv('CUDA_HOME', str(tmp_path))
    code, err = run_main(capsys, ['--arch', 'sm90'])
    assert code == 1
    assert err == 'python -m build_tools: nvcc not found: put the CUDA toolkit (13.0 or newer) on PATH or set CUDA_HOME\n'


def test_a_build_module_lost_during_the_build_is_one_line(capsys, monkeypatch):
    def build(args):
        raise ModuleNotFoundError("No module named 'tilelang'", name='tilelang')

    monkeypatch.setattr(cli, 'missing_tools', lambda wheels: None)
    monkeypatch.setattr(cli, 'build', build)
    code, err = run_main(capsys, ['--arch', 'sm90'])
    assert code == 1 and err == "python -m build_tools: the Python package 'tilelang' is missing: pip install -e '.[build]'\n"


def test_other_missing_modules_keep_their_traceback(monkeypatch):
    def build(args):
        raise ModuleNotFoundError("No module named 'kernel_src.nope'", name='kernel_src.nope')

    monkeypatch.setattr(cli, 'missing_tools', lambda wheels: None)
    monkeypatch.setattr(cli, 'build', build)
    with pytest.raises(ModuleNotFoundError):
        cli.main(['--arch', 'sm90'])


def test_ninja_binary_without_the_module_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, 'ninja', None)
    with pytest.raises(BuildError, match=r"the Python package 'ninja' is missing: pip install -e '\.\[build\]'"):
        ninja.ninja_binary()


def test_build_failure_is_one_line_plus_the_reason(capsys, monkeypatch):
    monkeypatch.setattr(cli, 'missing_tools', lambda wheels: None)
    monkeypatch.setattr(cli, 'build', lambda args: (_ for _ in ()).throw(BuildError('no kernel matches nope.*')))
    code, err = run_main(capsys, ['--arch', 'sm90', '--kernels', 'nope.*'])
    assert code == 1 and err == 'build failed: no kernel matches nope.*\n'


def test_arch_names_come_from_the_declared_arches():
    assert cli.arch_names(Arch('sm_90a')) == ('sm90', 'sm90a', 'sm_90a')
