"""Where a pristine tree of one AOTriton release comes from when a stage needs one it was not given
(`bundle verify` recompiles kernels from the release a bundle records). The sources, in the order
the tests take them (tests/conftest.py reads the archive through this module):

1. `AOTRITON_SRC`: an extracted tree, taken when it is that release (copied, never changed);
2. `AOTRITON_GIT`: a git dir of ROCm/aotriton: `git archive` of the commit the release's record
   names (the tag's, or a snapshot's of main: a tag moved since is refused, as the owner's clone
   refuses it);
3. the release archive: `AOTRITON_ARCHIVE`, else `shared/upstream/aotriton-releases.tar.xz` in the
   nearest ancestor of the current folder or of this install. The `TAGS` file beside it names
   what it holds (`tag commit date` per line); a snapshot of main (`main(<name>) commit date`) is
   in `aotriton-main-<yyyymmdd>.tar.xz` beside it, top folder `aotriton-main/`.

Else one message naming the three (exit 2). The tree is written into the new folder the caller
names (made beside it and renamed into place), nothing else is written. No network here: a caller that may fetch a tag (the owner's
`torch install --bundle auto`, codegen.ship.owner) passes its fetch as a last source."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from codegen.core import processes
from codegen.core.errors import UserError
from codegen.core.fsutil import move_into_place
from codegen.core.resources import shared_file
from codegen.upstream import UnsupportedTree, by_release, detect

SRC_ENV, GIT_ENV, ARCHIVE_ENV = "AOTRITON_SRC", "AOTRITON_GIT", "AOTRITON_ARCHIVE"
ARCHIVE_REL = Path("shared", "upstream", "aotriton-releases.tar.xz")
TREE_TIMEOUT_S = 900.0   # extracting one release from the 22 MB archive takes a few seconds


def release_archive(starts: list[Path] | None = None) -> Path | None:
    """The archive of release trees: `AOTRITON_ARCHIVE`, else `shared/upstream/...` beside the
    checkout (codegen.core.resources.shared_file)."""
    return shared_file(ARCHIVE_REL, ARCHIVE_ENV, starts)


def archive_entries(archive: Path) -> dict[str, tuple[Path, str]]:
    """tag -> (archive file, top folder), from the `TAGS` file beside `archive` (see the module doc)."""
    tags = archive.parent / "TAGS"
    out: dict[str, tuple[Path, str]] = {}
    for line in tags.read_text(encoding="utf-8").splitlines() if tags.is_file() else []:
        if not line.strip():
            continue
        tag, _commit, date = line.split()[:3]
        if tag.startswith("main(") and tag.endswith(")"):
            out[tag[5:-1]] = (archive.parent / f"aotriton-main-{date.replace('-', '')}.tar.xz", "aotriton-main")
        else:
            out[tag] = (archive, f"aotriton-{tag}")
    return out


def _run(cmd: list[str], what: str, **kw) -> bytes:
    try:
        proc = processes.run(cmd, timeout=TREE_TIMEOUT_S, capture_output=True, stdin=kw.pop("stdin", None), **kw)
    except subprocess.TimeoutExpired:
        raise UserError(f"{what}: did not finish within {TREE_TIMEOUT_S / 60:g} min (killed)") from None
    except OSError as exc:
        raise UserError(f"{what}: cannot run {cmd[0]} ({exc.strerror or exc})") from None
    if proc.returncode:
        tail = (proc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise UserError(f"{what}: {cmd[0]} failed (rc {proc.returncode}): {tail[-1] if tail else ''}")
    return proc.stdout


def _from_src(release: str, dest: Path) -> str | None:
    src = os.environ.get(SRC_ENV)
    if not src or not Path(src).is_dir():
        return None
    try:
        if detect(Path(src)).release != release:
            return None
    except UnsupportedTree:
        return None
    shutil.copytree(src, dest, symlinks=True)
    return f"{SRC_ENV}={src}"


def _from_git(release: str, dest: Path) -> str | None:
    git = os.environ.get(GIT_ENV)
    if not git:
        return None
    record = by_release(release)
    ref = record.commit or release   # the tag's commit as recorded: a moved tag is not its release
    data = _run(["git", "-C", git, "archive", ref],
                f"{GIT_ENV}={git}: git archive {ref}" + (f" (the commit of {release})" if ref != release else ""))
    dest.mkdir(parents=True)
    _run(["tar", "-x", "-C", str(dest)], f"{GIT_ENV}={git}: unpacking {ref}", input=data)
    return f"{GIT_ENV}={git} ({ref})"


def _from_archive(release: str, dest: Path) -> str | None:
    archive = release_archive()
    holder, top = archive_entries(archive).get(release, (None, "")) if archive is not None else (None, "")
    if holder is None or not holder.is_file():
        return None
    tmp = dest.parent / f".{dest.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _run(["tar", "-xJf", str(holder), "-C", str(tmp), top], f"{holder}: extracting {top}")
    if not (tmp / top).is_dir():
        raise UserError(f"{holder}: its TAGS lists {release} but it has no {top}/")
    move_into_place(tmp / top, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return str(holder)


def release_tree(release: str, dest: Path, fetch: Callable[[str, Path], str | None] | None = None) -> str:
    """A pristine tree of `release` made at `dest` (a folder that does not exist yet) from the first
    source that has it (see the module doc), `fetch(release, folder)` last when given; returns where
    it came from. UserError when none has it. The tree is made in a sibling `.<name>.tmp` and renamed
    into place: `dest` is whole or absent, and an interrupted run's leftover is made again."""
    by_release(release)   # a release we know (the bundle's manifest was checked against the same records)
    dest = Path(dest)
    tmp = dest.parent / f".{dest.name}.tmp"
    if tmp.is_symlink() or tmp.is_file():
        tmp.unlink()
    shutil.rmtree(tmp, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for source in (_from_src, _from_git, _from_archive, *([fetch] if fetch is not None else [])):
        where = source(release, tmp)
        if where is not None:
            move_into_place(tmp, dest)
            return where
    raise UserError(f"no AOTriton {release} tree to rebuild from",
                    hint=f"set {SRC_ENV} to an extracted {release} tree, {GIT_ENV} to a git dir of ROCm/aotriton, "
                         f"or {ARCHIVE_ENV} to the release archive (shared/upstream/aotriton-releases.tar.xz)")
