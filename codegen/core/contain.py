"""The containment rule: a path read from a file we did not just write ourselves (a tree's lock or
journal, an overlay's manifest, a bundle's member list, a cache entry) names something inside
one root folder, or we refuse it.

Every such path goes through `rel_path` when it is read (the state-file models use `RelPath`,
which calls it) and through `inside` when it is used:

- `rel_path`: syntax. A non-empty relative POSIX path, no `..`, no `.` or empty component, no
  absolute path, no backslash, NUL or other control character, no component of a reserved name
  the caller passes (e.g. `.git`).
- `inside`: the filesystem. Every existing component below the root is a real directory (a
  symbolic link on the way is refused, whether it points in or out); the last component may be a
  link only when the caller asks (`final_link=True`: deleting a link deletes the link itself).
- `perm_bits`: a mode read from a state file is masked to the permission bits (no setuid,
  setgid or sticky bit is ever set from a recorded mode).

A refusal is `Escape`, a `UserError` whose callers add what was damaged and how to recover (see
`codegen.apply.lock` and `codegen.apply.journal`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Annotated, Iterable

from pydantic import AfterValidator

from codegen.core.errors import UserError
from codegen.core.ui import printable

PERM_BITS = 0o777


class Escape(UserError):
    """A path from a state file, manifest or bundle that would lead outside its root."""


def rel_path(value: str, reserved: Iterable[str] = ()) -> str:
    """`value` if it is a clean relative POSIX path (see the module doc), else ValueError."""
    if not isinstance(value, str) or not value:
        raise ValueError("an empty path")
    if len(value) > 4096:
        raise ValueError("a path longer than 4096 characters")
    if not value.isprintable() or "\\" in value:
        raise ValueError(f"{value!r} holds a control character or a backslash")
    if value.startswith("/"):
        raise ValueError(f"{value!r} is an absolute path")
    parts = value.split("/")
    bad = {"", ".", ".."} & set(parts)
    if bad:
        raise ValueError(f"{value!r} has a {sorted(bad)[-1] or 'empty'!r} component")
    hit = set(parts) & set(reserved)
    if hit:
        raise ValueError(f"{value!r} is inside {sorted(hit)[0]}/, which is never ours to change")
    return value


def _rel_path(value: str) -> str:
    return rel_path(value, (".git",))


RelPath = Annotated[str, AfterValidator(_rel_path)]
"""A field holding a path relative to the folder its file belongs to (`.git` never inside it)."""


def perm_bits(mode: int | None, default: int = 0o644) -> int:
    """A recorded mode as permission bits only."""
    return default if mode is None else int(mode) & PERM_BITS


def inside(root: Path, rel: str, *, final_link: bool = False) -> Path:
    """`root/rel` after checking `rel` (`rel_path`, `.git` reserved) and that no existing component below `root`
    is a symbolic link or a non-directory (the last one may be a link when `final_link`). The
    root itself is taken as given: the caller resolved it. Raises Escape."""
    try:
        _rel_path(rel)
    except ValueError as exc:
        raise Escape(f"{root}: {exc}") from None
    parts = rel.split("/")
    cur = root
    for n, part in enumerate(parts):
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return root.joinpath(*parts)
        except OSError as exc:
            raise Escape(f"{cur}: cannot be checked ({exc.strerror or exc})") from None
        last = n == len(parts) - 1
        if stat.S_ISLNK(st.st_mode) and not (last and final_link):
            raise Escape(f"{root}: {'/'.join(parts[:n + 1])} is a symbolic link (to {printable(os.readlink(cur))}); "
                         "refusing to follow it")
        if not last and not stat.S_ISDIR(st.st_mode):
            raise Escape(f"{root}: {'/'.join(parts[:n + 1])} is not a directory")
    return cur


def is_rel_path(value: object) -> bool:
    try:
        rel_path(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True
