"""Small helpers shared by the build steps."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path


class BuildError(RuntimeError):
    """A build step failed; the message names the kernel, spec and arch involved."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stable_json(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(',', ':'))


def write_if_different(path: Path, content: str | bytes) -> bool:
    """Write atomically, and only when the content changed, so that ninja sees unchanged files as old."""
    path = Path(path)
    data = content.encode() if isinstance(content, str) else content
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


def duration(seconds: float) -> str:
    """'42 s' below two minutes, '14.5 min' above."""
    return f'{seconds:.0f} s' if seconds < 120 else f'{seconds / 60:.1f} min'


class Progress:
    """Elapsed time of a phase of `total` similar steps, and an estimate of the rest from the rate so far."""

    def __init__(self, total: int, clock=time.monotonic) -> None:
        self.total, self.clock, self.start = total, clock, clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def status(self, done: int) -> str:
        elapsed = self.elapsed
        if done <= 0 or done >= self.total:
            return duration(elapsed)
        return f'{duration(elapsed)}, about {duration(elapsed / done * (self.total - done))} left'

    def summary(self, noun: str, workers: str) -> str:
        """'460 cubins in 5.2 min (0.7 s per cubin on this machine with 2 jobs)'."""
        elapsed = self.elapsed
        per = elapsed / self.total if self.total else 0.0
        return f'{plural(self.total, noun)} in {duration(elapsed)} ({per:.1f} s per {noun} on this machine with {workers})'


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    return f'{count} {noun if count == 1 else nouns or noun + "s"}'
