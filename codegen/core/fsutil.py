"""Atomic file writes shared by every stage: write a sibling temp file, then `os.replace`, so a
reader sees the old bytes or the new ones, never a torn file; a failure leaves no temp behind.
The one place (with the apply journal) that renames files into place. Also the two rules for
reading what we did not write: `read_input`/`open_input` (a bounded regular file, never a FIFO or a device)
and `trusted_storage` (a folder or file we believe without checking each byte: only this user
can have written it); and the sha256 of bytes and of a file (read in pieces)."""

from __future__ import annotations

import errno
import grp
import hashlib
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from codegen.core.errors import UntrustedStorage, UserError
from codegen.core.ui import printable

CHUNK = 1 << 20   # bytes of one read of a file being hashed


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


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


def stage_write(dest: str | Path, data: bytes, *, mode: int = 0o644, suffix: str = ".tmp") -> Path:
    """Write `data` to a new temporary sibling of `dest` and return its path; `move_into_place`
    then makes it `dest`. For writers that stage several files before renaming any (render's
    overlay directory): a failure while staging leaves every destination untouched."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix, dir=dest.parent)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)  # mkstemp creates 0600
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return Path(tmp)


def move_into_place(src: str | Path, dest: str | Path) -> None:
    """Rename a staged file (or a staged directory) to `dest` in one step: readers see the old
    entry or the new one, never a mix."""
    os.replace(src, dest)


def atomic_copy(src: str | Path, dest: str | Path) -> None:
    """Copy the bytes, mode and mtime of `src` to `dest` through a synced temporary sibling and a
    rename (the file is never seen half-copied)."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.mi100-tmp")
    try:
        shutil.copy2(src, tmp, follow_symlinks=True)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


INPUT_LIMIT = 64 << 20  # bytes: no data file, state file or spec of ours comes near it


def open_input(path: str | Path, *, what: str = "file", limit: int = INPUT_LIMIT, trusted: bool = False) -> BinaryIO:
    """An input file that may be anything (see `read_input`), opened to be read in pieces: a
    regular file of at most `limit` bytes now, else one UserError naming the path (nothing read).
    `trusted`: as `read_input`'s."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if trusted else 0))
    except OSError as exc:
        why = {errno.ELOOP: "a symbolic link" if trusted else "a symbolic-link loop", errno.ENOENT: "does not exist",
               errno.ENOTDIR: "a component of the path is not a directory"}.get(exc.errno, exc.strerror or str(exc))
        raise (UntrustedStorage if trusted and exc.errno == errno.ELOOP else UserError)(
            f"{path}: cannot read this {what}: {why}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise UserError(f"{path}: this {what} is {kind}, not a regular file")
        why = _distrust(st) if trusted else None
        if why:
            raise UntrustedStorage(f"{path}: this {what} {why}")
        if st.st_size > limit:
            raise UserError(f"{path}: this {what} is larger than {limit:,} bytes; refusing to read it")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | Path, *, what: str = "file", limit: int = INPUT_LIMIT, trusted: bool = False) -> bytes:
    """The bytes of an input file that may be anything: a FIFO (never waited on), a device, a
    directory, a symbolic-link loop, a file that grows without end. Only a regular file of at
    most `limit` bytes is read; anything else is one UserError naming the path. `trusted`: the
    file must also be trusted storage (`trusted_storage`, checked on the open file itself, the
    last component never followed if it is a link): else UntrustedStorage."""
    with open_input(path, what=what, limit=limit, trusted=trusted) as fh:
        chunks, size = [], 0
        while True:
            try:
                chunk = fh.read(1 << 20)
            except OSError as exc:
                raise UserError(f"{path}: cannot read this {what}: {exc.strerror or exc}") from None
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise UserError(f"{path}: this {what} is larger than {limit:,} bytes; refusing to read it")
            chunks.append(chunk)
        return b"".join(chunks)


def _own_group(gid: int) -> bool:
    """True for the user's private group (the user's primary group, named after the user, no
    other member): what a umask of 002 leaves writable is then still only the user's."""
    try:
        user, group = pwd.getpwuid(os.geteuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == user.pw_gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _distrust(st: os.stat_result, sticky_ok: bool = False) -> str | None:
    """Why someone other than this user (or root) could have changed what `st` describes, or None:
    another owner, or a write bit for others or for a group other than the user's private group.
    `sticky_ok`: a folder of this user's with the sticky bit may be writable by others (they can
    add entries to it, never remove or rename this user's: each entry is then checked itself)."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"belongs to uid {st.st_uid}, not to you (uid {me}) or root: its owner could have written anything into it"
    if sticky_ok and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == me:
        return None
    others = [w for w, bit in (("group", 0o020), ("others", 0o002))
              if st.st_mode & bit and not (w == "group" and _own_group(st.st_gid))]
    if others:
        return (f"is writable by {' and '.join(others)} (mode {stat.S_IMODE(st.st_mode):04o}): any of them could "
                "have written anything into it")
    return None


def trusted_storage(path: str | Path, *, what: str, sticky_ok: bool = False, hint: str | None = None) -> None:
    """Refuse (UntrustedStorage, a UserError, with the fix) `path` unless only this user (or root)
    can have changed it, the rule ssh applies to the files it trusts without checking each byte:
    it exists, is no symbolic link, is owned by this user or root, and no one else may write it
    (no write bit for others, nor for a group other than the user's private group; `sticky_ok`:
    see `_distrust`). `hint` is added to the fix."""
    path = Path(path)
    more = f"; {hint}" if hint else ""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot check this {what} ({exc.strerror or exc})") from None
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedStorage(f"{path}: this {what} is a symbolic link (to {printable(os.readlink(path))}); "
                               "refusing to follow it", hint=f"use the real path, or remove the link: rm {path}{more}")
    why = _distrust(st, sticky_ok)
    if why:
        fix = (f"check what it holds, then take it over: chown -R {os.geteuid()} {path}" if why.startswith("belongs")
               else f"check what it holds, then: chmod go-w {path}")
        raise UntrustedStorage(f"{path}: this {what} {why}", hint=fix + more)
