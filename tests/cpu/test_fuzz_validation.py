"""Every public op's argument checks, fuzzed on CPU with hypothesis (cases in tests/fuzz_strategies.py).

* A random VALID call with CPU tensors raises exactly the ValueError "<op>: <arg> must be on a CUDA device": every
  other check accepted it, and the device check is the last before a kernel is chosen.
* The same call made INVALID by one random mutation (a dtype, a rank, one dimension's size, a non-contiguous or
  offset view, a tensor on the meta device, a non-tensor, an integer out of range or of the wrong type, an unknown
  format string, a wrong flag) raises TypeError, ValueError, SpecNotPrebuiltError or NotImplementedError naming the
  op, never anything else; a mutation that can never be valid (a float64 or complex tensor, a non-tensor, a string
  for an int) is refused before the device check.
* Nothing is ever launched: the loader's launch, its module load, the driver and the package lookup fail the test if
  reached (LaunchReached derives from BaseException, so no op's `except Exception` can swallow it).

The fast profile (default) runs a few examples per op; TILE_KERNELS_AOT_FUZZ=large runs 1,000 per op and test.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from tests import fuzz_strategies as fz
from tile_kernels_aot import _driver, _launch, _select
from tile_kernels_aot.errors import SpecNotPrebuiltError

ALLOWED = (TypeError, ValueError, SpecNotPrebuiltError, NotImplementedError)
DEVICE_ERROR = 'must be on a CUDA device'


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


def _names(case: fz.Case) -> str:
    return ' or '.join(case.names)


def _named(case: fz.Case, message: str) -> bool:
    first = message.split('\n')[0]
    return any(f'{n}{mark}' in first for n in case.names for mark in (':', '(', '['))


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
    assert _named(case, message), f'{case.name}: the message names none of {_names(case)}: {message}'


# --- invalid calls ------------------------------------------------------------------------------------------------------

# Dtypes no op takes: a mutation to one of them must be refused before the device check.
NEVER_TAKEN = (torch.float64, torch.complex64)
OTHER_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int8, torch.uint8, torch.int16, torch.int32,
                torch.int64, torch.bool, *NEVER_TAKEN)


def _slots(value, path=()):
    """(path, value) of every argument leaf that a mutation may change: tensors, ints, bools, floats, strings and
    tuples of ints, inside the (data, sf) tuples and the tensor lists too."""
    if isinstance(value, torch.Tensor) or isinstance(value, (bool, int, float, str)):
        yield path, value
    elif isinstance(value, tuple) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _slots(v, (*path, i))


def _call_slots(call: fz.Call):
    for i, a in enumerate(call.args):
        yield from _slots(a, ('args', i))
    for k, a in call.kwargs.items():
        yield from _slots(a, ('kwargs', k))


def _replace(call: fz.Call, path, new) -> fz.Call:
    """The call with the leaf at `path` replaced (containers copied, the original call untouched)."""

    def put(container, rest):
        head, tail = rest[0], rest[1:]
        value = new if not tail else put(container[head], tail)
        if isinstance(container, dict):
            return {**container, head: value}
        items = list(container)
        items[head] = value
        return items if isinstance(container, list) else tuple(items)

    if path[0] == 'args':
        return fz.Call(put(call.args, path[1:]), dict(call.kwargs), call.note)
    return fz.Call(list(call.args), put(call.kwargs, path[1:]), call.note)


def _retype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float8_e4m3fn:
        return t.float().to(dtype)
    return t.to(dtype)


def _mutations_of_tensor(draw, t: torch.Tensor):
    """(kind, new value, hard): hard when the result can never be a valid argument."""
    kind = draw(st.sampled_from(['dtype', 'not_tensor', 'rank_up', 'rank_down', 'shape', 'stride', 'offset', 'meta']))
    if kind == 'dtype':
        dtype = draw(st.sampled_from([d for d in OTHER_DTYPES if d != t.dtype]))
        return f'dtype {dtype}', _retype(t, dtype), dtype in NEVER_TAKEN
    if kind == 'not_tensor':
        return 'not a tensor', draw(st.sampled_from([[1.0], 3, 'x', (t,)])), True
    if kind == 'rank_up':
        return 'one more dim', t.unsqueeze(draw(st.integers(0, t.dim()))), False
    if kind == 'rank_down':
        if t.dim() == 1:
            return 'one dim fewer', t[0] if t.numel() else torch.zeros((), dtype=t.dtype), False
        return 'one dim fewer', t.reshape(-1), False
    if kind == 'shape':
        if t.dim() == 0:
            return 'shape', t.reshape(1), False
        dim = draw(st.integers(0, t.dim() - 1))
        if t.shape[dim] > 0 and draw(st.booleans()):
            return f'dim {dim} shorter', t.narrow(dim, 0, t.shape[dim] - 1), False
        extra = torch.zeros_like(t.narrow(dim, 0, 1) if t.shape[dim] else t.new_zeros(*[1 if d == dim else n for d, n in enumerate(t.shape)]))
        return f'dim {dim} longer', torch.cat([t, extra.to(t.dtype)], dim), False
    if kind == 'stride':
        if t.dim() >= 2 and draw(st.booleans()):
            return 'transposed', t.transpose(-1, -2), False
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype) if t.dim() else torch.zeros(2, dtype=t.dtype)
        view = wide[..., ::2] if t.dim() else wide[:1].reshape(())
        return 'every other element', view.copy_(t) if t.dim() else view, False
    if kind == 'offset':
        flat = torch.zeros(t.numel() + 1, dtype=t.dtype)
        return 'one element off', flat[1:].view(t.shape).copy_(t.contiguous()) if t.numel() else flat[1:].view(t.shape), False
    return 'meta device', t.to('meta'), False


def _mutations_of_int(draw, value: int):
    kind = draw(st.sampled_from(['range', 'float', 'str', 'none', 'bool']))
    if kind == 'range':
        return 'out of range', draw(st.sampled_from([-1, 0, value + 1, value - 1, 2**31, 2**63, -2**40])), False
    if kind == 'float':
        return 'a float', float(value) + 0.5, True
    if kind == 'str':
        return 'a string', str(value), True
    if kind == 'bool':
        return 'a bool', draw(st.booleans()), False
    return 'None', None, False


def _mutate(draw, call: fz.Call):
    slots = list(_call_slots(call))
    path, value = draw(st.sampled_from(slots))
    if isinstance(value, torch.Tensor):
        what, new, hard = _mutations_of_tensor(draw, value)
    elif isinstance(value, bool):
        what, new, hard = 'bool as ' + repr(x := draw(st.sampled_from([1, 'yes', None]))), x, False
    elif isinstance(value, int):
        what, new, hard = _mutations_of_int(draw, value)
    elif isinstance(value, float):
        new = draw(st.sampled_from([float('nan'), float('inf'), -1.0, 'x', None]))
        what, hard = f'float as {new!r}', False
    elif isinstance(value, str):
        new = draw(st.sampled_from(['bogus', '', value.upper() + '_', 3]))
        what, hard = f'string as {new!r}', new not in ('',)
    else:  # a tuple of ints: a block size
        new = draw(st.sampled_from([(0, 0), (3, 5), value[:1], (*value, 1), (-value[0], value[-1]), [*value]]))
        what, hard = f'block as {new!r}', False
    return path, what, _replace(call, path, new), hard


# A string argument whose mutation may stay valid ('' is reduce_fused's default fp8_format).
_SOFT_STRINGS = {'fp8_format'}


@pytest.mark.parametrize('case', fz.CASES, ids=fz.CASE_IDS)
@fz.fuzz_settings(fast_examples=12)
@given(data=st.data())
def test_invalid_call_is_refused_by_name(case, data):
    call = data.draw(case.build('cpu', False), label='call')
    path, what, bad, hard = _mutate(data.draw, call)
    if path[-1] in _SOFT_STRINGS or case.composite or path[1] in case.late:
        hard = False
    event(f'{what.split(" ")[0]}')
    try:
        bad(case.fn)
    except ALLOWED as exc:
        message = str(exc)
        assert _named(case, message), f'{case.name} with {path} {what}: the message names none of {_names(case)}: {message}'
        if hard:
            assert DEVICE_ERROR not in message, f'{case.name} with {path} {what}: only the device check refused it: {message}'
        event('refused at the device check' if DEVICE_ERROR in message else f'refused: {type(exc).__name__}')
        return
    except LaunchReached:
        raise
    except Exception as exc:  # noqa: BLE001 - the property under test: no other error type escapes
        pytest.fail(f'{case.name} with {path} {what}: raised {type(exc).__name__}, not TypeError / ValueError / SpecNotPrebuiltError: {exc}')
    assert case.runs_anywhere and not hard, f'{case.name} with {path} {what}: accepted'
