"""Checks of a command's paths before any work starts (no compile, no generator, no GPU): an
output that cannot be written, or an interpreter that does not exist, is one clear message and
exit 2 with nothing changed, not a traceback after minutes of work.

The one owner of these checks: every output of every stage (`--prefix`, `--build-dir`, `--out`,
`--json`, `--md`, `--keep`, `--prune-to`, `--tuning-report`, `--cache-dir`, the user's cache
folders under $MI100_CODEGEN_CACHE / $XDG_CACHE_HOME / $HOME) goes through `output_file`,
`output_dir` or `cache_folder` before the stage starts its work; `path_option` is the Typer
parser of those options (an empty string is refused instead of meaning the working directory)."""

from __future__ import annotations

import datetime
import math
import os
import re
import shutil
from pathlib import Path

from codegen.core.errors import UserError
from codegen.core.resources import cache_origin, user_cache_dir


def _bad_parameter(message: str) -> Exception:
    """The usage error (exit 2) of a Typer parser or callback below."""
    # start-up: typer loads only on these error paths: scripts and library callers never need it
    # (the CLI, whose parsers these are, has it loaded)
    import typer

    return typer.BadParameter(message)


def path_option(value: str | Path | None) -> Path | None:
    """Typer parser of a path option (`parser=preflight.path_option`): the path as given, but an
    empty string is a usage error (exit 2): Path('') would silently mean the working directory."""
    if value is None or isinstance(value, Path):
        return value
    if not value.strip():
        raise _bad_parameter("an empty path names no file or folder")
    if "\0" in value:
        raise _bad_parameter("a path cannot contain a NUL character")
    return Path(value)


def finite(value: float | None) -> float | None:
    """Typer callback of a number option (a timeout, a budget): finite (`nan` passes Typer's
    `min=` check, since every comparison with nan is false; `inf` would never end)."""
    if value is not None and not math.isfinite(value):
        raise _bad_parameter(f"{value} is not a finite number")
    return value


def iso_date(value: str | None) -> str | None:
    """Typer callback of a `--date`: a real calendar date spelled YYYY-MM-DD (it is recorded in
    the CSVs, whose reader checks the same)."""
    if value is None:
        return None
    try:
        ok = re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", value) and datetime.date.fromisoformat(value)
    except ValueError:
        ok = False
    if not ok:
        raise _bad_parameter(f"{value!r} is not a date like 2026-11-24 (YYYY-MM-DD)")
    return value


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not _exists(p) and p != p.parent:
        p = p.parent
    return p


def _exists(p: Path) -> bool:
    try:
        os.lstat(p)
        return True
    except OSError:
        return False


def _writable_parent(path: Path, option: str) -> None:
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise UserError(f"{option} {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {base} is not writable"
                        + (" (a read-only file system)" if _read_only_fs(base) else ""))


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def output_file(path: Path | None, option: str) -> None:
    """`path` can be written as a file (created with its parent folders if needed)."""
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{option} {path}: is a directory, expected a file name")
    if path.is_symlink() and not path.exists():
        raise UserError(f"{option} {path}: a symbolic link that leads nowhere (or a link loop)")
    if path.exists() and not path.is_file():  # outputs are replaced by a rename: never a device or FIFO
        raise UserError(f"{option} {path}: not a regular file (a device, FIFO or socket); "
                        "outputs are written to a new file and renamed into place")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{option} {path}: not writable")
    _writable_parent(path, option)


def output_dir(path: Path | None, option: str) -> None:
    """`path` is a folder we may write into, or can be created as one."""
    if path is None:
        return
    path = Path(path)
    if _exists(path) and not path.is_dir():
        what = "a symbolic link that leads nowhere (or a link loop)" if not path.exists() else "is a file"
        raise UserError(f"{option} {path}: {what}, expected a directory")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: not writable"
                        + (" (a read-only file system)" if _read_only_fs(path) else ""))
    _writable_parent(path, option)


def cache_folder(name: str) -> Path:
    """The user's cache folder `name` (`resources.user_cache_dir`), checked like an output
    folder; a problem names the environment variable that put it there."""
    try:
        path = user_cache_dir(name)
    except RuntimeError as exc:  # no $HOME and no passwd entry
        raise UserError(f"cannot place the cache folder: {exc}",
                        hint="set MI100_CODEGEN_CACHE to a writable folder") from None
    try:
        output_dir(path, "cache folder")
    except UserError as exc:
        origin = cache_origin()
        raise UserError(f"{exc.message} (the folder comes from ${origin})",
                        hint=f"point {origin} at a writable folder"
                             + (", or set MI100_CODEGEN_CACHE to one" if origin != "MI100_CODEGEN_CACHE" else "")
                        ) from None
    return path


def input_file(path: Path | None, option: str) -> None:
    """`path`, when given, is an existing readable file."""
    if path is None:
        return
    path = Path(path)
    if not path.is_file():
        why = ("is a directory" if path.is_dir() else "not a regular file (a FIFO, device or socket)"
               if path.exists() else "a symbolic link that leads nowhere (or a link loop)"
               if path.is_symlink() else "no such file")
        raise UserError(f"{option} {path}: {why}")


def interpreter(python: str, option: str = "--python") -> str:
    """The absolute path of an existing, executable interpreter (a bare name is looked up on PATH)."""
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK)
                                                                and Path(python).is_file() else None)
    if not found:
        raise UserError(f"{option} {python}: no such executable",
                        hint="pass a Python that has the tree's generator requirements (pandas, ...)")
    # absolute, so that it still names the same file when a command runs in the tree's folder;
    # not resolved: a venv's python is a link whose location decides the venv
    return os.path.abspath(found)
