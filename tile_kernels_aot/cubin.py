"""What a cubin's ELF header says about it.

The header carries the SM number (bits 8-15 of e_flags: 90, 100, ...) but not the `a`/`f` suffix, so
the exact target lives in the manifest; this check only catches a binary filed under the wrong arch.
"""

from __future__ import annotations

import struct

_ELF_MAGIC = b'\x7fELF'
_ELFCLASS64 = 2
_EM_CUDA = 190


def cubin_sm(data: bytes) -> int:
    """The SM number a cubin was compiled for; ValueError if the bytes are not a 64-bit CUDA ELF."""
    if len(data) < 64 or data[:4] != _ELF_MAGIC or data[4] != _ELFCLASS64:
        raise ValueError('not a 64-bit ELF file')
    (machine,) = struct.unpack_from('<H', data, 18)
    if machine != _EM_CUDA:
        raise ValueError(f'ELF machine is {machine}, not CUDA ({_EM_CUDA})')
    (flags,) = struct.unpack_from('<I', data, 48)
    return (flags >> 8) & 0xFF


def target_sm(target: str) -> int:
    """'sm_90a' -> 90, 'sm_100f' -> 100."""
    return int(target[3:].rstrip('af'))
