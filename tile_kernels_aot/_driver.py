"""ctypes bindings to the CUDA driver (libcuda.so.1), opened on first use.

Importing this module loads nothing: a machine with no GPU or no driver can import the package, and the
first kernel call then raises CudaDriverError naming what is missing. Every call's CUresult is checked
and turned into an exception that carries the function and the driver's error name and text.

Where the runtime's C extension tile_kernels_aot._driver_native is installed (and TILE_KERNELS_AOT_NATIVE_LAUNCH is not
0, see native_extension), it makes the cuLaunchKernel call of Driver.launch, and it replays simple launch plans
(tile_kernels_aot._plans) whole, calling cuCtxGetCurrent, cuLaunchKernel and cuLaunchKernelEx by the addresses in
Driver.replay_functions. For cuLaunchKernelEx it fills a CUlaunchConfig laid out as the one below (and cuda.h's), with the
CUlaunchAttribute array that LoadedKernel's launch builds here in ctypes (_launch.launch_attributes), as its bytes.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

from tile_kernels_aot import config
from tile_kernels_aot.errors import CudaDriverError

CUDA_SUCCESS = 0
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH = 95
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6

CUresult = ctypes.c_int
CUdevice = ctypes.c_int
CUcontext = ctypes.c_void_p
CUmodule = ctypes.c_void_p
CUfunction = ctypes.c_void_p
CUstream = ctypes.c_void_p


class CUlaunchAttributeValue(ctypes.Union):
    _fields_ = [('pad', ctypes.c_char * 64), ('cooperative', ctypes.c_int), ('cluster_dim', ctypes.c_uint * 3),
                ('programmatic_stream_serialization_allowed', ctypes.c_int)]


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [('id', ctypes.c_int), ('pad', ctypes.c_char * 4), ('value', CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    _fields_ = [
        ('gridDimX', ctypes.c_uint), ('gridDimY', ctypes.c_uint), ('gridDimZ', ctypes.c_uint),
        ('blockDimX', ctypes.c_uint), ('blockDimY', ctypes.c_uint), ('blockDimZ', ctypes.c_uint),
        ('sharedMemBytes', ctypes.c_uint), ('hStream', CUstream),
        ('attrs', ctypes.POINTER(CUlaunchAttribute)), ('numAttrs', ctypes.c_uint),
    ]


class CUtensorMap(ctypes.Structure):
    # 128 bytes that must sit on a 64-byte boundary (the caller places it); passed by value to the kernel.
    _fields_ = [('opaque', ctypes.c_uint64 * 16)]


_SIGNATURES: dict[str, tuple[Any, ...]] = {
    'cuInit': (ctypes.c_uint,),
    'cuGetErrorName': (CUresult, ctypes.POINTER(ctypes.c_char_p)),
    'cuGetErrorString': (CUresult, ctypes.POINTER(ctypes.c_char_p)),
    'cuCtxGetCurrent': (ctypes.POINTER(CUcontext),),
    'cuCtxGetDevice': (ctypes.POINTER(CUdevice),),
    'cuDeviceGetAttribute': (ctypes.POINTER(ctypes.c_int), ctypes.c_int, CUdevice),
    'cuModuleLoadData': (ctypes.POINTER(CUmodule), ctypes.c_void_p),
    'cuModuleGetFunction': (ctypes.POINTER(CUfunction), CUmodule, ctypes.c_char_p),
    'cuFuncSetAttribute': (CUfunction, ctypes.c_int, ctypes.c_int),
    'cuOccupancyMaxActiveBlocksPerMultiprocessor': (ctypes.POINTER(ctypes.c_int), CUfunction, ctypes.c_int, ctypes.c_size_t),
    'cuLaunchKernelEx': (ctypes.POINTER(CUlaunchConfig), CUfunction, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)),
    'cuTensorMapEncodeTiled': (ctypes.POINTER(CUtensorMap), ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                               ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32),
                               ctypes.POINTER(ctypes.c_uint32), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int),
}

_lock = threading.Lock()


class Driver:
    """The subset of the driver API the loader uses. Obtain it with driver()."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = CUresult
            setattr(self, '_' + name, fn)
        # cuLaunchKernel without a prototype, for launch(): see there.
        self._launch_unprototyped = lib['cuLaunchKernel']
        self._launch_unprototyped.restype = CUresult
        self.native = _native_launcher(self._launch_unprototyped)  # None: launches go through ctypes
        # What the C extension's replay of a launch plan calls (LoadedKernel.native_steps): cuLaunchKernel, cuCtxGetCurrent,
        # and cuLaunchKernelEx for a launch with launch attributes.
        self.replay_functions = None if self.native is None else tuple(
            ctypes.cast(fn, ctypes.c_void_p).value for fn in (self._launch_unprototyped, self._cuCtxGetCurrent, self._cuLaunchKernelEx))
        self.check('cuInit', self._cuInit(0))

    def error_text(self, code: int) -> tuple[str, str]:
        name, text = ctypes.c_char_p(), ctypes.c_char_p()
        self._cuGetErrorName(code, ctypes.byref(name))
        self._cuGetErrorString(code, ctypes.byref(text))
        return (name.value or b'CUDA_ERROR_UNKNOWN').decode(), (text.value or b'unknown error').decode()

    def check(self, function: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            name, text = self.error_text(code)
            raise CudaDriverError(function, code, name, text)

    def call(self, name: str, *args: Any) -> None:
        self.check(name, getattr(self, '_' + name)(*args))

    def launch(self, fn: CUfunction, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int, params) -> None:
        """cuLaunchKernel, the one driver call on every op's path: `fn` is a CUfunction, `params` the ctypes array of
        argument pointers. Where the runtime's C extension is bound (self.native, see _native_launcher) it makes the
        call; else ctypes does, without a prototype, because ctypes' conversion of eleven prototyped arguments costs
        more than the rest of the call: the grid, block and shared-memory sizes are ints below 2**31 (the caller checks
        the grid), which ctypes passes as C ints (the same bits as the unsigned ints the driver reads), and the stream
        goes as a c_void_p, all 64 bits of it."""
        native = self.native
        if native is not None:
            code = native.launch(fn.value, grid, block, smem, stream, ctypes.addressof(params))
        else:
            code = self._launch_unprototyped(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, CUstream(stream), params, None)
        if code:
            self.check('cuLaunchKernel', code)

    def current_context(self) -> int:
        """This thread's current CUDA context, as an address (0: none)."""
        ctx = CUcontext()
        self.call('cuCtxGetCurrent', ctypes.byref(ctx))
        return ctx.value or 0

    def current_context_device(self) -> int | None:
        if not self.current_context():
            return None
        dev = CUdevice()
        self.call('cuCtxGetDevice', ctypes.byref(dev))
        return dev.value

    def device_attribute(self, attribute: int, device: int) -> int:
        v = ctypes.c_int()
        self.call('cuDeviceGetAttribute', ctypes.byref(v), attribute, device)
        return v.value

    def load_module(self, image: bytes) -> CUmodule:
        module = CUmodule()
        buf = ctypes.create_string_buffer(image, len(image))
        self.call('cuModuleLoadData', ctypes.byref(module), buf)
        return module

    def get_function(self, module: CUmodule, symbol: str) -> CUfunction:
        fn = CUfunction()
        self.call('cuModuleGetFunction', ctypes.byref(fn), module, symbol.encode())
        return fn

    def set_function_attribute(self, fn: CUfunction, attribute: int, value: int) -> None:
        self.call('cuFuncSetAttribute', fn, attribute, value)

    def max_active_blocks(self, fn: CUfunction, block_size: int, dynamic_smem: int) -> int:
        v = ctypes.c_int()
        self.call('cuOccupancyMaxActiveBlocksPerMultiprocessor', ctypes.byref(v), fn, block_size, dynamic_smem)
        return v.value


NATIVE_ENV = 'TILE_KERNELS_AOT_NATIVE_LAUNCH'


def native_extension() -> Any:
    """The C extension tile_kernels_aot._driver_native, or None where it is not installed (the pure-Python wheel) or
    TILE_KERNELS_AOT_NATIVE_LAUNCH=0: then ctypes makes every driver call and launch plans replay in Python."""
    if not config.env_switch(NATIVE_ENV, True):
        return None
    try:
        from tile_kernels_aot import _driver_native
    except ImportError:
        return None
    return _driver_native


def _native_launcher(launch_kernel) -> Any:
    """native_extension() bound to `launch_kernel` (libcuda's cuLaunchKernel), or None. It makes the call that
    Driver.launch makes through ctypes, with the arguments converted in C."""
    native = native_extension()
    if native is not None:
        native.bind(ctypes.cast(launch_kernel, ctypes.c_void_p).value)
    return native


@functools.cache
def _load() -> Driver:
    try:
        lib = ctypes.CDLL('libcuda.so.1')
    except OSError as exc:
        raise CudaDriverError('dlopen', -1, 'LIBCUDA_NOT_FOUND', f'cannot load libcuda.so.1 ({exc}); is an NVIDIA driver installed?') from None
    return Driver(lib)


def driver() -> Driver:
    with _lock:
        return _load()
