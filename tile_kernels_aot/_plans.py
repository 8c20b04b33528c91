"""Launch plans: an op's repeated calls with one argument signature replay what a checked call did on the device.

On the host an op checks its arguments, chooses a binary, derives the launch arguments (sizes, grids, magic
numbers), then allocates, runs any torch ops it needs and launches. The first part depends only on the call's
*signature*: each tensor's dtype, shape, strides, device and the low bits of its data pointer (every alignment an op
or a manifest asks for is a power of two up to 256 bytes), each other argument's type and value, the SM count set by
``config.set_num_sms`` and the index-check switch. :func:`launch_plan` wraps a public op so that

* the first call of a signature runs the op in full;
* the second runs it in full under a :class:`_Recorder`, which numbers every tensor of the call (its arguments, its
  allocations, the outputs of its torch ops) and notes each allocation, torch op (its arguments by number) and
  launch (each buffer as a byte offset from a numbered tensor);
* from the third on, the call allocates, runs those torch ops, uploads its address tables (:func:`address_table`) and
  launches, on its own tensors, and returns the same structure. The checks and the choice of binary are not
  repeated: they passed for this signature and depend on nothing else. A view is repeated only where a repeated
  torch op or the result needs it.

A signature is remembered as not replayable, and its calls run in full, when its call reads tensor values on the
host (``.item()``, an op whose output shape depends on values, an index check), when a torch op or a launch reads a
tensor the call did not get or make (other than an op's :func:`stand_ins`), or when its argument tensors share memory,
where a launched buffer cannot be told apart as one argument's or another's.

A plan keeps no tensor of a call: sizes, dtypes, offsets, torch ops, the loaded binary and its bound dims.
Each op keeps at most ``MAX_PLANS`` signatures: a new one replaces the oldest seen only once, else the oldest plan.
:func:`clear` forgets them all (``_select.reset`` calls it). ``TILE_KERNELS_AOT_LAUNCH_PLANS=0`` (read at import)
or :func:`enable` turns them off: every call runs in full.

Where the runtime's C extension is installed (tile_kernels_aot._driver_native, unless
``TILE_KERNELS_AOT_NATIVE_LAUNCH=0``), a call goes to its ``replay`` once the checks above let it replay (plans on,
not under torch.compile, not inside a recorded call, no TorchDispatchMode active: the extension's allocations and
launches would pass a mode by). It makes the signature in C, for arguments that are exactly
``torch.Tensor``, the scalars, floats, and tuples and lists of these (for any other argument it leaves the call to
Python), and looks it up in the op's plans. It reads each tensor through torch's DLPack exchange API
(``torch.Tensor.__dlpack_c_exchange_api__``, torch 2.10 on, :func:`_torch_shim.exchange`) without a Python call, and
keeps the tensor's dtype in the signature and what the API reads (device, sizes, strides, the low bits of the address)
as bytes at its end; without that API, or for a dtype or device DLPack does not serve, it reads the tensor through
torch's Python API as :func:`signature` does. Two calls have equal C signatures exactly where they have equal
:func:`signature` tuples; with the extension installed every key is the C one (:func:`plan_key`), so both replays find
the same plans. A plan is *simple* when its steps are allocations and launches of kernels without a tensor map (each
of a kernel's launches a step), it saw no tensor passed twice, and it returns its tensors as they are, or views of
them that the result's builder makes in one or two steps (``base.as_strided(...)``,
``base.view(dtype).as_strided(...)``), or None, or tuples and lists of these: no torch op or address table is
repeated. Such a plan has a native form (``_Plan.native``), which the extension runs: the allocations (through torch's
C shim, :mod:`tile_kernels_aot._torch_shim`, without the GIL, where it serves the dtype and device; else
:func:`_allocator`), then each launch with its argument block on the stack, its grid and scalars checked and written
when the plan was made (``LoadedKernel.native_steps``), on torch's current stream, cuLaunchKernel called without the
GIL (cuLaunchKernelEx, with its CUlaunchConfig on the stack and the launch attributes a checked launch passes, for a
launch with PDL, cluster dims or a cooperative grid) and its failure raised by ``Driver.check``, then the returned
views: a view of an allocation's own dtype, of an allocation the shim made, by the shim's ``_reinterpret_tensor`` (the
same storage, sizes, strides and offset, but not an autograd view), any other through the tensors' own ``view`` and
``as_strided``, the calls Python's replay makes. Where the current CUDA context is not the one the plan was recorded
in (another device's, or none yet on a new thread), it leaves the call to Python before it allocates anything. Every
other call it hands to the Python path above with the signature it made. The extension reads the op's one dict of
plans: a plan cleared, evicted or turned off is gone for both.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Hashable, Mapping
from types import MappingProxyType

import torch
from torch.compiler import is_compiling
from torch.utils._python_dispatch import TorchDispatchMode

from tile_kernels_aot import _driver, _index_checks, _torch_shim, config
from tile_kernels_aot._launch import recording

MAX_PLANS = 256  # signatures an op keeps: decode's batch sizes, with room for prefill's passing ones
PLANS_ENV = 'TILE_KERNELS_AOT_LAUNCH_PLANS'
_ALIGNMENT_BITS = 255

_aten = torch.ops.aten
_ALLOCATIONS = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default, _aten.new_empty.default,
                _aten.new_empty_strided.default}
_ZERO_ALLOCATIONS = {_aten.zeros.default, _aten.zeros_like.default, _aten.new_zeros.default}
_ALIASES = {_aten.detach.default, _aten.alias.default}
_SCALARS = frozenset({int, bool, str, type(None), torch.dtype})
_TENSORS = (torch.Tensor, torch.nn.Parameter)

_caches: list[dict] = []
_native = _driver.native_extension()  # the C extension, which replays simple plans (_Plan.native); None: Python replays all
_native_replay = _native and _native.replay
_dispatch_modes = torch._C._len_torch_dispatch_stack
_shim = _native and _torch_shim.functions()  # torch's C shim, through which the extension allocates; None: torch's Python API
if _shim:
    _native.bind_shim(*_shim)
_exchange = _native and _torch_shim.exchange()  # torch's DLPack exchange API, through which the extension reads tensors
if _exchange:
    _native.bind_exchange(_exchange)


class _Unkeyable(Exception):
    """An argument a signature cannot hold (an object of another type, a tensor subclass)."""


class NotReplayable:
    """The plan of a signature whose calls run in full, and why."""

    native = None  # as a _Plan's that is not simple: the C extension's replay leaves the call to Python

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f'NotReplayable({self.reason!r})'


def _part(value: object, tensors: list) -> object:
    kind = type(value)
    if kind in _TENSORS:
        tensors.append(value)
        return value.dtype, value.shape, value.stride(), value.get_device(), value.data_ptr() & _ALIGNMENT_BITS
    if kind in _SCALARS:
        return kind, value
    if kind is float:
        return kind, value, math.copysign(1.0, value)  # 0.0 and -0.0 are equal keys, not equal arguments
    if kind is tuple or kind is list:
        return kind, tuple([_part(v, tensors) for v in value])
    raise _Unkeyable(kind.__name__)


def signature(args: tuple, kwargs: dict, tensors: list) -> tuple:
    """The call's signature; its tensors, in order, are appended to `tensors`. Raises _Unkeyable. (The common kinds of
    argument are spelled out here rather than left to _part: this runs on every call. A positional scalar adds two
    items, its type and value; any other argument one tuple, after its name if it is a keyword; so the items still tell
    the arguments apart.)"""
    key = [config._num_sms, _index_checks.enabled]
    for value in args:
        kind = type(value)
        if kind is torch.Tensor:
            tensors.append(value)
            key.append((value.dtype, value.shape, value.stride(), value.get_device(), value.data_ptr() & _ALIGNMENT_BITS))
        elif kind in _SCALARS:
            key += (kind, value)
        else:
            key.append(_part(value, tensors))
    for name, value in kwargs.items():  # a bare name, then a tuple
        key += (name, _part(value, tensors))
    return tuple(key)


def plan_key(args: tuple, kwargs: dict, tensors: list) -> tuple:
    """The key an op keeps the plan of a call under, its tensors appended to `tensors`: the C extension's signature
    (the one its replay looks up) where it makes one, else :func:`signature`. Raises _Unkeyable."""
    if _native is not None:
        key = _native.signature(args, kwargs, config._num_sms, _index_checks.enabled, tensors)
        if key is not None:
            return key
    return signature(args, kwargs, tensors)


enabled: bool = config.env_switch(PLANS_ENV, True)


def enable(on: bool = True) -> None:
    """Turn launch plans on or off for this process (TILE_KERNELS_AOT_LAUNCH_PLANS=0 starts with them off). Off, every
    call runs its op in full; the plans already made are kept for when they are on again."""
    global enabled
    if not isinstance(on, bool):
        raise TypeError(f'enable: on must be a bool, got {type(on).__name__}')
    enabled = on


def clear() -> None:
    """Forget every op's plans (the installed binaries or the configuration changed)."""
    for cache in _caches:
        cache.clear()


def launch_plan(op: Callable) -> Callable:
    """Wrap a public op (see the module docstring). Under torch.compile, and inside another op's recorded call, the op
    runs as it is."""
    plans: dict = {}
    _caches.append(plans)

    @functools.wraps(op)
    def call(*args, **kwargs):
        if not enabled or is_compiling() or recording.__dict__.get('active') is not None:
            return op(*args, **kwargs)
        native = _native_replay is not None and not _dispatch_modes()  # C's allocations would pass a mode by
        if native:  # C replays a simple plan, else makes the signature for by_signature
            result = _native_replay(plans, args, kwargs, config._num_sms, _index_checks.enabled, by_signature)
            if result is not NotImplemented:
                return result
        tensors: list = []
        try:  # where C's replay ran and came back, C could not key the call (an argument of a kind it does not key)
            key = signature(args, kwargs, tensors) if native else plan_key(args, kwargs, tensors)
        except Exception:  # an argument without a signature (another type, a tensor without storage)
            return op(*args, **kwargs)  # the op's own checks say what is wrong with it
        return by_signature(key, tensors, args, kwargs)

    def by_signature(key: tuple, tensors: list, args: tuple, kwargs: Mapping = _NO_KWARGS):
        """The call of signature `key`, whose argument tensors are `tensors`: replayed, recorded, or run in full."""
        try:
            plan = plans.get(key, _UNSEEN)
        except Exception:  # an unhashable value
            return op(*args, **kwargs)
        if type(plan) is _Plan:
            if not plan.same or plan.serves(tensors):
                return plan.run(tensors)
            return op(*args, **kwargs)
        if plan is _UNSEEN or type(plan) is NotReplayable or _dispatch_modes():
            if plan is _UNSEEN:
                _store(plans, key, None)
            return op(*args, **kwargs)  # first seen, not replayable, or another dispatch mode is watching
        recorder = _Recorder(tensors)
        with recorder:
            result = op(*args, **kwargs)
        _store(plans, key, recorder.plan(result))
        return result

    call.plans = plans  # for the tests
    return call


_UNSEEN = object()
_NO_KWARGS = MappingProxyType({})


def _store(plans: dict, key: tuple, plan: object) -> None:
    """Keep `plan` for `key`; a full cache first forgets its oldest signature seen only once, else its oldest."""
    with _lock:  # threads may record at once; lookups need no lock
        if key not in plans and len(plans) >= MAX_PLANS:
            del plans[next((k for k, v in plans.items() if v is None), next(iter(plans)))]
        plans[key] = plan


_lock = threading.Lock()


def address_table(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """An int64 tensor on `device` holding the tensors' addresses, copied from pinned memory without a host sync (a CUDA
    graph can capture it). A launch plan builds it again from each call's tensors."""
    recorder = recording.__dict__.get('active')
    if recorder is None:
        return _upload([t.data_ptr() for t in tensors], device)
    recorder.paused = True  # the upload's torch ops are the table step's, not the call's
    try:
        table = _upload([t.data_ptr() for t in tensors], device)
    finally:
        recorder.paused = False
    recorder.table(tensors, device, table)
    return table


def _upload(addresses: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(addresses, dtype=torch.int64, pin_memory=device.type == 'cuda').to(device, non_blocking=True)


def stand_ins(key: Hashable, make: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors an op binds in place of absent optional arguments (or a scratch its kernel never touches), made by
    `make` once per `key` (the op, its device and what sizes them) and kept: a launch plan launches them by their
    address, and a CUDA graph captured with them stays valid."""
    made = _stand_ins.get(key)
    if made is None:
        with _lock:
            made = _stand_ins.get(key)
            if made is None:
                made = _stand_ins[key] = make()
                for t in made.values():
                    _stand_in_storages[t.untyped_storage().data_ptr()] = t
    return made


_stand_ins: dict = {}
_stand_in_storages: dict[int, torch.Tensor] = {}  # storage address -> a stand-in on it


class _Ref:
    """In a recorded torch op's arguments: the call's tensor number `index` (an argument, an allocation, an output)."""
    __slots__ = ('index',)

    def __init__(self, index: int) -> None:
        self.index = index


def _resolve(template: object, sources: list) -> object:
    kind = type(template)
    if kind is _Ref:
        return sources[template.index]
    if kind is tuple or kind is list:
        return kind([_resolve(v, sources) for v in template])
    if kind is dict:
        return {k: _resolve(v, sources) for k, v in template.items()}
    return template


def _refs(template: object) -> list[int]:
    kind = type(template)
    if kind is _Ref:
        return [template.index]
    if kind is tuple or kind is list or kind is dict:
        return [i for v in (template.values() if kind is dict else template) for i in _refs(v)]
    return []


class _Recorder(TorchDispatchMode):
    """Watches one op call: the torch ops it runs (through the dispatcher) and its launches (LoadedKernel.__call__).
    Every tensor of the call gets a number: its argument tensors first, then each allocation and torch op output."""

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.num_inputs = len(inputs)
        self.tensors: list[torch.Tensor] = list(inputs)
        self.number: dict[int, int] = {}  # id(tensor) -> its number; self.tensors keeps each alive, so ids stay unique
        for index, t in enumerate(inputs):
            self.number.setdefault(id(t), index)
        self.aliases: list[torch.Tensor] = []  # detached aliases of allocations, kept alive so that their ids stay unique
        self.base: dict[int, int] = {}  # a view of an allocation or a computed output (by number) -> that tensor's number
        self.steps: list[tuple] = []
        self.reason: str | None = None
        self.paused = False

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's handler in torch._dynamo.disable unless this says False: the first recording would then
        # import torch._dynamo and sympy in the middle of an op's call. Nothing is compiled inside a recorded call.
        return False

    def __enter__(self):
        recording.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        recording.active = None
        return super().__exit__(*exc)

    def _new(self, t: torch.Tensor) -> int:
        index = self.number[id(t)] = len(self.tensors)
        self.tensors.append(t)
        return index

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.reason or self.paused:
            return out
        if func in _ALLOCATIONS or func in _ZERO_ALLOCATIONS:
            self.steps.append(('alloc', self._new(out), func in _ZERO_ALLOCATIONS))
        elif func in _ALIASES and self.steps and self.steps[-1][0] == 'alloc' and args[0] is self.tensors[-1]:
            self.number[id(out)] = len(self.tensors) - 1  # a factory function hands out a detached alias of its allocation
            self.aliases.append(out)
        elif torch.Tag.dynamic_output_shape in func.tags or torch.Tag.data_dependent_output in func.tags:
            self.reason = f'it runs {func}, whose result depends on tensor values'
        else:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            try:
                if not all(isinstance(o, torch.Tensor) for o in outs):
                    raise _Unplannable(f'it runs {func}, which returns a Python value')
                args_t, kwargs_t = self._template(args), self._template(kwargs)
            except _Unplannable as exc:
                self.reason = str(exc)
                return out
            numbers = tuple(self.number.get(id(o)) if id(o) in self.number else self._new(o) for o in outs)
            self.steps.append(('op', func, args_t, kwargs_t, numbers, func.is_view))
            if func.is_view and type(args_t[0]) is _Ref:
                made = self.base.get(args_t[0].index, args_t[0].index)
                if made >= self.num_inputs:  # a view of a tensor the call made, whose storage starts with it
                    self.base.update((n, made) for n in numbers if n != made)
        return out

    def _template(self, value: object) -> object:
        """`value` with each tensor replaced by a _Ref to its number (a stand-in stays itself)."""
        if isinstance(value, torch.Tensor):
            index = self.number.get(id(value))
            if index is not None:
                return _Ref(index)
            if _stand_in_storages.get(value.untyped_storage().data_ptr()) is value:
                return value
            raise _Unplannable('a torch op reads a tensor made before the call')
        kind = type(value)
        if kind is tuple or kind is list:
            return kind([self._template(v) for v in value])
        if kind is dict:
            return {k: self._template(v) for k, v in value.items()}
        return value

    def table(self, tensors: list[torch.Tensor], device: torch.device, table: torch.Tensor) -> None:
        numbers = [self.number.get(id(t)) for t in tensors]
        if None in numbers:
            self.reason = self.reason or 'it uploads the addresses of tensors it neither got nor made'
        self.steps.append(('table', tuple(numbers), device, self._new(table)))

    def launched(self, kernel, device: int, tensors: dict, env: dict) -> None:
        self.steps.append(('launch', kernel, device, dict(tensors), dict(env)))

    # -- the plan ------------------------------------------------------------------------------

    def plan(self, result: object) -> _Plan | NotReplayable:
        if self.reason:
            return NotReplayable(self.reason)
        try:
            return self._plan(result)
        except _Unplannable as exc:
            return NotReplayable(str(exc))

    def _plan(self, result: object) -> _Plan:
        tensors = self.tensors
        by_storage: dict[int, int] = {}  # a storage -> the first tensor on it: an argument, an allocation or a computed output
        same: list[tuple[int, int]] = []  # (i, j): argument j is argument i, one tensor passed twice
        for index, t in enumerate(tensors):
            storage = t.untyped_storage()
            if storage.nbytes() == 0:
                continue
            owner = by_storage.setdefault(storage.data_ptr(), index)
            if owner != index and index < self.num_inputs:
                if tensors[owner] is not t:
                    raise _Unplannable('argument tensors share memory')
                same.append((owner, index))

        def buffer(t: torch.Tensor) -> tuple[int, int]:
            """A launched buffer as (tensor number, byte offset), or (-1, its address) for a stand-in's memory."""
            storage = t.untyped_storage()
            index = by_storage.get(storage.data_ptr()) if storage.nbytes() else None
            if index is None:
                if t.numel() == 0:
                    return -1, 0  # no memory is read or written: any pointer serves
                if storage.data_ptr() in _stand_in_storages:
                    return -1, t.data_ptr()
                raise _Unplannable('a launched buffer is neither an argument nor made by the call')
            offset = t.data_ptr() - tensors[index].data_ptr()
            if offset < 0:
                raise _Unplannable('a launched buffer starts before the tensor it is a view of')
            return index, offset

        returned: list[int] = []
        views: dict[int, tuple] = {}
        build = self._builder(result, returned, views)
        needed = set(returned)  # the tensors the result is made of
        steps = []
        for step in reversed(self.steps):
            if step[0] == 'alloc':
                t = tensors[step[1]]
                contiguous = t.is_contiguous()
                # zeroed: made by torch.zeros where contiguous, else allocated with its strides and filled
                steps.append((_ALLOC, step[1], tuple(t.shape), t.stride(), t.dtype, t.device, step[2] and contiguous,
                              step[2] and not contiguous))
            elif step[0] == 'op':
                _, func, args_t, kwargs_t, numbers, is_view = step
                if is_view and not needed.intersection(numbers):
                    continue  # a view nothing replayed reads: the launches take its address from its base
                needed.update(_refs(args_t), _refs(kwargs_t))
                func = getattr(func, '_op', func)  # the op without OpOverload's Python wrapper
                refs = tuple((position, value.index) for position, value in enumerate(args_t) if type(value) is _Ref)
                if len(refs) == len(_refs(args_t)) and not _refs(kwargs_t):  # tensors only as top-level arguments
                    steps.append((_OP, func, list(args_t), refs, kwargs_t, numbers))
                else:
                    steps.append((_NESTED_OP, func, args_t, kwargs_t, numbers))
            elif step[0] == 'table':
                steps.append((_TABLE, *step[1:]))
            else:
                _, kernel, device, launched, env = step
                steps.append((_LAUNCH, kernel, device, tuple((name, *buffer(t)) for name, t in launched.items()), env))
        return _Plan(self.num_inputs, len(tensors), tuple(same), tuple(reversed(steps)), build, self._returns(result, views),
                     tuple((index, *view) for index, view in views.items()))

    def _builder(self, value: object, returned: list[int], views: dict[int, tuple]) -> Callable[[list], object]:
        """A function of the replayed call's tensors (numbered as here) that builds `value`; the numbers of the tensors
        it returns go into `returned`, and each view it rebuilds goes into `views` as its number -> (its base's number,
        the dtype it views the base as or None, shape, stride, storage offset)."""
        if isinstance(value, torch.Tensor):
            index = self.number.get(id(value))
            if index is None:
                raise _Unplannable('it returns a tensor made before the call')
            base = self.base.get(index)
            if base is not None:  # a view of what the call made: rebuilt from it in one or two steps, not by its chain
                shape, stride, offset = tuple(value.shape), value.stride(), value.storage_offset()
                dtype = value.dtype
                if self.tensors[base].dtype == dtype:
                    returned.append(base)
                    views[index] = (base, None, shape, stride, offset)
                    return lambda s: s[base].as_strided(shape, stride, offset)
                if _retyped(self.tensors[base], value):
                    returned.append(base)
                    views[index] = (base, dtype, shape, stride, offset)
                    return lambda s: s[base].view(dtype).as_strided(shape, stride, offset)
            returned.append(index)
            return lambda s: s[index]
        kind = type(value)
        if kind is tuple or kind is list:
            parts = [self._builder(v, returned, views) for v in value]
            return lambda s: kind([part(s) for part in parts])
        if kind in _SCALARS or kind is float:
            return lambda s: value
        raise _Unplannable(f'it returns a {kind.__name__}')

    def _returns(self, value: object, views: dict[int, tuple]) -> object:
        """`value` (which _builder builds) as the C extension's replay builds it: a tensor's number (a view among them, which
        the replay makes as `views` says), None, or a tuple or list of these; _NOT_SIMPLE for any other result (a view
        _builder could not rebuild, another scalar)."""
        if value is None:
            return None
        if isinstance(value, torch.Tensor):
            index = self.number[id(value)]
            return _NOT_SIMPLE if index in self.base and index not in views else index
        kind = type(value)
        if kind is tuple or kind is list:
            parts = [self._returns(v, views) for v in value]
            if not any(part is _NOT_SIMPLE for part in parts):
                return kind(parts)
        return _NOT_SIMPLE


def _retyped(base: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether `value`, a view of `base` in another dtype, is base.view(value.dtype).as_strided(...) of its own sizes
    (a packed scale factor's int32 words over the uint8 bytes the kernel writes)."""
    try:
        rebuilt = base.view(value.dtype).as_strided(value.shape, value.stride(), value.storage_offset())
    except RuntimeError:  # base's last dim does not divide into the new dtype's elements
        return False
    return rebuilt.data_ptr() == value.data_ptr()


class _Unplannable(Exception):
    pass


_NOT_SIMPLE = object()


_ALLOC, _OP, _NESTED_OP, _TABLE, _LAUNCH = range(5)


class _Plan:
    """What a call of one signature does on the device, ready to repeat with another call's tensors."""

    def __init__(self, num_inputs: int, num_tensors: int, same: tuple, steps: tuple, build: Callable[[list], object],
                 returns: object = _NOT_SIMPLE, views: tuple = ()) -> None:
        self.num_inputs = num_inputs
        self.num_made = num_tensors - num_inputs
        self.same = same  # argument positions that held one tensor when recorded: each launched buffer is the first's
        self.steps = steps
        self.build = build
        self._actions = tuple(_action(step) for step in steps)
        self.native = _native_plan(num_tensors, same, steps, returns, views)  # what the C extension replays; None: Python does

    def serves(self, inputs: list[torch.Tensor]) -> bool:
        """Whether the plan serves a call's tensors: those passed twice when it was recorded are passed twice again."""
        return all(inputs[i] is inputs[j] for i, j in self.same)

    def run(self, inputs: list[torch.Tensor]) -> object:
        tensors = inputs + [None] * self.num_made
        for action in self._actions:
            action(tensors)
        return self.build(tensors)


def _native_plan(num_tensors: int, same: tuple, steps: tuple, returns: object, views: tuple) -> tuple | None:
    """A simple plan as the C extension's replay runs it (tile_kernels_aot._driver_native, run): (the allocations as
    (number, the allocating method (_allocator), its args, the same allocation through torch's C shim
    (_torch_shim.allocation) or None), the launch steps (LoadedKernel.native_steps), the views it
    returns as (number, base number, dtype or None, shape, stride, offset): base.view(dtype).as_strided(shape, stride,
    offset), as _Recorder._builder rebuilds them, the result (_Recorder._returns)), its tensors numbered below
    MAX_TENSORS. A plan is simple when its steps are allocations and launches of kernels without a tensor
    map, it saw no tensor passed twice, and it returns its tensors as they are or views of them that _builder rebuilds
    in one or two steps. None for any other plan, or without the extension: Python replays it."""
    if _native is None or same or returns is _NOT_SIMPLE or num_tensors > _native.MAX_TENSORS:
        return None
    allocations, launches = [], []
    for step in steps:
        if step[0] is _ALLOC and not step[7]:
            _, made, shape, stride, dtype, device, zeros_made, _ = step
            allocate = _allocator(dtype, device, zeros_made)
            shim = _shim and _torch_shim.allocation(dtype, device, shape, stride, zeros_made)
            allocations.append((made, allocate, (shape,) if zeros_made else (shape, stride), shim))
        elif step[0] is _LAUNCH:
            steps_of_launch = step[1].native_steps(*step[2:])
            if steps_of_launch is None:
                return None
            launches.extend(steps_of_launch)
        else:  # a torch op, an address table, a zero-filled allocation with strides
            return None
    return tuple(allocations), tuple(launches), views, returns


def _allocator(dtype: torch.dtype, device: torch.device, zeros: bool) -> Callable:
    """The method that allocates a replayed call's tensor of `dtype` on `device`: new_zeros(shape), or
    new_empty_strided(shape, stride), of an empty tensor of that dtype and device, which takes no keyword arguments to
    parse, unlike torch.zeros and torch.empty_strided, and so is the cheaper call."""
    template = _templates.get((dtype, device))
    if template is None:
        template = _templates.setdefault((dtype, device), torch.empty(0, dtype=dtype, device=device))
    return template.new_zeros if zeros else template.new_empty_strided


_templates: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}  # (dtype, device) -> an empty tensor: no memory


def _action(step: tuple) -> Callable[[list], None]:
    """A step as a function of the call's numbered tensors, which it extends with what it makes (a replay runs these,
    with no dispatch on the kind of step)."""
    kind = step[0]
    if kind is _LAUNCH:
        _, kernel, device, buffers, env = step
        return kernel.replayer(device, buffers, env)
    if kind is _TABLE:
        _, numbers, device, made = step

        def table(tensors):
            tensors[made] = _upload([tensors[n].data_ptr() for n in numbers], device)
        return table
    if kind is _ALLOC:
        _, made, shape, stride, dtype, device, zeros_made, zero_filled = step
        allocate = _allocator(dtype, device, zeros_made)
        if zeros_made:
            def zeros(tensors):
                tensors[made] = allocate(shape)
            return zeros

        def alloc(tensors):
            t = tensors[made] = allocate(shape, stride)
            if zero_filled:
                t.zero_()
        return alloc
    if kind is _OP:
        _, func, template, refs, kwargs, numbers = step

        def call(tensors):
            args = template.copy()
            for position, index in refs:
                args[position] = tensors[index]
            _keep(tensors, numbers, func(*args, **kwargs))
        return call
    _, func, args_t, kwargs_t, numbers = step

    def nested(tensors):
        _keep(tensors, numbers, func(*_resolve(args_t, tensors), **_resolve(kwargs_t, tensors)))
    return nested


def _keep(tensors: list, numbers: tuple[int, ...], out) -> None:
    if len(numbers) == 1:
        tensors[numbers[0]] = out
    else:
        for index, t in zip(numbers, out):
            tensors[index] = t
