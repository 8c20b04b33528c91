"""TILE_KERNELS_AOT_RECORD_MISSES: a spec a call misses lands in a file, once, in the form `python -m build_tools
--specs FILE` reads; a build from that file gives a binary the loader then finds. No GPU: the device is faked."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing

import pytest

from tile_kernels_aot import _misses, _select
from tile_kernels_aot.errors import SpecNotPrebuiltError

from .test_select import fake_device  # noqa: F401  (a fixture)

MISSED = {'num_experts': 200, 'num_topk': 6}


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_miss_is_recorded_once(fake_device, tmp_path, monkeypatch):  # noqa: F811
    misses = tmp_path / 'misses.jsonl'
    monkeypatch.setenv(_misses.RECORD_MISSES_ENV, str(misses))
    fake_device[0] = ('NVIDIA H200', (9, 0))
    for _ in range(3):
        with pytest.raises(SpecNotPrebuiltError):
            _select.find_kernel('moe.topk_gate', MISSED, 0)
    _select.find_kernel('moe.topk_gate', {'num_experts': 256, 'num_topk': 8}, 0)  # prebuilt: nothing recorded
    assert misses.read_text() == '{"kernel": "moe.topk_gate", "params": {"num_experts": 200, "num_topk": 6}}\n'


def test_nothing_is_recorded_without_the_variable(fake_device, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.delenv(_misses.RECORD_MISSES_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    fake_device[0] = ('NVIDIA H200', (9, 0))
    with pytest.raises(SpecNotPrebuiltError):
        _select.find_kernel('moe.topk_gate', MISSED, 0)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_file_warns_and_the_error_still_comes(fake_device, tmp_path, monkeypatch):  # noqa: F811
    misses = tmp_path / 'no-such-folder' / 'misses.jsonl'
    monkeypatch.setenv(_misses.RECORD_MISSES_ENV, str(misses))
    fake_device[0] = ('NVIDIA H200', (9, 0))
    with pytest.warns(RuntimeWarning, match=r'TILE_KERNELS_AOT_RECORD_MISSES=.*no-such-folder/misses.jsonl: cannot record '
                                            r'the missing spec .*"num_experts": 200.*No such file or directory'):
        with pytest.raises(SpecNotPrebuiltError, match='moe.topk_gate has no prebuilt sm_90a binary'):
            _select.find_kernel('moe.topk_gate', MISSED, 0)


def test_the_same_spec_in_another_key_order_is_a_duplicate(tmp_path, monkeypatch):
    misses = tmp_path / 'misses.jsonl'
    misses.write_text('{"kernel": "moe.topk_gate", "params": {"num_topk": 6, "num_experts": 200}}')  # by hand, no newline
    monkeypatch.setenv(_misses.RECORD_MISSES_ENV, str(misses))
    _misses.record_miss('moe.topk_gate', MISSED)
    _misses.record_miss('moe.topk_gate', {'num_experts': 200, 'num_topk': 7})
    assert lines(misses) == [{'kernel': 'moe.topk_gate', 'params': {'num_topk': 6, 'num_experts': 200}},
                             {'kernel': 'moe.topk_gate', 'params': {'num_experts': 200, 'num_topk': 7}}]


def _record_many(path: str, worker: int, barrier) -> None:
    import os

    os.environ[_misses.RECORD_MISSES_ENV] = path
    barrier.wait()
    for i in range(40):
        _misses.record_miss('moe.topk_gate', {'num_experts': 64 + i, 'num_topk': 8})  # every worker: the same 40
        _misses.record_miss('moe.topk_gate', {'num_experts': 512 + worker, 'num_topk': i % 8 + 1})  # its own


def test_processes_recording_at_once_neither_lose_nor_repeat_a_spec(tmp_path):
    misses = tmp_path / 'misses.jsonl'
    workers = 4
    context = multiprocessing.get_context('fork')
    barrier = context.Manager().Barrier(workers)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for done in [pool.submit(_record_many, str(misses), w, barrier) for w in range(workers)]:
            done.result(timeout=120)
    recorded = [json.dumps(item, sort_keys=True) for item in lines(misses)]
    expected = {json.dumps({'kernel': 'moe.topk_gate', 'params': {'num_experts': 64 + i, 'num_topk': 8}}, sort_keys=True)
                for i in range(40)}
    expected |= {json.dumps({'kernel': 'moe.topk_gate', 'params': {'num_experts': 512 + w, 'num_topk': k}}, sort_keys=True)
                 for w in range(workers) for k in range(1, 9)}
    assert len(recorded) == len(set(recorded)) and set(recorded) == expected


# -- the build reads it ---------------------------------------------------------------------------------------------


def read_specs(tmp_path, text: str) -> dict:
    from build_tools.build import read_specs_file, registry

    path = tmp_path / 'specs'
    path.write_text(text)
    return read_specs_file(path, registry('kernel_src.registry'))


def test_build_reads_json_lines_and_the_json_list(tmp_path):
    one = {'kernel': 'moe.topk_gate', 'params': MISSED}
    two = {'kernel': 'moe.topk_gate', 'params': {'num_experts': 200, 'num_topk': 7}}
    both = {'moe.topk_gate': [MISSED, two['params']]}
    assert read_specs(tmp_path, f'{json.dumps(one)}\n\n{json.dumps(two)}\n') == both
    assert read_specs(tmp_path, json.dumps([one, two], indent=2)) == both
    assert read_specs(tmp_path, json.dumps(one, indent=2)) == {'moe.topk_gate': [MISSED]}
    assert read_specs(tmp_path, '\n') == {}


@pytest.mark.parametrize('text, message', [
    ('{"kernel": "moe.topk_gate", "params": {"num_experts": 200, "num_topk": 6}}\n{"kernel": "moe.topk_gate"\n',
     r'line 2: Expecting .*one such object a line'),
    ('{"kernel": "moe.topk_gate", "params": {"num_experts": 200, "num_topk": 6}}\n[1]\n', 'line 2: expected a JSON list'),
    ('\n{"kernel": "moe.nope", "params": {}}\n', "line 2: unknown kernel 'moe.nope'"),
    ('{"kernel": "moe.topk_gate", "params": [200, 6]}', r'line 1 \(moe.topk_gate\): "params" must be an object'),
    ('{"kernel": "moe.topk_gate", "params": {"num_experts": 8, "num_topk": 9}}\n{}\n', r'line 1 \(moe.topk_gate\): num_topk must be in'),
    ('7', 'expected a JSON list'),
])
def test_build_names_the_bad_line(tmp_path, text, message):
    from build_tools.util import BuildError

    with pytest.raises(BuildError, match=message):
        read_specs(tmp_path, text)


@pytest.mark.build
def test_from_a_miss_to_a_rebuilt_spec_the_loader_finds(fake_device, tmp_path, monkeypatch):  # noqa: F811
    """The whole loop: a call misses, the file names the spec, `python -m build_tools --specs FILE` builds it, and the
    same call then finds a binary."""
    from build_tools import __main__ as build_cli

    misses = tmp_path / 'misses.jsonl'
    monkeypatch.setenv(_misses.RECORD_MISSES_ENV, str(misses))
    fake_device[0] = ('NVIDIA H200', (9, 0))
    with pytest.raises(SpecNotPrebuiltError):
        _select.find_kernel('moe.topk_gate', MISSED, 0)
    assert build_cli.main(['--arch', 'sm90', '--specs', str(misses), '--only-specs', '--no-wheels', '--jobs', '1',
                           '--build-dir', str(tmp_path / 'build')]) == 0
    monkeypatch.setenv(_select.KERNEL_DIRS_ENV, str(tmp_path / 'build' / 'sm_90a'))
    _select.reset()
    kernel = _select.find_kernel('moe.topk_gate', MISSED, 0)
    assert kernel.entry.params == MISSED and kernel.entry.target == 'sm_90a'
    assert len(kernel.image()) > 1000  # sha256 and ELF arch verified on read
