"""Where the pinned emulator comes from: tinygrad's AMD emulator (`test/mockgpu/amd/emu.py`, MIT)
at one commit, used as a dependency and never copied into this package. Found as an AOTriton tree
is found (codegen.upstream.trees), in this order:

1. `TINYGRAD_SRC`: an extracted tinygrad tree at the pinned commit (its emu.py and pcode.py are
   checked against the digests pinned here);
2. `TINYGRAD_GIT`: a git dir of tinygrad; `git archive` of the pinned commit, once, into the
   user cache;
3. the archive: `TINYGRAD_ARCHIVE`, else `shared/emulators/tinygrad-<short>.tar.xz` in the nearest
   ancestor of the current folder or of this install (the project's shared folder), checked
   against the archive digest pinned here and extracted once into the user cache.

The user-cache copy (`<cache>/emulator/tinygrad-<short>/`) is trusted storage, as the kernel cache
is (codegen.core.fsutil.trusted_storage): a link, another user's folder or one others may write is
refused. Nothing here imports the emulator: the Machine's child process puts the tree on its own
sys.path (codegen.emulate.machine)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from codegen.core import processes
from codegen.core.errors import EnvironmentMissing
from codegen.core.fsutil import move_into_place, trusted_storage
from codegen.core.resources import shared_file, user_cache_dir

COMMIT = "a9069c177a9da9cca18593edf55acd2e6073cca6"
SHORT = COMMIT[:8]
TOP = f"tinygrad-{SHORT}"
ARCHIVE_SHA256 = "3777d1fc3b5c190d6d3e49cce44cc23a9f24c778af5d0a587e9d550781cff3d3"
# the two files the emulator is: a tree that differs is another commit (or an edited copy)
FILE_SHA256 = {
    "test/mockgpu/amd/emu.py": "b16551e8c6dbe901c231a98b7ce45ba510be9545b4e0c62c4eca36999c226b0d",
    "test/mockgpu/amd/pcode.py": "98a31cbb01a7eba0743924aeead7fef3be32ef783d52ee15f0ad7383bf78abd1",
}
# what `git archive` takes from a clone: the trimmed archive's content
GIT_PATHS = ("tinygrad", "test/mockgpu", "test/amd", "test/__init__.py", "test/helpers.py", "LICENSE")
SRC_ENV, GIT_ENV, ARCHIVE_ENV = "TINYGRAD_SRC", "TINYGRAD_GIT", "TINYGRAD_ARCHIVE"
ARCHIVE_REL = Path("shared", "emulators", f"{TOP}.tar.xz")
ARCHIVE_LIMIT = 64 << 20     # bytes: the trimmed archive is 1.7 MB
GIT_TIMEOUT_S = 300.0
MIN_PYTHON = (3, 11)         # the pinned tinygrad's own floor (its pyproject)


class EmulatorMissing(EnvironmentMissing):
    """The pinned emulator, clang or a Python it runs on is not here (exit 3). Tests skip on it
    with the reason."""


def _fix() -> str:
    return (f"set {SRC_ENV} to a tinygrad tree at commit {SHORT}, {GIT_ENV} to a git dir of tinygrad, or "
            f"{ARCHIVE_ENV} to {TOP}.tar.xz (the project's shared/emulators/ holds it)")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_tree(root: Path, what: str) -> Path:
    """`root` when it holds the pinned emulator (its two files at the pinned digests), else
    EmulatorMissing naming the first file that differs."""
    for rel, want in FILE_SHA256.items():
        p = root / rel
        if not p.is_file():
            raise EmulatorMissing(f"{what} {root}: no {rel}; not a tinygrad tree", hint=_fix())
        if _digest(p) != want:
            raise EmulatorMissing(f"{what} {root}: {rel} is not the one of tinygrad commit {SHORT} "
                                  "(another commit, or edited)", hint=_fix())
    return root


def find_archive(starts: list[Path] | None = None) -> Path | None:
    """The emulator's archive: `TINYGRAD_ARCHIVE`, else shared/emulators/ beside the checkout
    (codegen.core.resources.shared_file)."""
    return shared_file(ARCHIVE_REL, ARCHIVE_ENV, starts)


def _cache_root() -> Path:
    root = user_cache_dir("emulator")
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise EmulatorMissing(f"{root}: cannot make the emulator's cache folder ({exc.strerror or exc})") from None
    trusted_storage(root, what="emulator cache folder")
    return root


def _install(root: Path, fill) -> Path:
    """`root/TOP`, made by `fill(tmp)` in a sibling and renamed into place (whole or absent)."""
    dest = root / TOP
    tmp = Path(tempfile.mkdtemp(prefix=f".{TOP}.", dir=root))
    try:
        fill(tmp)
        check_tree(tmp / TOP, "extracted emulator")
        move_into_place(tmp / TOP, dest)
    except OSError as exc:
        if not dest.is_dir():
            raise EmulatorMissing(f"{dest}: cannot extract the emulator ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _from_archive(archive: Path, root: Path) -> Path:
    try:
        with open(archive, "rb") as fh:
            data = fh.read(ARCHIVE_LIMIT + 1)
    except OSError as exc:
        raise EmulatorMissing(f"{archive}: cannot read the emulator archive ({exc.strerror or exc})") from None
    got = hashlib.sha256(data).hexdigest()
    if len(data) > ARCHIVE_LIMIT or got != ARCHIVE_SHA256:
        raise EmulatorMissing(f"{archive}: sha256 {got}, the pinned archive's is {ARCHIVE_SHA256}", hint=_fix())

    def fill(tmp: Path) -> None:   # the bytes are the pinned archive's: every member is known
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
            _extract(tar, tmp)
    return _install(root, fill)


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Every member into `dest`, through tarfile's "data" filter where this Python has it (no
    links out, no devices, no absolute names)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    for m in tar.getmembers():
        if m.name.startswith(("/", "..")) or ".." in Path(m.name).parts or not (m.isfile() or m.isdir()):
            raise EmulatorMissing(f"the emulator's archive holds {m.name!r}, which is not a plain file or folder")
    tar.extractall(dest)


def _from_git(git_dir: str, root: Path) -> Path:
    def fill(tmp: Path) -> None:
        cmd = ["git", "-C", git_dir, "archive", "--format=tar", f"--prefix={TOP}/", COMMIT, *GIT_PATHS]
        try:
            proc = processes.run(cmd, timeout=GIT_TIMEOUT_S, capture_output=True)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmulatorMissing(f"{GIT_ENV}={git_dir}: cannot run git archive ({exc})") from None
        if proc.returncode:
            tail = proc.stderr.decode(errors="replace").strip().splitlines()
            raise EmulatorMissing(f"{GIT_ENV}={git_dir}: git archive {SHORT} failed: {tail[-1] if tail else ''}",
                                  hint=_fix())
        with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
            _extract(tar, tmp)
    return _install(root, fill)


def emulator_root(starts: list[Path] | None = None) -> Path:
    """The folder to put on the child's sys.path (it holds `tinygrad/` and `test/mockgpu/`), from
    the first source of the module doc; EmulatorMissing when there is none, or when this Python
    is older than the pinned tinygrad needs."""
    if sys.version_info < MIN_PYTHON:
        raise EmulatorMissing(f"the pinned emulator needs Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+, "
                              f"this is {sys.version_info.major}.{sys.version_info.minor}")
    src = os.environ.get(SRC_ENV)
    if src:
        return check_tree(Path(src), SRC_ENV).resolve()
    git_dir = os.environ.get(GIT_ENV)
    archive = None if git_dir else find_archive(starts)
    if not git_dir and archive is None:
        raise EmulatorMissing("the pinned emulator (tinygrad " + SHORT + ") is not here", hint=_fix())
    root = _cache_root()
    dest = root / TOP
    if os.path.lexists(dest):
        trusted_storage(dest, what="emulator tree in the cache")
        try:
            return check_tree(dest, "cached emulator")
        except EmulatorMissing:
            shutil.rmtree(dest, ignore_errors=True)   # a torn or edited copy: made again below
    return _from_git(git_dir, root) if git_dir else _from_archive(archive, root)


def clang_path() -> str:
    """clang, which the emulator's CPU backend runs once per new instruction; EmulatorMissing
    when it is not on PATH."""
    found = shutil.which(os.environ.get("CC") or "clang") or shutil.which("clang")
    if not found:
        raise EmulatorMissing("clang is not on PATH: the emulator compiles each instruction with it",
                              hint="install clang (Debian: apt-get install clang)")
    return found

