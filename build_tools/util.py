"""Small helpers shared by the build steps."""

from __future__ import annotations

import hashlib
import json
import os
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
