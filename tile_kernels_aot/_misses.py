"""Spec-miss recording: TILE_KERNELS_AOT_RECORD_MISSES=FILE appends every spec a call needed and no installed binary
provides to FILE, one JSON object a line, in the form `python -m build_tools --specs FILE` reads:

    {"kernel": "moe.topk_gate", "params": {"num_experts": 200, "num_topk": 8}}

A fleet points the variable at a file per host (or a shared one), runs its traffic, and feeds the file to the next
build. Each spec appears once: the writer takes an exclusive flock on the file, reads it, and appends its line with one
O_APPEND write only when no line already names that spec, so processes that miss at once neither lose nor repeat a
line. A file that cannot be written gives a RuntimeWarning naming it and the reason; the op's SpecNotPrebuiltError is
raised either way, so recording never changes what a call does.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Mapping

RECORD_MISSES_ENV = 'TILE_KERNELS_AOT_RECORD_MISSES'

_lock = threading.Lock()
# (device, inode, line) of every line this process wrote or found, so that an op missing on every call re-reads the
# file once per spec, not once per call; a file replaced or removed (a build consumed it) has a new inode.
_known: set[tuple[int, int, str]] = set()


def miss_line(kernel: str, params: Mapping[str, object]) -> str:
    """The spec as one line of the file (no newline): keys in the order the op gave them, so that a line is stable."""
    return json.dumps({'kernel': kernel, 'params': dict(params)})


def record_miss(kernel: str, params: Mapping[str, object]) -> None:
    """Append the spec to the file TILE_KERNELS_AOT_RECORD_MISSES names, unless it is unset or already lists the spec."""
    path = os.environ.get(RECORD_MISSES_ENV)
    if not path:
        return
    path = os.path.expanduser(path)
    line = miss_line(kernel, params)
    try:
        with _lock:
            _append_once(path, line)
    except OSError as exc:
        warnings.warn(f'{RECORD_MISSES_ENV}={path}: cannot record the missing spec {line} '
                      f'({exc.strerror or exc}); the call raises SpecNotPrebuiltError as usual',
                      RuntimeWarning, stacklevel=2)


def _append_once(path: str, line: str) -> None:
    import fcntl

    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino, line) in _known:
            return
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        st = os.fstat(fd)
        recorded = _spec_lines(_read_all(fd))
        if _canonical(line) not in recorded:
            data = ('\n' if _ends_without_newline(fd, st.st_size) else '') + line + '\n'
            if os.write(fd, data.encode()) != len(data.encode()):
                raise OSError(f'short write to {path}')
        _known.add((st.st_dev, st.st_ino, line))
    finally:
        os.close(fd)  # closing releases the flock


def _read_all(fd: int) -> bytes:
    chunks, offset = [], 0
    while True:
        chunk = os.pread(fd, 1 << 16, offset)
        if not chunk:
            return b''.join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _ends_without_newline(fd: int, size: int) -> bool:
    """A file whose last line someone wrote by hand without a newline: the new line must not join it."""
    return size > 0 and os.pread(fd, 1, size - 1) != b'\n'


def _canonical(line: str) -> str | None:
    """A line's spec with its parameters in sorted order, or None for a line that is not a spec."""
    try:
        item = json.loads(line)
    except ValueError:
        return None
    if not isinstance(item, dict) or not isinstance(item.get('params'), dict):
        return None
    return json.dumps([item.get('kernel'), item['params']], sort_keys=True)


def _spec_lines(data: bytes) -> set[str | None]:
    return {_canonical(text) for text in data.decode(errors='replace').splitlines() if text.strip()}
