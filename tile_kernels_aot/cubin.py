"""What a cubin's ELF header says about it, and whether its tables fit in the file.

The header carries the SM number (bits 8-15 of e_flags: 90, 100, ...) but not the `a`/`f` suffix, so
the exact target lives in the manifest; this check only catches a binary filed under the wrong arch.
The layout check catches a truncated cubin before the driver sees it: cuModuleLoadData may crash the process
on one rather than refuse it.
"""

from __future__ import annotations

import struct

_ELF_MAGIC = b'\x7fELF'
_ELFCLASS64 = 2
_EM_CUDA = 190
_SHT_NOBITS = 8  # a section with no bytes in the file (.bss, .nv.shared.*)
_SECTION_HEADER, _PROGRAM_HEADER = 64, 56  # ELF64 entry sizes


def cubin_sm(data: bytes) -> int:
    """The SM number a cubin was compiled for; ValueError if the bytes are not a 64-bit CUDA ELF."""
    if len(data) < 64 or data[:4] != _ELF_MAGIC or data[4] != _ELFCLASS64:
        raise ValueError('not a 64-bit ELF file')
    (machine,) = struct.unpack_from('<H', data, 18)
    if machine != _EM_CUDA:
        raise ValueError(f'ELF machine is {machine}, not CUDA ({_EM_CUDA})')
    (flags,) = struct.unpack_from('<I', data, 48)
    return (flags >> 8) & 0xFF


def check_layout(data: bytes) -> None:
    """ValueError unless the program and section header tables of the 64-bit ELF `data` (its header already checked
    by cubin_sm) and every section's and segment's bytes lie within it."""
    size = len(data)
    phoff, shoff = struct.unpack_from('<QQ', data, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from('<HHHH', data, 54)
    for what, offset, count, entry, least in (('program header table', phoff, phnum, phentsize, _PROGRAM_HEADER),
                                              ('section header table', shoff, shnum, shentsize, _SECTION_HEADER)):
        if count and entry < least:
            raise ValueError(f'its {what} has {entry}-byte entries, not {least}: a malformed ELF file')
        if count and offset + count * entry > size:
            raise ValueError(f'its {what} ends at byte {offset + count * entry} of {size}: the file is truncated')
    for i in range(shnum):
        (kind,) = struct.unpack_from('<I', data, shoff + i * shentsize + 4)
        offset, length = struct.unpack_from('<QQ', data, shoff + i * shentsize + 24)
        if kind != _SHT_NOBITS and offset + length > size:
            raise ValueError(f'section {i} ends at byte {offset + length} of {size}: the file is truncated')
    for i in range(phnum):
        (offset,) = struct.unpack_from('<Q', data, phoff + i * phentsize + 8)
        (length,) = struct.unpack_from('<Q', data, phoff + i * phentsize + 32)
        if offset + length > size:
            raise ValueError(f'segment {i} ends at byte {offset + length} of {size}: the file is truncated')


def target_sm(target: str) -> int:
    """'sm_90a' -> 90, 'sm_100f' -> 100."""
    return int(target[3:].rstrip('af'))
