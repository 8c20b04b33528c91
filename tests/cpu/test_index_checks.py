"""The helpers of TILE_KERNELS_AOT_CHECK_INDICES on CPU tensors, and how the flag is set (the ops that call them
need a GPU: tests/gpu/test_index_checks.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tile_kernels_aot import _index_checks
from tile_kernels_aot._index_checks import CHECK_ENV, below, finite, fused_positions_fit, within

PACKAGE = Path(__file__).resolve().parents[2] / 'tile_kernels_aot'


@pytest.mark.parametrize('dtype', [torch.int32, torch.int64])
def test_below_passes_negative_entries_and_names_the_first_bad_position(dtype):
    t = torch.tensor([[0, -1, 5], [-7, 7, 8], [9, 2, 3]], dtype=dtype)
    below('op', 'idx', t, 10, what='num_groups (10)')  # 9 is the largest, negatives are skipped
    with pytest.raises(ValueError) as info:
        below('op', 'idx', t, 8, what='num_groups (8)')
    assert str(info.value) == (f'op: idx[1, 2] = 8 breaks the rule that entries are below num_groups (8) (negative entries are '
                               f'skipped) (checked before the launch: {CHECK_ENV})')


def test_below_in_a_non_contiguous_view_names_the_view_s_position():
    base = torch.zeros(4, 6, dtype=torch.int32)
    base[2, 4] = 100
    view = base[:, ::2]  # [4, 3]; base[2, 4] is view[2, 2]
    with pytest.raises(ValueError, match=r'idx\[2, 2\] = 100 breaks'):
        below('op', 'idx', view, 10, what='10')


def test_int64_entries_of_any_size():
    """The kernels narrow an int64 index to int32 without wrapping: every negative one is padding, and a huge
    positive one is past the bound, however it would wrap."""
    below('op', 'idx', torch.tensor([[1, -2**31], [-2**40, 2]], dtype=torch.int64), 4, what='4')
    huge = torch.tensor([2**32 + 1], dtype=torch.int64)  # 1 if the kernel wrapped it
    with pytest.raises(ValueError, match=r'idx\[0\] = 4294967297 breaks the rule that entries are below 4'):
        below('op', 'idx', huge, 4, what='4')


def test_finite_names_the_first_nan_or_infinity():
    scores = torch.zeros(3, 4)
    scores[2, 1] = float('inf')
    scores[1, 3] = float('nan')
    with pytest.raises(ValueError, match=r'^op: scores\[1, 3\] = nan breaks the rule that gating inputs are finite'):
        finite('op', 'scores', scores)
    finite('op', 'scores', scores, rows=torch.tensor([True, False, False]))
    with pytest.raises(ValueError, match=r'scores\[2, 1\] = inf breaks'):
        finite('op', 'scores', scores, rows=torch.tensor([True, False, True]))
    finite('op', 'scores', scores, rows=torch.tensor([True, False, True]), infinities=True)
    with pytest.raises(ValueError, match=r'scores\[1, 3\] = nan breaks the rule that scores are not NaN'):
        finite('op', 'scores', scores, infinities=True)


def test_empty_tensors_pass():
    below('op', 'idx', torch.empty(0, 8, dtype=torch.int64), 1, what='1')
    within('op', 'idx', torch.empty(0, dtype=torch.int32), 1, 2, what='x')


def test_within_both_bounds_and_selected_rows():
    counts = torch.tensor([1, 2, 3, 0], dtype=torch.int32)
    with pytest.raises(ValueError, match=r'op: logical_count\[3\] = 0 breaks the rule that counts are in \[1, 3\]'):
        within('op', 'logical_count', counts, 1, 4, what='counts are in [1, 3]')
    with pytest.raises(ValueError, match=r'logical_count\[2\] = 3 breaks'):
        within('op', 'logical_count', counts, 1, 3, what='counts are in [1, 2]')
    idx = torch.tensor([[0, 1], [-1, 99], [2, 3]], dtype=torch.int64)
    within('op', 'unmapped_topk_idx', idx, 0, 4, what='ids', rows=torch.tensor([True, False, True]))
    with pytest.raises(ValueError, match=r'unmapped_topk_idx\[1, 0\] = -1 breaks the rule that ids'):
        within('op', 'unmapped_topk_idx', idx, 0, 4, what='ids', rows=torch.tensor([True, True, False]))


def test_fused_positions_fit():
    topk_idx = torch.tensor([[0, 1], [0, -1], [3, 0]], dtype=torch.int64)  # expert 0: 3 pairs, 1: 1, 3: 1
    fused_positions_fit('op', topk_idx, 4, 4, 12)  # 4 + 4 + 0 + 4
    with pytest.raises(ValueError, match=r'op: num_expanded_tokens = 11 is too small for this routing, whose segments aligned to 4 '
                                         r'take 12 positions'):
        fused_positions_fit('op', topk_idx, 4, 4, 11)
    fused_positions_fit('op', topk_idx, 4, 1, 5)


def run_python(code: str, env_value: str | None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != CHECK_ENV}
    if env_value is not None:
        env[CHECK_ENV] = env_value
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)


@pytest.mark.parametrize('value, enabled', [(None, False), ('0', False), ('', False), ('1', True)])
def test_the_variable_is_read_at_import(value, enabled):
    result = run_python('from tile_kernels_aot import _index_checks; print(_index_checks.enabled)', value)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(enabled)


def test_a_bad_value_is_refused_at_import():
    result = run_python('import tile_kernels_aot.moe', 'yes')
    assert result.returncode != 0 and f"{CHECK_ENV} must be 0 or 1, got 'yes'" in result.stderr


def test_enable_switches_the_flag():
    before = _index_checks.enabled
    try:
        _index_checks.enable(True)
        assert _index_checks.enabled is True
        _index_checks.enable(False)
        assert _index_checks.enabled is False
        with pytest.raises(TypeError):
            _index_checks.enable(1)
    finally:
        _index_checks.enable(before)


# Every op the check covers, with the index arguments it checks: each call of a helper sits under `if
# _index_checks.enabled` (or `if ... and _index_checks.enabled`), so that with the checks off the op pays one flag read.
COVERED = {
    'moe.py': {'group_count', 'aux_fi', 'inplace_unique_group_indices', 'mask_indices_by_tp', '_fused_mapping', 'expand_to_fused',
               'expand_to_fused_with_sf', 'reduce_fused', 'top2_sum_gate', 'topk_gate', 'topk_sum_and_topk_group_idx'},
    'quant/per_channel.py': {'_per_channel_cast'},
    'quant/swiglu.py': {'swiglu_forward_and_per_token_cast', 'swiglu_backward_and_per_token_cast'},
    'engram.py': {'engram_hash'},
}


@pytest.mark.parametrize('module', sorted(COVERED))
def test_every_covered_op_calls_the_helpers_only_under_the_flag(module):
    tree = ast.parse((PACKAGE / module).read_text())
    guarded: set[int] = set()  # ids of the calls inside an `if` that tests _index_checks.enabled
    checking: set[str] = set()  # the functions with such an `if`
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(fn):
            if isinstance(node, ast.If) and '_index_checks.enabled' in ast.unparse(node.test):
                guarded |= {id(c) for statement in node.body for c in ast.walk(statement) if isinstance(c, ast.Call)}
                checking.add(fn.name)
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name != '_check_positions'):
        for call in (c for c in ast.walk(fn) if isinstance(c, ast.Call)):
            name = ast.unparse(call.func)
            if name.startswith('_index_checks.') or name == '_check_positions':
                assert id(call) in guarded, f'{module}: {fn.name} calls {name} outside the flag test'
    assert COVERED[module] <= checking, COVERED[module] - checking
