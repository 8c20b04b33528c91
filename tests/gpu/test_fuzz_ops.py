"""Every public op fuzzed on the GPU with hypothesis (cases in tests/fuzz_strategies.py).

* A random VALID call (shapes, row strides, storage offsets, dtypes, flags, token counts from 0 to a few thousand)
  equals the package's reference (tile_kernels_aot.reference) on the same inputs: bit for bit where the op is
  bitwise, within the tolerance of the op's own GPU tests otherwise. An op without a reference gives the same bits
  twice on fresh copies of its inputs. A call whose specialisation the installed arch package lacks raises
  SpecNotPrebuiltError, which counts as a refusal by name (hypothesis reports how often, as an event).
* A random INVALID call (one argument mutated: dtype, rank, one dimension, a non-contiguous or offset view, a CPU
  tensor among CUDA ones, an integer out of range or of the wrong type, a bad string or flag) raises TypeError,
  ValueError, SpecNotPrebuiltError or NotImplementedError naming the op, and before any launch of the call: a
  launch followed by an error fails the test. A mutation that leaves the call valid may run. The index checks
  (TILE_KERNELS_AOT_CHECK_INDICES) are on, so that a mutation that puts an index out of range is refused too.

The fast profile (default) runs a few examples per op; TILE_KERNELS_AOT_FUZZ=large runs 1,000 per op and test.
`pytest --hypothesis-show-statistics` shows, per op, how many examples were compared and how many met a
specialisation that is not prebuilt.
"""

from __future__ import annotations

import pytest
import torch

# A GPU host without hypothesis (an optional test dependency) skips this file rather than failing the collection;
# .ci/gpu-run.sh installs it from .whl/ when the wheels are carried there.
pytest.importorskip('hypothesis')

from hypothesis import event, given
from hypothesis import strategies as st

from tests import fuzz_strategies as fz
from tile_kernels_aot import _index_checks, _launch
from tile_kernels_aot.errors import SpecNotPrebuiltError

from .helpers import assert_bitwise_equal, calc_diff

pytestmark = pytest.mark.gpu

GPU_CASES = fz.CASES


def _leaves(value):
    """The tensors and plain values of a result, flattened in order (None kept, so that optional outputs line up)."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def assert_matches(case: fz.Case, actual, expected) -> None:
    if isinstance(expected, str) and expected == fz.EMPTY:
        assert all(t.numel() == 0 for t in _leaves(actual) if isinstance(t, torch.Tensor)), f'{case.name}: an empty input gave a non-empty result'
        return
    got, want = _leaves(actual), _leaves(expected)
    assert len(got) == len(want), f'{case.name}: {len(got)} outputs, the reference has {len(want)}'
    for i, (a, e) in enumerate(zip(got, want)):
        if not isinstance(e, torch.Tensor):
            assert a == e, f'{case.name}: output {i} is {a!r}, the reference gives {e!r}'
            continue
        assert isinstance(a, torch.Tensor), f'{case.name}: output {i} is {type(a).__name__}, not a tensor'
        if case.output_tol and i in case.output_tol:
            torch.testing.assert_close(a, e.to(a.device), **case.output_tol[i], msg=lambda m, i=i: f'{case.name}: output {i}: {m}')
        elif case.exact:
            assert_bitwise_equal(a, e.to(a.device))
        elif case.tol and 'calc_diff' in case.tol:
            assert a.shape == e.shape and a.dtype == e.dtype, (case.name, i, a.shape, e.shape, a.dtype, e.dtype)
            assert calc_diff(a, e.to(a.device)) < case.tol['calc_diff'], f'{case.name}: output {i} differs from the reference'
        else:
            torch.testing.assert_close(a, e.to(a.device), **(case.tol or {}), msg=lambda m, i=i: f'{case.name}: output {i}: {m}')


@pytest.mark.parametrize('case', GPU_CASES, ids=[c.name for c in GPU_CASES])
@fz.fuzz_settings(fast_examples=8)
@given(data=st.data())
def test_valid_call_equals_the_reference(case, data):
    call = data.draw(case.build('cuda', True), label='call')
    keep = call.clone()  # the reference's inputs: the op may write some of its own in place
    try:
        result = call(case.fn)
    except SpecNotPrebuiltError as exc:
        event(f'not prebuilt: {exc.kernel}')
        return
    actual = case.compare(result, call) if case.compare else result
    if case.ref is not None:
        expected = case.ref(keep)
    else:  # no reference: the same bits again from fresh copies of the inputs
        again = keep.clone()
        second = again(case.fn)
        expected = case.compare(second, again) if case.compare else second
    torch.cuda.synchronize()
    assert_matches(case, actual, expected)
    event('compared')


class _Launches:
    """Counts the launches of every loaded kernel (LoadedKernel._launch_all runs after a binary's argument binding)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = _launch.LoadedKernel._launch_all

        def counted(kernel, *args, **kwargs):
            self.count += 1
            return original(kernel, *args, **kwargs)

        monkeypatch.setattr(_launch.LoadedKernel, '_launch_all', counted)


@pytest.fixture
def launches(monkeypatch):
    return _Launches(monkeypatch)


@pytest.fixture
def index_checks():
    """TILE_KERNELS_AOT_CHECK_INDICES on: a mutation that shortens a tensor an index tensor points into (x's rows
    under token_topk_to_pos, a smaller num_groups) then raises ValueError before the launch, where the kernel would
    stop at a device-side assert and end the process's CUDA context."""
    was = _index_checks.enabled
    _index_checks.enable(True)
    yield
    _index_checks.enable(was)


@pytest.mark.parametrize('case', GPU_CASES, ids=[c.name for c in GPU_CASES])
@fz.fuzz_settings(fast_examples=12)
@given(data=st.data())
def test_invalid_call_is_refused_before_a_launch(case, data, launches, index_checks):
    call = data.draw(case.build('cuda', True), label='call')
    path, what, bad, hard = fz.mutate(data.draw, call)
    before = launches.count
    try:
        bad(case.fn)
    except fz.ALLOWED as exc:
        message = str(exc)
        assert fz.named(case, message), f'{case.name} with {path} {what}: the message names none of {fz.names(case)}: {message}'
        assert launches.count == before, f'{case.name} with {path} {what}: refused after {launches.count - before} launch(es): {message}'
        event(f'refused: {type(exc).__name__}')
        return
    except Exception as exc:  # noqa: BLE001 - the property under test: no other error type escapes
        pytest.fail(f'{case.name} with {path} {what}: raised {type(exc).__name__}, not TypeError / ValueError / SpecNotPrebuiltError: {exc}')
    assert not hard, f'{case.name} with {path} {what}: accepted'
    torch.cuda.synchronize()  # an accepted mutation ran: its kernels must finish cleanly
    event('accepted (the mutation left the call valid)')
