"""Upstream adapters: everything that depends on which AOTriton release a tree is.

`detect(tree)` reads the release of an AOTriton source tree and returns its record (the
adapter), or raises `UnsupportedTree` (a `UserError`: exit code 2, one message) *before
anything is written*. The records, one per release, are `codegen.upstream.releases.RELEASES`:
identity (name, version, commit), layout traits, shipped archs, the torch lines that link it,
the Triton it pins, its library file name. Stages receive the record, never a release name.

Stable API (other stages call it; keep it compatible): `detect(tree)` returns the record (`Adapter`
is the same class), and stages read its fields, each documented where `Release` declares it.

Release knowledge beside the records, one module each: `layouts` (where a layout family keeps its
files), `edits` (the anchored edits as typed records), `generator` (the environment the tree's own
Python tools run in), `registration` (is the target registered; may a spec be applied to this
release), `kernel_args` (importing the tree's Triton kernels and passing their parameters by name,
for tune and validate --kernels), `trees` (a pristine tree of a release), `knobs` (the environment
knobs its CMake reads).

How detection works: the top CMakeLists.txt's `set(AOTRITON_VERSION_{MAJOR,MINOR,PATCH}_INT n)`
lines give the version (there is no `project(... VERSION ...)`); it selects the records of that
version; a record is the tree's when its layout traits hold on the tree: every file it relies on
exists, no path of another layout exists, and its API markers are (and its foreign markers are
not) in the files they name. A version with no record is refused with the list of supported
releases; a known version whose traits do not hold is refused as "modified beyond recognition,
or a newer tree with the same version" (e.g. a 0.14 tag after the 0.14.0-dev snapshot).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from codegen.core.errors import UserError
from codegen.upstream.releases import SUPPORTED, SUPPORTED_RELEASES, Release, by_release, release_name, version_text

# The record is the adapter: stages take `Adapter` (what `detect` returns) and read its traits.
Adapter = Release

VERSION_RE = {
    k: re.compile(rf"^\s*set\(AOTRITON_VERSION_{k}_INT\s+(\d+)\s*\)", re.M)
    for k in ("MAJOR", "MINOR", "PATCH")
}


class UnsupportedTree(UserError):
    """A tree that is not one of the supported AOTriton releases (or not recognisable)."""


def read_version(tree: Path) -> tuple[int, int, int] | None:
    cm = Path(tree) / "CMakeLists.txt"
    try:
        text = cm.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = []
    for k in ("MAJOR", "MINOR", "PATCH"):
        hits = VERSION_RE[k].findall(text)
        if len(hits) != 1:
            return None
        found.append(int(hits[0]))
    return (found[0], found[1], found[2])


def _supported() -> str:
    return ", ".join(SUPPORTED_RELEASES)


def _mismatch(root: Path, rec: Release) -> list[str]:
    """What of `rec`'s layout traits does not hold on the tree (empty: the tree is `rec`)."""
    out = [p for p in rec.required_files if not (root / p).is_file()]
    out += [f"(has {p}: another layout)" for p in rec.foreign_paths if (root / p).exists()]
    for rel, text in rec.markers + rec.foreign_markers:
        try:
            body = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            body = ""
        if ((rel, text) in rec.markers) != (text in body):
            out.append(f"({rel} {'lacks' if (rel, text) in rec.markers else 'has'} {text!r})")
    return out


def detect(tree: Path | str) -> Adapter:
    """Detect the AOTriton release of `tree` and return its record.

    Raises UnsupportedTree (exit 2) for: a path that is not a directory; a tree without the
    three CMake version lines; a version no record has; a known version whose layout traits do
    not hold on the tree. Reads only; never writes."""
    root = Path(tree)
    if not root.is_dir():
        raise UnsupportedTree(f"{tree}: not a directory")
    version = read_version(root)
    if version is None:
        raise UnsupportedTree(
            f"{tree}: not an AOTriton source tree (no AOTRITON_VERSION_{{MAJOR,MINOR,PATCH}}_INT "
            f"in CMakeLists.txt); supported releases: {_supported()}"
        )
    candidates = [r for r in SUPPORTED if r.version == version]
    if not candidates:
        raise UnsupportedTree(f"{tree}: AOTriton {version_text(version)} (as its CMakeLists.txt says) is not "
                              f"supported; supported releases: {_supported()}")
    misses = []
    for rec in candidates:
        missing = _mismatch(root, rec)
        if not missing:
            return rec
        misses.append(f"{rec.label}: {', '.join(missing)}")
    raise UnsupportedTree(
        f"{tree}: says AOTriton {version_text(version)} but is not {' nor '.join(r.label for r in candidates)} "
        f"(missing: {'; '.join(misses)}); modified beyond recognition, or a newer tree of that version? "
        f"supported releases: {_supported()}"
    )


KERNEL_DIRS: tuple[str, ...] = tuple(dict.fromkeys(a.kernel_dir for a in SUPPORTED))


def kernel_source_dir(tree: Path | str) -> Path | None:
    """The folder of the tree's Triton kernels (tune and validate import them flat from there):
    the detected release's `kernel_dir`; for a tree `detect` refuses (e.g. a bare kernel
    checkout), the first known kernel folder that holds flash.py; None when there is none."""
    root = Path(tree)
    with contextlib.suppress(UnsupportedTree):
        return root / detect(root).kernel_dir
    return next((root / d for d in KERNEL_DIRS if (root / d / "flash.py").is_file()), None)


# where each layout keeps its kernel tuning database: (the central archive, whether shards lie below
# its folder: the sharded layouts' central archive is schema only)
TUNING_DB_PLACES: tuple[tuple[str, bool], ...] = tuple(dict.fromkeys(
    (a.tuning_db, a.tuning_db_layout == "sharded") for a in SUPPORTED))


def tuning_db_places(tree: Path | str) -> tuple[tuple[str, bool], ...]:
    """Where the tree's kernel tuning database lies: the detected release's place; for a tree
    `detect` refuses (e.g. a bare database fixture), every known place."""
    try:
        a = detect(Path(tree))
        return ((a.tuning_db, a.tuning_db_layout == "sharded"),)
    except UnsupportedTree:
        return TUNING_DB_PLACES


def kernel_dirs_text() -> str:
    """'tritonsrc/flash.py nor modules/flash/kernel/flash.py', for messages."""
    return " nor ".join(f"{d}/flash.py" for d in KERNEL_DIRS)


__all__ = ["Adapter", "KERNEL_DIRS", "Release", "SUPPORTED", "SUPPORTED_RELEASES", "TUNING_DB_PLACES",
           "UnsupportedTree", "by_release", "detect", "kernel_dirs_text", "kernel_source_dir", "read_version",
           "release_name", "tuning_db_places", "parse_constexpr", "signature_constant", "kernel_arg_types"]


def parse_constexpr(text: str):
    """A constant from a kernel signature of upstream's compile list ('64', '0.5', 'True'),
    or None when the entry is not a constant (e.g. '*fp16:16')."""
    text = text.strip()
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    return {"True": True, "False": False}.get(text)


def signature_constant(entry: str):
    """The constant an entry of a kernel signature fixes, or None for an argument the compiled
    kernel takes: a literal ('64', 'True'), or an argument hinted `:1` ('i32:1'), which the tree's
    compile.py has Triton specialize to the constant 1."""
    value = parse_constexpr(entry)
    if value is None and ":" in entry and parse_constexpr(entry.split(":")[1]) == 1:
        return 1
    return value


def kernel_arg_types(signature: str) -> tuple[str, ...]:
    """The Triton types of the arguments a kernel compiled from an AOT signature takes, in order:
    every entry but its constants (`signature_constant`), without its hint ('*fp16:16' -> '*fp16')."""
    entries = [s.strip() for s in signature.split(",")]
    return tuple(s.split(":")[0] for s in entries if signature_constant(s) is None)
