"""The spec a tree was applied from, kept with the tree's state: the one owner of "which spec do
the stages after `apply` use".

`apply` writes a copy of the spec's bytes to `.mi100-codegen/spec.yaml` inside its transaction
(the lock records the copy's sha256 in `spec_file_sha256`); `revert` removes it with the lock, so
a reverted tree stays byte-identical. The user may then move, edit or delete their own file:
plan, precompile, bench, build and tune read the recorded copy (`resolve_spec`).

A `--spec` given to one of them must mean the same spec (same sha256 of its meaning), or it is
refused with one message naming both. A tree applied by an older mi100-codegen (a lock without a
recorded copy) is checked the same way against the lock's spec sha256.

The recorded copy is input we did not just write ourselves: it must be a regular file inside the
tree (no symbolic link on the way, `codegen.contain.inside`), at most the spec size limit, hold
the bytes the lock names, and it is parsed by the normal spec loader; every refusal names the
recorded file and says how to recover (re-apply)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..contain import inside
from ..errors import CodegenError, UserError
from ..fsutil import read_input
from .journal import STATE_DIR
from .lock import LOCK_NAME, ApplyLock, read_lock

if TYPE_CHECKING:
    from ..spec import LoadedSpec

SPEC_COPY = f"{STATE_DIR}/spec.yaml"


def spec_bytes(loaded: LoadedSpec) -> bytes:
    """The bytes apply records for `loaded`: its file as read now, bounded like any spec (a file
    edited between loading and recording is refused by the next stage: `load_recorded`)."""
    from ..spec import MAX_SPEC_BYTES  # revert imports this module: the loader loads only when used

    return read_input(loaded.path, what="spec", limit=MAX_SPEC_BYTES)


def copy_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _recorded_path(tree: Path) -> Path:
    return inside(tree, SPEC_COPY)


def _hint(tree: Path) -> str:
    return (f"re-apply to record it again: mi100-codegen apply {tree} --spec SPEC "
            f"(or revert the tree: mi100-codegen revert {tree})")


def load_recorded(tree: Path, lock: ApplyLock) -> LoadedSpec | None:
    """The spec recorded at apply time, None for a lock written before specs were recorded.
    Refuses (UserError naming the file) a copy that is missing, not a regular file, too large,
    not the bytes the lock names, or not a valid spec."""
    from ..spec import MAX_SPEC_BYTES, load_spec

    if lock.spec_file_sha256 is None:
        return None
    try:
        path = _recorded_path(tree)
        data = read_input(path, what="recorded spec", limit=MAX_SPEC_BYTES)
    except UserError as exc:
        raise UserError(f"{tree}/{SPEC_COPY}: the spec apply recorded cannot be read ({exc})",
                        hint=_hint(tree)) from None
    if copy_sha256(data) != lock.spec_file_sha256:
        raise UserError(f"{path}: the spec apply recorded was changed since (its sha256 is not the one "
                        f"{LOCK_NAME} records)", hint=_hint(tree))
    try:
        loaded = load_spec(path)
    except CodegenError as exc:
        raise UserError(f"{path}: the spec apply recorded is not a valid spec:\n{exc}", hint=_hint(tree)) from None
    if loaded.sha256 != lock.spec_sha256:
        raise UserError(f"{path}: the spec apply recorded does not mean the spec {LOCK_NAME} names "
                        f"(sha256 {loaded.sha256[:12]}…, not {lock.spec_sha256[:12]}…)", hint=_hint(tree))
    return replace(loaded, display=f"{loaded.display} (the spec applied to this tree)")


def resolve_spec(tree: Path | str, explicit: Path | None) -> LoadedSpec:
    """The spec a stage working on `tree` uses: the one apply recorded, else `explicit`, else the
    embedded default. An `explicit` spec that means another spec than the applied one is
    refused, naming both."""
    from ..spec import load_spec

    tree = Path(tree)
    lock = read_lock(tree) if tree.is_dir() else None
    if lock is None:  # not applied: the stage's own check says so
        return load_spec(explicit)
    recorded = load_recorded(tree, lock)
    if explicit is None and recorded is not None:
        return recorded
    given = load_spec(explicit)
    if given.sha256 == lock.spec_sha256:
        return given
    applied = recorded.display if recorded is not None else f"spec {lock.spec_name!r}"
    what = "--spec " + given.display if explicit is not None else f"the embedded default {given.display}"
    raise UserError(
        f"{tree}: {what} (sha256 {given.sha256[:12]}…) is not the spec this tree was applied from: "
        f"{applied} (sha256 {lock.spec_sha256[:12]}…)",
        hint=("leave out --spec to use the applied one, or re-apply: "
              if recorded is not None else "pass the spec it was applied from, or re-apply: ")
        + f"mi100-codegen apply {tree} --spec {given.display if explicit is not None else 'SPEC'}")


__all__ = ["SPEC_COPY", "copy_sha256", "load_recorded", "resolve_spec", "spec_bytes"]
