"""Checks of a command's paths before any work starts (no compile, no generator, no GPU): an
output that cannot be written, or an interpreter that does not exist, is one clear message and
exit 2 with nothing changed, not a traceback after minutes of work."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import UserError


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _writable_parent(path: Path, option: str) -> None:
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise UserError(f"{option} {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {base} is not writable")


def output_file(path: Path | None, option: str) -> None:
    """`path` can be written as a file (created with its parent folders if needed)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a directory, expected a file name")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{option} {path}: not writable")
    _writable_parent(path, option)


def output_dir(path: Path | None, option: str) -> None:
    """`path` is a folder we may write into, or can be created as one."""
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: is a file, expected a directory")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: not writable")
    _writable_parent(path, option)


def input_file(path: Path | None, option: str) -> None:
    """`path`, when given, is an existing readable file."""
    if path is None:
        return
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{option} {path}: " + ("is a directory" if path.is_dir() else "no such file"))


def interpreter(python: str, option: str = "--python") -> str:
    """The absolute path of an existing, executable interpreter (a bare name is looked up on PATH)."""
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK)
                                                                and Path(python).is_file() else None)
    if not found:
        raise UserError(f"{option} {python}: no such executable",
                        hint="pass a Python that has the tree's generator requirements (pandas, ...)")
    return found
