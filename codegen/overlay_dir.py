"""Writing and checking a rendered overlay directory (the only filesystem side of render).

The whole directory is staged next to the destination and swapped in with renames, so a failed
or interrupted run leaves either the old overlay or the new one, never a mix."""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from pathlib import Path

from .errors import UserError
from .render import Overlay

MARKER = "MANIFEST.json"


def _current_files(out: Path) -> dict[str, bytes]:
    files = {}
    if out.is_dir():
        for p in sorted(out.rglob("*")):
            if p.is_file():
                files[p.relative_to(out).as_posix()] = p.read_bytes()
    return files


def diff_overlay(ov: Overlay, out: Path) -> list[str]:
    """Unified diff lines between `out` and the render (empty when identical)."""
    have = _current_files(out)
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


def write_overlay(ov: Overlay, out: Path) -> bool:
    """Write the overlay to `out`; return False when it was already identical (no write)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise UserError(
            f"{out}: not empty and not an overlay (no {MARKER}); refusing to overwrite it",
            hint="choose another --out or remove the directory",
        )
    if out.is_dir() and not diff_overlay(ov, out):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
    old = None
    try:
        for path, f in sorted(ov.files.items()):
            dest = stage / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.content)
        for p in [stage, *stage.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rmdir(old)
            os.rename(out, old)
        os.rename(stage, out)
    except BaseException:
        if old is not None and old.exists() and not out.exists():
            os.rename(old, out)
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return True
