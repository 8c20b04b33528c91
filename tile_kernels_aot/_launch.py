"""Launching one prebuilt binary: load it per device on first use, bind and check the arguments against the
manifest, and launch on the current torch stream of the tensors' device.

The manifest describes every buffer's shape and strides as expressions of the dynamic dims. The dims
are read off the tensors where a shape or stride is a bare name, and every other shape, stride, dtype
and pointer alignment is checked against them, so a binary can never run on memory it was not built
for, whatever the op in front of it got wrong.

A launch plan (tile_kernels_aot._plans) repeats a checked launch with other tensors: through replayer() in Python,
or, for a kernel without a tensor map, in the runtime's C extension from native_steps(), whose grid,
scalars and launch attributes are checked and written by the same code as a launch's.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from tile_kernels_aot import _driver
from tile_kernels_aot.cubin import check_layout, cubin_sm, target_sm
from tile_kernels_aot.manifest import Entry, Launch, compile_expr, format_expr
from tile_kernels_aot.errors import (
    CubinArchError, CubinChecksumError, CubinLoadError, CubinMissingError, CubinTruncatedError, CudaDriverError, TileKernelsAOTError,
)

TORCH_DTYPES = {
    'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16,
    'float8_e4m3fn': torch.float8_e4m3fn, 'int64': torch.int64, 'int32': torch.int32,
    'uint32': torch.uint32, 'int8': torch.int8, 'uint8': torch.uint8, 'bool': torch.bool,
}
_INT32_MAX = 2**31 - 1
MAX_GRID = (2**31 - 1, 65535, 65535)  # CUDA's limits of a grid's x, y and z
_STATIC_SMEM_LIMIT = 48 * 1024
_SCALAR_CTYPES = {'int32': ctypes.c_int32, 'int64': ctypes.c_int64, 'float32': ctypes.c_float}

_thread_state = threading.local()
recording = threading.local()  # .active: the launch-plan recorder of this thread's op call, if any (tile_kernels_aot._plans)

# The driver's answers to cuModuleLoadData / cuModuleGetFunction that blame the image itself.
_IMAGE_FAULTS = frozenset({
    'CUDA_ERROR_INVALID_IMAGE', 'CUDA_ERROR_NO_BINARY_FOR_GPU', 'CUDA_ERROR_INVALID_PTX', 'CUDA_ERROR_UNSUPPORTED_PTX_VERSION',
    'CUDA_ERROR_INVALID_SOURCE', 'CUDA_ERROR_NOT_FOUND', 'CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND', 'CUDA_ERROR_SHARED_OBJECT_INIT_FAILED',
})


class _BindingPlan:
    """Precomputed per entry: which tensor dims define the dynamic dims, and which must be checked.
    bind() runs on every call, so it is flat loops over precomputed tuples."""

    def __init__(self, entry: Entry) -> None:
        self.kernel = f'{entry.kernel}[{entry.key}]'
        self.buffers = []
        bound: set[str] = set()
        for buf in entry.buffers:
            binds: list[tuple[bool, int, str]] = []  # (is_stride, dim, var)
            constants: list[tuple[bool, int, int]] = []  # (is_stride, dim, value)
            derived: list[tuple[bool, int, object, object]] = []  # (is_stride, dim, fn, expr)
            for is_stride, exprs in ((False, buf.shape), (True, buf.strides)):
                for dim, expr in enumerate(exprs):
                    if isinstance(expr, str) and expr not in bound:
                        bound.add(expr)
                        binds.append((is_stride, dim, expr))
                    elif isinstance(expr, int):
                        constants.append((is_stride, dim, expr))
                    else:
                        derived.append((is_stride, dim, compile_expr(expr), expr))
            self.buffers.append((buf.name, TORCH_DTYPES[buf.dtype], len(buf.shape), buf.alignment, tuple(binds), tuple(constants), tuple(derived)))
        self.scalars = tuple(s.name for s in entry.scalars)

    def bind(self, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, int], pointers: dict[str, int] | None = None) -> dict[str, int]:
        """The kernel's dims and scalars by name, every buffer checked; each buffer's data pointer goes into `pointers`."""
        env: dict[str, int] = {}
        if pointers is None:
            pointers = {}
        for name, dtype, ndim, alignment, binds, constants, derived in self.buffers:
            t = tensors.get(name)
            if t is None:
                raise TypeError(f'{self.kernel}: missing tensor {name!r}')
            if t.dtype != dtype or t.dim() != ndim:
                raise TypeError(f'{self.kernel}: {name} must be a {ndim}-d {dtype} tensor, got {t.dim()}-d {t.dtype}')
            pointer = pointers[name] = t.data_ptr()
            if pointer % alignment:
                raise ValueError(f'{self.kernel}: {name}.data_ptr() must be {alignment}-byte aligned, got {pointer:#x}')
            shape, strides = t.shape, t.stride()
            for is_stride, dim, var in binds:
                env[var] = strides[dim] if is_stride else shape[dim]
            for is_stride, dim, value in constants:
                if (strides[dim] if is_stride else shape[dim]) != value and not (is_stride and shape[dim] <= 1):
                    self._mismatch(name, is_stride, dim, value, value, shape, strides)  # expr is the constant
            for is_stride, dim, fn, expr in derived:
                expected = fn(env)
                if (strides[dim] if is_stride else shape[dim]) != expected and not (is_stride and shape[dim] <= 1):
                    self._mismatch(name, is_stride, dim, expected, expr, shape, strides)
        for name in self.scalars:
            if name not in scalars:
                raise TypeError(f'{self.kernel}: missing scalar {name!r}')
            env[name] = scalars[name]
        return env

    def _mismatch(self, name, is_stride, dim, expected, expr, shape, strides):
        # A stride of a dim of size 0 or 1 never addresses memory, so it is not checked (see bind).
        what = 'stride' if is_stride else 'shape'
        actual = strides[dim] if is_stride else shape[dim]
        detail = '' if isinstance(expr, int) else f' (= {format_expr(expr)})'
        raise ValueError(f'{self.kernel}: {name}.{what}({dim}) must be {expected}{detail}, got {actual}')


class _ArgPack:
    """The kernel parameter block of one launch: a ctypes struct per argument, and the void* array
    that cuLaunchKernel reads, built once and refilled on every call (the driver copies the values
    at launch, so reuse is safe, CUDA graphs included). The slots are grouped by what fills them:
    `tensor_slots` (slot, tensor name), `scalar_slots` (slot, name, whether it is 32-bit) and `map_slots`. The scalar
    slots and the grid are rewritten only when a launch's env is another dict than the last one's."""

    def __init__(self, launch: Launch) -> None:
        self.pointers = (ctypes.c_void_p * max(len(launch.args), 1))()
        self.address = ctypes.addressof(self.pointers)
        tensor_slots, scalar_slots, map_slots = [], [], []
        recipes = iter(launch.tma)
        for i, arg in enumerate(launch.args):
            if arg.kind == 'tma':
                slot = _TmaSlot(next(recipes))
                map_slots.append(slot)
                self.pointers[i] = slot.address
            elif arg.kind == 'ptr':
                slot = ctypes.c_void_p()
                tensor_slots.append((slot, arg.name))
                self.pointers[i] = ctypes.addressof(slot)
            else:
                slot = _SCALAR_CTYPES[arg.kind]()
                scalar_slots.append((slot, arg.name, arg.kind == 'int32'))
                self.pointers[i] = ctypes.addressof(slot)
        self.tensor_slots, self.scalar_slots, self.map_slots = tuple(tensor_slots), tuple(scalar_slots), tuple(map_slots)
        self.env: dict[str, int] | None = None  # the dims and scalars the block holds, and their grid
        self.grid: tuple[int, int, int] | None = None


class _TmaSlot:
    """A tensor map re-encoded on every call (the address and the dynamic dims change), kept where the
    kernel parameter block points: 128 bytes on a 64-byte boundary."""

    def __init__(self, recipe) -> None:
        self.recipe = recipe
        self.dims = [compile_expr(d) for d in recipe.global_dims]
        self.strides = [compile_expr(x) for x in recipe.global_strides]
        self.storage = (ctypes.c_uint8 * (128 + 64))()
        self.address = ctypes.addressof(self.storage) + (-ctypes.addressof(self.storage) % 64)
        self.tensor_map = _driver.CUtensorMap.from_address(self.address)

    def encode(self, drv: _driver.Driver, pointers: Mapping[str, int], env: dict[str, int]) -> None:
        r = self.recipe
        dims = (ctypes.c_uint64 * r.rank)(*(d(env) for d in self.dims))
        strides = (ctypes.c_uint64 * max(r.rank - 1, 1))(*(x(env) for x in self.strides))
        box = (ctypes.c_uint32 * r.rank)(*r.box_dims)
        elem_strides = (ctypes.c_uint32 * r.rank)(*r.element_strides)
        drv.call('cuTensorMapEncodeTiled', ctypes.byref(self.tensor_map), r.data_type, r.rank,
                 ctypes.c_void_p(pointers[r.buffer]), dims, strides, box, elem_strides,
                 r.interleave, r.swizzle, r.l2_promotion, r.oob_fill)


class LoadedKernel:
    """One manifest entry: its cubin, loaded lazily into each device's primary context."""

    def __init__(self, entry: Entry, root: Path, verify_sha256: bool = True, package: str | None = None) -> None:
        self.entry = entry
        self.path = root / entry.cubin
        self.package = package  # where the arch package was found, for the errors
        self._verify = verify_sha256
        self._image: bytes | None = None
        self._functions: dict[int, list] = {}
        self._plan = _BindingPlan(entry)
        self._grids = [_grid_function(launch.grid) for launch in entry.launches]
        self._lock = threading.Lock()
        self._packs = threading.local()  # argument blocks, one set per thread
        self._driver: _driver.Driver | None = None
        self._resident_blocks: dict[tuple[int, str], int] = {}
        self._blocks_per_sm: dict[int, int] = {}
        # One launch without a tensor map or launch attributes (most kernels): _launch_all's short path.
        first = entry.launches[0] if len(entry.launches) == 1 else None
        self._plain = first is not None and not (first.tma or first.cooperative or first.cluster_dims or first.pdl)

    # -- loading -------------------------------------------------------------------------------

    def _fields(self, found_sha256: str | None = None) -> dict:
        """What every KernelIntegrityError of this binary carries."""
        return dict(kernel=f'{self.entry.kernel}[{self.entry.key}]', package=self.package, file=str(self.path), target=self.entry.target,
                    expected_sha256=self.entry.sha256, found_sha256=found_sha256)

    def image(self) -> bytes:
        """The cubin's bytes, read once: its sha256 (unless verification is off), its ELF arch and layout checked."""
        if self._image is None:
            try:
                data = self.path.read_bytes()
            except OSError as exc:
                raise CubinMissingError(exc.strerror or str(exc), **self._fields()) from exc
            found = hashlib.sha256(data).hexdigest() if self._verify else None
            if found is not None and found != self.entry.sha256:
                raise CubinChecksumError(len(data), **self._fields(found))
            try:
                sm = cubin_sm(data)
            except ValueError as exc:
                raise CubinArchError(None, f'{exc}, not a cubin', **self._fields(found)) from exc
            if sm != target_sm(self.entry.target):
                raise CubinArchError(sm, f'ELF is for sm_{sm}, the manifest says {self.entry.target}', **self._fields(found))
            try:
                check_layout(data)
            except ValueError as exc:
                raise CubinTruncatedError(len(data), str(exc), **self._fields(found)) from exc
            self._image = data
        return self._image

    def _load(self, device: int) -> list:
        drv = self._driver = _driver.driver()
        _ensure_context(device)
        image = self.image()
        try:  # with sha256 verification off, a damaged cubin shows here first: name the file
            module = drv.load_module(image)
            symbols = [drv.get_function(module, launch.symbol) for launch in self.entry.launches]
        except CudaDriverError as exc:
            if exc.name in _IMAGE_FAULTS:
                raise CubinLoadError(exc, **self._fields()) from exc
            # Not the image's fault (out of memory, a context lost earlier): the driver's error, naming the file.
            raise CudaDriverError(exc.function, exc.code, exc.name, f'{exc.text} (loading {self.path})') from exc
        functions = []
        for launch, fn in zip(self.entry.launches, symbols):
            if launch.dynamic_smem > _STATIC_SMEM_LIMIT:
                optin = drv.device_attribute(_driver.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)
                if launch.dynamic_smem > optin:
                    raise TileKernelsAOTError(f'{launch.symbol} needs {launch.dynamic_smem} bytes of shared memory, device {device} allows {optin}')
                drv.set_function_attribute(fn, _driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.dynamic_smem)
            if launch.cluster_dims and launch.cluster_dims[0] * launch.cluster_dims[1] * launch.cluster_dims[2] > 8:
                drv.set_function_attribute(fn, _driver.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
            if launch.cooperative:
                if not drv.device_attribute(_driver.CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, device):
                    raise TileKernelsAOTError(f'{launch.symbol} needs a cooperative launch, which device {device} does not support')
                # A cooperative grid must be co-resident: remember how many blocks can be, per device.
                self._resident_blocks[(device, launch.symbol)] = _blocks_per_sm(drv, fn, launch) * drv.device_attribute(_driver.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
            functions.append(fn)
        return functions

    def blocks_per_sm(self, device: int) -> int:
        """How many CTAs of the kernel's (first) launch fit on one multiprocessor of `device` at once, from the
        driver's occupancy calculator (registers, shared memory, threads): an op that sizes a persistent grid
        by it keeps that grid resident whatever register count the build gave the kernel."""
        per_sm = self._blocks_per_sm.get(device)
        if per_sm is None:
            fn = self.functions(device)[0]  # loads the module, and with it self._driver
            per_sm = self._blocks_per_sm[device] = _blocks_per_sm(self._driver, fn, self.entry.launches[0])
        return per_sm

    def functions(self, device: int) -> list:
        fns = self._functions.get(device)
        if fns is None:
            with self._lock:
                fns = self._functions.get(device)
                if fns is None:
                    fns = self._functions[device] = self._load(device)
        return fns

    # -- launching -----------------------------------------------------------------------------

    def __call__(self, device: int, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, int] | None = None) -> None:
        """Launch every kernel of the entry, in order, on torch's current stream of `device`."""
        pointers: dict[str, int] = {}
        env = self._plan.bind(tensors, scalars or {}, pointers)
        recorder = recording.__dict__.get('active')
        if recorder is not None:  # an op's call being recorded as a launch plan (tile_kernels_aot._plans)
            recorder.launched(self, device, tensors, env)
        self.launch(device, pointers, env)

    def launch(self, device: int, pointers: Mapping[str, int], env: dict[str, int]) -> None:
        """Launch with arguments already bound and checked: each buffer's data pointer and the dims and scalars by name."""
        if _current_device() != device:
            with torch.cuda.device(device):
                self._launch_all(device, pointers, env)
        else:
            self._launch_all(device, pointers, env)

    def replayer(self, device: int, buffers: tuple[tuple[str, int, int], ...], env: dict[str, int]) -> Callable[[list], None]:
        """A launch plan's launch step (tile_kernels_aot._plans): launch on `device` with each buffer at (name, tensor
        number, byte offset) of a call's numbered tensors (number -1: the offset is the address), and the dims and
        scalars `env`, checked when the plan was recorded. For a plain kernel (one launch, no launch attributes) the step
        fills this thread's argument block and calls the driver itself; otherwise, and while another device is current
        or this thread has not launched the binary yet, it goes through launch()."""

        def through_launch(tensors: list) -> None:
            self.launch(device, {name: tensors[index].data_ptr() + offset if index >= 0 else offset for name, index, offset in buffers}, env)

        if not self._plain:
            return through_launch
        launch = self.entry.launches[0]
        where = {name: (index, offset) for name, index, offset in buffers}
        order = tuple(where[arg.name] for arg in launch.args if arg.kind == 'ptr')  # the argument block's tensor slots, in order
        block, smem, grid_of, packs_of_thread = launch.block, launch.dynamic_smem, self._grids[0], self._packs

        def replay(tensors: list) -> None:
            packs = packs_of_thread.__dict__.get('value')
            functions = self._functions.get(device)
            if packs is None or functions is None or _current_device() != device or _thread_state.__dict__.get('device') != device:
                return through_launch(tensors)
            pack = packs[0]
            if pack.env is not env:
                self._bind_env(launch, pack, grid_of(env), env)
            if pack.grid is not None:
                for (slot, _), (index, offset) in zip(pack.tensor_slots, order):
                    slot.value = tensors[index].data_ptr() + offset if index >= 0 else offset
                drv = self._driver
                native = drv.native
                if native is None:
                    drv.launch(functions[0], pack.grid, block, smem, _current_stream(device), pack.pointers)
                elif code := native.launch(functions[0].value, pack.grid, block, smem, _current_stream(device), pack.address):
                    drv.check('cuLaunchKernel', code)  # Driver.launch, spelled out: a replay's one driver call
        return replay

    def native_steps(self, device: int, buffers: tuple[tuple[str, int, int], ...], env: dict[str, int]) -> tuple | None:
        """The launch steps of replayer(), one a launch of the kernel in order, as the C extension's replay runs them
        (tile_kernels_aot._driver_native, launch_step): each (cuLaunchKernel, cuCtxGetCurrent, cuLaunchKernelEx, the
        context, the function, grid x, y, z, block x, y, z, shared bytes, the current stream's function, device,
        Driver.check, the argument block, its pointer slots, the launch attributes). The grid and the scalars are checked
        and written by _bind_env, as for a launch, into an argument block of 8 bytes an argument; the pointer slots are
        (slot, tensor number, byte offset) triples, flat; the launch attributes are the bytes of launch_attributes' array
        (empty: cuLaunchKernel, else cuLaunchKernelEx), a cooperative grid checked against the blocks that fit at once,
        as _launch_one checks it. None where only replayer() serves: a launch with a tensor map, a binary not loaded on
        `device` yet, a driver without the extension, another device's context current, an empty grid, a cooperative
        grid too large."""
        drv, functions = self._driver, self._functions.get(device)
        if functions is None or drv is None or drv.replay_functions is None or drv.current_context_device() != device:
            return None
        where = {name: (index, offset) for name, index, offset in buffers}
        steps = []
        for launch, function, grid_of in zip(self.entry.launches, functions, self._grids):
            if launch.tma or len(launch.args) > drv.native.MAX_PARAMS:
                return None
            pack = _ArgPack(launch)
            self._bind_env(launch, pack, grid_of(env), env)
            if pack.grid is None:
                return None
            if launch.cooperative and pack.grid[0] * pack.grid[1] * pack.grid[2] > self._resident_blocks.get((device, launch.symbol), 0):
                return None  # _launch_one raises
            block = b''.join(bytes(8) if arg.kind == 'ptr' else ctypes.string_at(address, ctypes.sizeof(_SCALAR_CTYPES[arg.kind])).ljust(8, b'\0')
                             for arg, address in zip(launch.args, pack.pointers))
            slots = tuple(n for slot, arg in enumerate(launch.args) if arg.kind == 'ptr' for n in (slot, *where[arg.name]))
            attributes = launch_attributes(launch)
            steps.append((*drv.replay_functions, drv.current_context(), function.value or 0, *pack.grid, *launch.block,
                          launch.dynamic_smem, _current_stream, device, drv.check, block, slots,
                          b'' if attributes is None else bytes(attributes)))
        return tuple(steps)

    def _launch_all(self, device: int, pointers: Mapping[str, int], env: dict[str, int]) -> None:
        functions = self._functions.get(device) or self.functions(device)
        if _thread_state.__dict__.get('device') != device:
            _ensure_context(device)
        stream = _current_stream(device)
        packs = self._packs.__dict__.get('value')
        if packs is None:
            packs = self._packs.value = [_ArgPack(launch) for launch in self.entry.launches]
        if self._plain:  # the loop below for its one launch, spelled out: this runs on every call
            pack = packs[0]
            if pack.env is not env:
                self._bind_env(self.entry.launches[0], pack, self._grids[0](env), env)
            if pack.grid is not None:
                for slot, name in pack.tensor_slots:
                    slot.value = pointers[name]
                launch = self.entry.launches[0]
                self._driver.launch(functions[0], pack.grid, launch.block, launch.dynamic_smem, stream, pack.pointers)
            return
        for launch, fn, grid_of, pack in zip(self.entry.launches, functions, self._grids, packs):
            if pack.env is not env:  # a launch plan passes the same env on every call: its grid and scalars stay
                self._bind_env(launch, pack, grid_of(env), env)
            if pack.grid is None:
                continue  # an empty grid: nothing to do
            for slot, name in pack.tensor_slots:
                slot.value = pointers[name]
            for slot in pack.map_slots:
                slot.encode(self._driver, pointers, env)
            self._launch_one(device, launch, fn, pack.grid, stream, pack.pointers)

    def _bind_env(self, launch: Launch, pack: _ArgPack, grid: tuple[int, int, int], env: dict[str, int]) -> None:
        """Check `launch`'s grid and scalar arguments for `env` and write them into its argument block."""
        pack.env = None
        if not (grid[0] and grid[1] and grid[2]):
            pack.grid = None
        elif not (0 < grid[0] <= MAX_GRID[0] and 0 < grid[1] <= MAX_GRID[1] and 0 < grid[2] <= MAX_GRID[2]):
            raise ValueError(f'{launch.symbol}: grid {grid} is outside 1..{MAX_GRID}')
        else:
            pack.grid = grid
        for slot, name, is_int32 in pack.scalar_slots:
            number = env[name]
            if is_int32 and not -_INT32_MAX - 1 <= number <= _INT32_MAX:
                raise ValueError(f"{self.entry.kernel}: {name} = {number} does not fit the kernel's 32-bit argument")
            slot.value = number
        pack.env = env

    def _launch_one(self, device: int, launch: Launch, fn, grid: tuple[int, int, int], stream: int, params) -> None:
        drv = self._driver
        block = launch.block
        attributes = launch_attributes(launch)
        if attributes is None:
            drv.launch(fn, grid, block, launch.dynamic_smem, stream, params)
            return
        if launch.cooperative:
            resident = self._resident_blocks[(device, launch.symbol)]
            if grid[0] * grid[1] * grid[2] > resident:
                raise ValueError(f'{launch.symbol}: a cooperative grid of {grid} exceeds the {resident} blocks that fit on device {device} at once')
        config = _driver.CUlaunchConfig(*grid, *block, launch.dynamic_smem, stream, attributes, len(attributes))
        drv.call('cuLaunchKernelEx', ctypes.byref(config), fn, params, None)


def launch_attributes(launch: Launch) -> ctypes.Array | None:
    """The CUlaunchAttribute array of `launch`'s cuLaunchKernelEx (cooperative, cluster dims, programmatic dependent
    launch), or None for a launch without attributes (cuLaunchKernel). The C extension's replay passes these bytes."""
    attrs = []
    if launch.cooperative:
        a = _driver.CUlaunchAttribute(id=_driver.CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
        a.value.cooperative = 1
        attrs.append(a)
    if launch.cluster_dims:
        a = _driver.CUlaunchAttribute(id=_driver.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        a.value.cluster_dim[:] = list(launch.cluster_dims)
        attrs.append(a)
    if launch.pdl:
        a = _driver.CUlaunchAttribute(id=_driver.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        a.value.programmatic_stream_serialization_allowed = 1
        attrs.append(a)
    return (_driver.CUlaunchAttribute * len(attrs))(*attrs) if attrs else None


def _grid_function(axes) -> Callable[[Mapping[str, int]], tuple[int, int, int]]:
    """The grid of a launch as one function of the bound dims; the axes that are constants (most y and z) are not
    evaluated on every call."""
    x, y, z = (compile_expr(axis) for axis in axes)
    if all(isinstance(axis, int) for axis in axes):
        constant = tuple(axes)
        return lambda env: constant
    if isinstance(axes[1], int) and isinstance(axes[2], int):
        cy, cz = axes[1], axes[2]
        return lambda env: (x(env), cy, cz)
    return lambda env: (x(env), y(env), z(env))


def _blocks_per_sm(drv: _driver.Driver, fn, launch: Launch) -> int:
    """CTAs of `launch` that fit on one multiprocessor at once, by the driver's occupancy calculator."""
    return drv.max_active_blocks(fn, launch.block[0] * launch.block[1] * launch.block[2], launch.dynamic_smem)


def _ensure_context(device: int) -> None:
    """Make sure this thread's current CUDA context is `device`'s primary context (the one torch uses).
    A thread that never touched CUDA has none yet; torch's set_device binds it."""
    drv = _driver.driver()
    if drv.current_context_device() is None:
        torch.cuda.set_device(device)
    current = drv.current_context_device()
    if current != device:
        raise TileKernelsAOTError(f'the current CUDA context is on device {current}, expected device {device}')
    _thread_state.device = device


def _current_stream_public(device: int) -> int:
    return torch.cuda.current_stream(device).cuda_stream


# torch's own launchers (Triton's, Inductor's) read the raw stream and device through these; they cost
# a fraction of a microsecond where the public wrappers build Python objects. Fall back if they vanish.
_current_stream = getattr(torch._C, '_cuda_getCurrentRawStream', None) or _current_stream_public
_current_device = getattr(torch._C, '_cuda_getDevice', None) or torch.cuda.current_device
