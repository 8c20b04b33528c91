"""Every public op's argument checks, fuzzed on CPU with hypothesis (cases in tests/fuzz_strategies.py).

* A random VALID call with CPU tensors raises exactly the ValueError "<op>: <arg> must be on a CUDA device": every
  other check accepted it, and the device check is the last before a kernel is chosen.
* The same call made INVALID by one random mutation (a dtype, a rank, one dimension's size, a non-contiguous or
  offset view, a tensor on the meta device, a non-tensor, an integer out of range or of the wrong type, an unknown
  format string, a wrong flag) raises TypeError, ValueError, SpecNotPrebuiltError or NotImplementedError naming the
  op, never anything else; a mutation that can never be valid (a float64 or complex tensor, a non-tensor, a string
  for an int) is refused before the device check, except in a composite (another argument's device check may come
  first) and for the arguments an op checks after it (Case.late: bounds from the arch package, or unused).
* Nothing is ever launched: the loader's launch, its module load, the driver and the package lookup fail the test if
  reached (LaunchReached derives from BaseException, so no op's `except Exception` can swallow it).

The fast profile (default) runs a few examples per op; TILE_KERNELS_AOT_FUZZ=large runs 1,000 per op and test.
"""

from __future__ import annotations

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from tests import fuzz_strategies as fz
from tile_kernels_aot import _driver, _launch, _select

ALLOWED = fz.ALLOWED
DEVICE_ERROR = fz.DEVICE_ERROR


class LaunchReached(BaseException):
    """Raised by the patched loader, driver and package lookup: an op got past its checks on a CPU tensor."""


def _refuse(*args, **kwargs):
    raise LaunchReached('a fuzzed call reached the loader, the driver or a launch')


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    monkeypatch.setattr(_launch.LoadedKernel, '__call__', _refuse)
    monkeypatch.setattr(_launch.LoadedKernel, 'functions', _refuse)
    monkeypatch.setattr(_launch.LoadedKernel, '_load', _refuse)
    monkeypatch.setattr(_driver, 'driver', _refuse)
    monkeypatch.setattr(_driver, '_load', _refuse)
    monkeypatch.setattr(_select, 'package_for_device', _refuse)
    monkeypatch.setattr(_select, 'installed_packages', _refuse)


# --- coverage ---------------------------------------------------------------------------------------------------------

def test_every_public_op_has_a_case():
    covered = {c.fn for c in fz.CASES}
    missing = []
    for module_name, module in fz.COVERED_MODULES.items():
        public = getattr(module, '__all__', None) or [n for n in dir(module) if not n.startswith('_')]
        for name in public:
            fn = getattr(module, name)
            if name in fz.NOT_OPS[module_name] or not callable(fn) or not getattr(fn, '__module__', '').startswith('tile_kernels_aot'):
                continue
            if fn not in covered:
                missing.append(f'{module_name}.{name}')
    assert not missing, f'public ops without a fuzz case: {missing}'


# --- valid calls --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case', fz.CASES, ids=fz.CASE_IDS)
@fz.fuzz_settings()
@given(data=st.data())
def test_valid_call_stops_at_the_device_check(case, data):
    call = data.draw(case.build('cpu', False), label='call')
    if case.runs_anywhere:
        call(case.fn)  # pure PyTorch: a CPU tensor is served
        return
    with pytest.raises(ValueError) as info:
        call(case.fn)
    message = str(info.value)
    assert DEVICE_ERROR in message, f'{case.name}: a valid call was refused before the device check: {message}'
    assert fz.named(case, message), f'{case.name}: the message names none of {fz.names(case)}: {message}'


# --- invalid calls ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('case', fz.CASES, ids=fz.CASE_IDS)
@fz.fuzz_settings(fast_examples=12)
@given(data=st.data())
def test_invalid_call_is_refused_by_name(case, data):
    call = data.draw(case.build('cpu', False), label='call')
    path, what, bad, hard = fz.mutate(data.draw, call)
    if not fz.hard_for(case, path, hard):
        hard = False
    event(f'{what.split(" ")[0]}')
    try:
        bad(case.fn)
    except ALLOWED as exc:
        message = str(exc)
        assert fz.named(case, message), f'{case.name} with {path} {what}: the message names none of {fz.names(case)}: {message}'
        if hard:
            assert DEVICE_ERROR not in message, f'{case.name} with {path} {what}: only the device check refused it: {message}'
        event('refused at the device check' if DEVICE_ERROR in message else f'refused: {type(exc).__name__}')
        return
    except LaunchReached:
        raise
    except Exception as exc:  # noqa: BLE001 - the property under test: no other error type escapes
        pytest.fail(f'{case.name} with {path} {what}: raised {type(exc).__name__}, not TypeError / ValueError / SpecNotPrebuiltError: {exc}')
    assert case.runs_anywhere and not hard, f'{case.name} with {path} {what}: accepted'
