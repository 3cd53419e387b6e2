"""Writing and checking a rendered overlay directory (the only filesystem side of render).

Only our own files are touched: those the render writes and those the previous render's
MANIFEST.json lists (removed when the new render no longer has them, and only while they still
hold the bytes that manifest records). A MANIFEST.json counts as ours only when it is what
render writes (`"toolkit": "mi100-codegen"`, a list of outputs with clean relative paths and
sha256s); a folder with another one is refused as "not an overlay". No path is followed through
a symbolic link below the output folder (`codegen.core.contain.inside`). Anything else in the
directory (a NOTES.txt, a README) is kept, and so are the directory and its mode. Every new file
is first written to a temporary sibling; only when all are staged are they renamed into place
(MANIFEST.json last), so a full disk or an unwritable directory leaves the old overlay untouched
and no temporary file behind. OS errors become one message: exit 2 for a path the user chose
badly (permissions, not a directory), exit 3 for the machine (disk full, I/O error)."""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
from pathlib import Path

from codegen.core.contain import Escape, inside
from codegen.core.errors import CodegenError, SystemFailure, UserError, os_failure
from codegen.core.fsutil import move_into_place, sha256, stage_write
from codegen.models.overlay import OVERLAY_TOOLKIT, OverlayManifest
from codegen.models.records import read_record
from codegen.render.overlay import Overlay

MARKER = "MANIFEST.json"


def _os_error(action: str, exc: OSError, out: Path) -> CodegenError:
    where = f"{exc.filename}: " if exc.filename and exc.filename != str(out) else ""
    msg = f"render: cannot {action}: {where}{exc.strerror or exc}"
    err = os_failure(msg, exc, hint="choose another --out, or fix the directory's permissions")
    if isinstance(err, SystemFailure):
        err = SystemFailure(msg + " (nothing was changed)")
    return err


def _previous_outputs(out: Path) -> dict[str, str] | None:
    """{path: sha256} of what our previous render wrote into `out`, from its MANIFEST; None when
    `out` holds no MANIFEST.json or one that is not ours."""
    if not os.path.lexists(out / MARKER):
        return None
    try:
        manifest = read_record(OverlayManifest, inside(out, MARKER), what="overlay manifest", limit=8 << 20)
    except UserError:   # Escape and codegen.models.records.RecordError included
        return None
    if manifest.toolkit != OVERLAY_TOOLKIT:
        return None
    return {o.path: o.sha256 for o in manifest.outputs}


def _read_ours(out: Path, path: str) -> bytes | None:
    try:
        p = inside(out, path)
    except Escape as exc:
        raise UserError(f"render: {exc}", hint="choose another --out, or replace the link by a folder") from None
    return p.read_bytes() if p.is_file() else None


def _our_files(ov: Overlay, out: Path) -> dict[str, bytes]:
    """The bytes of our files as they are in `out` now: the render's, and those the previous
    render's MANIFEST lists that still hold the bytes it recorded."""
    files: dict[str, bytes] = {}
    if not out.is_dir():
        return files
    previous = _previous_outputs(out) or {}
    for path in sorted(set(ov.files) | set(previous) | {MARKER}):
        data = _read_ours(out, path)
        if data is None:
            continue
        if path in ov.files or path == MARKER or sha256(data) == previous[path]:
            files[path] = data
    return files


def diff_overlay(ov: Overlay, out: Path) -> list[str]:
    """Unified diff lines between our files in `out` and the render (empty when identical)."""
    have = _our_files(ov, out)
    want = {path: f.content for path, f in ov.files.items()}
    lines: list[str] = []
    for path in sorted(set(have) | set(want)):
        a, b = have.get(path), want.get(path)
        if a == b:
            continue
        a_text = a.decode("utf-8", "replace").splitlines(keepends=True) if a is not None else []
        b_text = b.decode("utf-8", "replace").splitlines(keepends=True) if b is not None else []
        lines.extend(
            difflib.unified_diff(
                a_text, b_text,
                fromfile=f"a/{path}" if a is not None else "/dev/null",
                tofile=f"b/{path}" if b is not None else "/dev/null",
            )
        )
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
    return lines


def _check_writable(d: Path) -> None:
    mode = d.stat().st_mode
    if not (mode & 0o222):
        raise UserError(f"{d}: directory is read-only (mode {stat.S_IMODE(mode):04o}); refusing to write into it",
                        hint="make it writable (chmod u+w) or choose another --out")
    if not os.access(d, os.W_OK | os.X_OK):
        raise UserError(f"{d}: directory is not writable by this user; nothing was written",
                        hint="choose another --out, or fix the directory's permissions")


def write_overlay(ov: Overlay, out: Path) -> bool:
    """Write the overlay to `out`; return False when it was already identical (no write)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and _previous_outputs(out) is None:
        why = f"its {MARKER} was not written by mi100-codegen" if os.path.lexists(out / MARKER) else f"no {MARKER}"
        raise UserError(
            f"{out}: not empty and not an overlay ({why}); refusing to write into it",
            hint="choose another --out or remove the directory",
        )
    have = _our_files(ov, out)
    want = {path: f.content for path, f in ov.files.items()}
    stale = sorted(set(have) - set(want))
    changed = sorted(p for p in want if have.get(p) != want[p])
    if not changed and not stale:
        return False
    staged = _stage_all(out, {p: want[p] for p in changed})
    try:
        for tmp, dest in staged:
            move_into_place(tmp, dest)
        for path in stale:
            _remove_ours(out, path)
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise _os_error(f"finish writing the overlay into {out}", exc, out) from None
    return True


def _missing_dirs(d: Path) -> list[Path]:
    """`d` and its parents that do not exist yet, outermost first."""
    missing = []
    while not d.exists():
        missing.append(d)
        d = d.parent
    return list(reversed(missing))


def _stage_all(out: Path, files: dict[str, bytes]) -> list[tuple[Path, Path]]:
    """Stage every file (MANIFEST last) as a temporary sibling of its destination; on any failure
    remove what was staged and the directories made, and raise one clear error."""
    created: list[Path] = []  # directories we made, to remove again on failure
    staged: list[tuple[Path, Path]] = []
    try:
        top = _missing_dirs(out)
        if top and top[0].parent.is_dir():
            _check_writable(top[0].parent)
        for d in top:
            d.mkdir()
            created.append(d)
        _check_writable(out)
        for path in sorted(files, key=lambda p: (p == MARKER, p)):
            dest = inside(out, path)
            parents = _missing_dirs(dest.parent)
            for q in parents:
                q.mkdir()
                created.append(q)
            if not parents and dest.parent != out:
                _check_writable(dest.parent)
            staged.append((stage_write(dest, files[path]), dest))
    except BaseException as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        for d in reversed(created):
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(exc, Escape):
            raise UserError(f"render: {exc}; nothing was changed",
                            hint="choose another --out, or replace the link by a folder") from None
        if isinstance(exc, OSError):
            raise _os_error(f"write the overlay into {out}", exc, out) from None
        raise
    return staged


def _remove_ours(out: Path, path: str) -> None:
    """Remove a file of our previous render and the folders it leaves empty (below `out`)."""
    inside(out, path).unlink(missing_ok=True)
    parent = (out / path).parent
    while parent != out and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
