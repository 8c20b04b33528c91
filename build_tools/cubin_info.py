"""What ptxas recorded about a cubin's kernels: the per-thread local memory (stack frame) of each function.

A nonzero frame means register spills or a local array that lives in memory: for these kernels, which keep
their working set in registers by design, it is a regression the build should stop on (SM100's ptxas can spill
code that sm_90a's keeps in registers). nvcc's -w would hide its spill warnings, and cuobjdump is
not installed with nvcc on the build machine, so the numbers are read from the ELF: section `.nv.info` holds
EIATTR_FRAME_SIZE records (attribute 0x11, format 4: a symbol index and a byte count).
"""

from __future__ import annotations

import struct

_EIATTR_FRAME_SIZE = 0x11
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


def _section(data: bytes, wanted: str) -> bytes:
    (shoff,) = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    headers = [struct.unpack_from('<IIQQQQ', data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    for name, _type, _flags, _addr, offset, size in headers:
        end = data.index(b'\0', names_offset + name)
        if data[names_offset + name:end].decode() == wanted:
            return data[offset:offset + size]
    return b''


def frame_bytes(data: bytes) -> int:
    """The largest per-thread stack frame (bytes of local memory) of any function in the cubin."""
    info, i, largest = _section(data, '.nv.info'), 0, 0
    while i + 2 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from('<H', info, i + 2)
            if attr == _EIATTR_FRAME_SIZE and size == 8:
                largest = max(largest, struct.unpack_from('<II', info, i + 4)[1])
            i += 4 + size
        elif fmt in (_EIFMT_BVAL, _EIFMT_HVAL):
            i += 4
        elif fmt == _EIFMT_NVAL:
            i += 2
        else:
            raise ValueError(f'.nv.info: unknown record format {fmt} at byte {i}')
    return largest
