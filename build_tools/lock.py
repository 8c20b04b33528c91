"""One build per build folder at a time.

Two builds writing one folder would interleave lowered sources, cubins and the manifest. build() holds an
exclusive flock on ``<build folder>/.lock`` for its whole run and a second build is refused at once with the
first one's process id. The kernel drops a flock when its process exits, however it exits (SIGKILL included),
so a lock file left by a dead build is simply taken: there is no stale lock to clear by hand. The file stays
between builds; it holds the id of the process that has it, for the message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from build_tools.util import BuildError

LOCK_NAME = '.lock'


class BuildLock:
    """``with BuildLock(build_dir):`` the build folder is this process's until the block ends."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = Path(build_dir)
        self.path = self.build_dir / LOCK_NAME
        self._fd: int | None = None

    def __enter__(self) -> BuildLock:
        self.build_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by nvcc, ninja or the lowering workers
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors='replace').strip() or 'unknown'
            os.close(fd)
            raise BuildError(f'another build (process {holder}) is using the build folder {self.build_dir}; wait for it to '
                             'finish, or give this one another --build-dir') from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f'{os.getpid()}\n'.encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor drops the flock
