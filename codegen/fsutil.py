"""Atomic file writes shared by every stage: write a sibling temp file, then `os.replace`, so a
reader sees the old bytes or the new ones, never a torn file; a failure leaves no temp behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | Path, data: bytes | str, *, mode: int = 0o644) -> None:
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_if_changed(path: str | Path, data: bytes | str, *, mode: int = 0o644) -> bool:
    """atomic_write unless the file already holds exactly these bytes; True when it changed."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if path.is_file() and path.read_bytes() == raw:
        return False
    atomic_write(path, raw, mode=mode)
    return True
