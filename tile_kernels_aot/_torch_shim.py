"""torch's C entry points for the C extension's replay (tile_kernels_aot._driver_native): the shim through which it
allocates a call's outputs, and the DLPack exchange API through which it reads the argument tensors.

AOTInductor's compiled models allocate through a small C ABI that torch exports from libtorch_cpu
(torch/csrc/inductor/aoti_torch/c/shim.h): ``aoti_torch_empty_strided`` makes a tensor, a handle to it, from sizes,
strides and integer codes for the dtype and device; ``aoti_torch_zero_`` zeroes one; ``aoti_torch_get_data_ptr`` reads
its address; ``aoti_torch__reinterpret_tensor`` makes a view of one (a returned view of an allocation's own dtype);
``aoti_torch_delete_tensor_object`` drops the handle. ``torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr``
turns a handle into a Python tensor, as torch's AOTInductor runner does with a model's outputs. Called in C, these
skip the parsing of torch's Python bindings, which is most of an allocation's or a view's host time.

Nothing here is built or linked: the functions are looked up by name in the libtorch_cpu that ``import torch`` loaded,
and each (dtype, device) is checked once by allocating through them and comparing the tensor made. Where a function is
missing or the check fails, :func:`allocation` gives None and the replay allocates through torch's Python API.

torch (2.10 on) also gives every tensor type the DLPack exchange API (dlpack.h's DLPackExchangeAPI, a table of C
functions in the capsule ``torch.Tensor.__dlpack_c_exchange_api__``): :func:`exchange` hands it to the extension, whose
signatures read each argument tensor's address, sizes, strides and device through it rather than through five Python
calls. ``TILE_KERNELS_AOT_TORCH_SHIM=0`` (read at import) chooses torch's Python API for both.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

import torch

from tile_kernels_aot import config

SHIM_ENV = 'TILE_KERNELS_AOT_TORCH_SHIM'
MAX_DIMS = 16  # dims of a tensor the replay allocates through the shim (_driver_native.c's MAX_DIMS)
_FUNCTIONS = ('aoti_torch_empty_strided', 'aoti_torch_zero_', 'aoti_torch_get_data_ptr', 'aoti_torch_delete_tensor_object',
              'aoti_torch__reinterpret_tensor')


@functools.cache
def _library() -> ctypes.CDLL | None:
    """torch's libtorch_cpu, as loaded by ``import torch`` (RTLD_NOLOAD: never a second copy), or None."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so'), mode=os.RTLD_NOLOAD)
        for name in _FUNCTIONS:
            getattr(lib, name)
    except (OSError, AttributeError):
        return None
    lib.aoti_torch_empty_strided.argtypes = (ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                                             ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))
    lib.aoti_torch_delete_tensor_object.argtypes = (ctypes.c_void_p,)
    return lib


def functions() -> tuple | None:
    """(the addresses of aoti_torch_empty_strided, aoti_torch_zero_, aoti_torch_get_data_ptr,
    aoti_torch_delete_tensor_object and aoti_torch__reinterpret_tensor, the function that turns a handle into a tensor),
    as the extension's bind_shim takes them, or None where torch lacks any of them or TILE_KERNELS_AOT_TORCH_SHIM=0."""
    if not _enabled:
        return None
    lib = _library()
    steal = getattr(getattr(torch._C, '_aoti', None), 'alloc_tensor_by_stealing_from_void_ptr', None)
    if lib is None or steal is None:
        return None
    return (*(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _FUNCTIONS), steal)


_enabled = config.env_switch(SHIM_ENV, True)


def exchange() -> object | None:
    """torch's DLPack exchange API, the capsule ``torch.Tensor.__dlpack_c_exchange_api__``, as the extension's
    bind_exchange takes it (its ``dltensor_from_py_object_no_sync`` reads a tensor's address, sizes, strides and device
    without a Python call), or None where torch has none (before 2.10) or TILE_KERNELS_AOT_TORCH_SHIM=0."""
    return getattr(torch.Tensor, '__dlpack_c_exchange_api__', None) if _enabled else None


def allocation(dtype: torch.dtype, device: torch.device, shape: tuple[int, ...], stride: tuple[int, ...], zeros: bool) -> bytes | None:
    """A replayed allocation as the extension reads it: int64s (number of dims, dtype code, device type code, device
    index, 1 to zero the tensor, then its sizes, then its strides). None where the shim cannot make it."""
    codes = _codes(dtype, device)
    if codes is None or len(shape) > MAX_DIMS:
        return None
    return struct.pack(f'={5 + 2 * len(shape)}q', len(shape), *codes, int(zeros), *shape, *stride)


@functools.cache
def _codes(dtype: torch.dtype, device: torch.device) -> tuple[int, int, int] | None:
    """The shim's (dtype, device type, device index) for `dtype` and `device`, once an empty tensor made with them
    through the shim has that dtype and device; else None."""
    lib = _library()
    dtype_code = getattr(lib, 'aoti_torch_dtype_' + str(dtype).removeprefix('torch.'), None) if lib else None
    device_code = getattr(lib, f'aoti_torch_device_type_{device.type}', None) if lib else None
    if functions() is None or dtype_code is None or device_code is None:
        return None
    dtype_code.restype = device_code.restype = ctypes.c_int32
    codes = dtype_code(), device_code(), -1 if device.index is None else device.index
    try:
        made = _made(lib, codes)
    except Exception:  # noqa: BLE001 - any failure means the shim does not serve this dtype and device
        return None
    return codes if made is not None and made.dtype == dtype and made.device == device else None


def _made(lib: ctypes.CDLL, codes: tuple[int, int, int]) -> torch.Tensor | None:
    """An empty tensor allocated through the shim with `codes`, as the extension makes one; None on the shim's error."""
    size, stride, handle = ctypes.c_int64(0), ctypes.c_int64(1), ctypes.c_void_p()
    if lib.aoti_torch_empty_strided(1, ctypes.byref(size), ctypes.byref(stride), *codes, ctypes.byref(handle)):
        return None
    try:
        capsule = ctypes.pythonapi.PyCapsule_New
        capsule.restype, capsule.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
        return torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(capsule(handle, None, None))
    finally:
        lib.aoti_torch_delete_tensor_object(handle)
