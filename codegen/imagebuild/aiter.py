"""An offline stand-in for the ROCm/aiter clone that 0.12b+ image builds make at configure time.

AOTriton's CMake clones `https://github.com/ROCm/aiter.git` at the tag in `third_party/aiter.txt`
into `BUILD/v3src/aiter` unless a git repository whose HEAD carries that tag is already there; the
generator reads aiter's prebuilt kernels from it only for the archs those kernels serve
(`Release.aiter_archs`: gfx942, gfx950). A build for another arch (gfx908, gfx906, gfx1030) reads
nothing from it, so on a machine without GitHub an empty repository tagged the same way lets the
configure step pass without changing what is built. `build --aiter-stand-in` and `bundle build
--aiter-stand-in` place it; a real clone already there is left alone.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from codegen.core import processes
from codegen.core.contain import inside
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import move_into_place, read_input

MARKER = "MI100-CODEGEN-STAND-IN"   # the stand-in's one file: says what it is
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def aiter_tag(tree: Path, release) -> str:
    """The tag CMake would clone, read from the tree as hostile input (a bounded regular file, one
    plain tag name)."""
    path = inside(tree, release.aiter_tag_file)
    raw = read_input(path, what="aiter tag file", limit=256).decode("utf-8", "replace").strip()
    if not _TAG_RE.match(raw):
        raise UserError(f"{path}: not a tag name ({raw[:40]!r})", hint="a fresh checkout of the release has one")
    return raw


def _git(args: list[str], cwd: Path) -> str:
    r = processes.run(["git", "-c", "user.name=mi100-codegen", "-c", "user.email=stand-in@localhost",
                       "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
                      cwd=cwd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise EnvironmentMissing(f"git {args[0]} failed in {cwd}: {(r.stderr or r.stdout).strip()[:300]}")
    return r.stdout.strip()


def refuse_stand_in(release, arch: str) -> None:
    """A stand-in that would replace nothing, or change what is built: one UserError (checked
    before any work; place_stand_in checks again)."""
    if not release.clones_aiter:
        raise UserError(f"AOTriton {release.release} clones no aiter: --aiter-stand-in has nothing to replace")
    if arch in release.aiter_archs:
        raise UserError(f"{arch} builds aiter's kernels ({', '.join(release.aiter_archs)}): it needs the real "
                        f"clone, not a stand-in", hint="run the build where github.com is reachable, or place "
                        "a clone of ROCm/aiter at the tree's third_party/aiter.txt tag in BUILD/v3src/aiter")


def place_stand_in(tree: Path, build_dir: Path, release, arch: str) -> str:
    """Make BUILD/v3src/aiter an empty git repository tagged as the tree's aiter.txt says; return
    what was done ('placed', 'kept: stand-in', 'kept: a clone'). Refused for an arch aiter serves."""
    refuse_stand_in(release, arch)
    if shutil.which("git") is None:
        raise EnvironmentMissing("git is needed for the aiter stand-in (AOTriton's CMake checks its tag)",
                                 hint="apt-get install -y git")
    tag = aiter_tag(tree, release)
    dest = inside(build_dir, "v3src/aiter")
    if dest.exists():
        if (dest / MARKER).is_file():
            return "kept: stand-in"
        return "kept: a clone"   # CMake checks its tag itself and fetches if it must
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".aiter-stand-in-", dir=dest.parent))
    try:
        (tmp / MARKER).write_text(
            f"An empty stand-in for ROCm/aiter at {tag}, placed by mi100-codegen for an offline build for "
            f"{arch}: the generator reads aiter's kernels only for {', '.join(release.aiter_archs)}.\n")
        _git(["init", "-q"], tmp)
        _git(["add", MARKER], tmp)
        _git(["commit", "-q", "-m", f"stand-in for ROCm/aiter {tag} (mi100-codegen)"], tmp)
        _git(["tag", tag], tmp)
        move_into_place(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return "placed"
