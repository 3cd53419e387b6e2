"""`TREE/.mi100-codegen.lock.json`: what `apply` wrote into a tree (written by
`codegen.apply.engine`, read through `codegen.apply.lock.read_lock`). Read as possibly hostile
(a tree someone handed over): every path obeys the containment rule (`RelPath`: relative, no
`..`, never inside `.git/`) and names neither the lock itself nor the state folder, every hash is
a sha256, every mode is permission bits when used (`codegen.core.contain.perm_bits`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from codegen.core.contain import RelPath
from codegen.models.journal import STATE_DIR
from codegen.models.records import Count, Record, Sha256, Text, write_json

LOCK_NAME = ".mi100-codegen.lock.json"
LOCK_VERSION = 1


def _not_state(rel: str) -> str:
    if rel == LOCK_NAME or rel == STATE_DIR or rel.startswith(STATE_DIR + "/"):
        raise ValueError(f"{rel!r} is mi100-codegen's own state, never an applied file")
    return rel


TreePath = Annotated[RelPath, AfterValidator(_not_state)]
TableRows = dict[Text, dict[Text, Count | list[Text]]]
"""Per table of a database file, apply's statistics (codegen.apply.dbrows.TableStats.as_dict)."""


class LockEntry(Record):
    """One file apply changed: sha256 before (None: apply created it) and after."""

    kind: Literal["module", "edit", "db", "restore"]
    before: Sha256 | None
    after: Sha256 | None
    edits: list[Annotated[str, Field(max_length=200)]] = []
    mode: Annotated[int, Field(ge=0, le=0o7777)] | None = None  # the pristine file's; used masked (perm_bits)
    inputs: Sha256 | None = None   # db files: hash of everything their bytes depend on
    rows: TableRows | None = None  # db files: per-table statistics


class ApplyLock(Record):
    lock_version: Literal[1]
    toolkit: Text
    toolkit_version: Text
    spec_name: Text
    arch: Text                     # the spec's arch
    spec_sha256: Text
    manifest_sha256: Text
    release: Text
    adapter: Text
    commit: Text | None
    files: dict[TreePath, LockEntry]
    created_dirs: list[TreePath] = []
    # the applied spec and the results it rendered with, kept in the state folder (path -> sha256;
    # codegen.apply.applied_spec writes them and checks every path before use)
    recorded: dict[RelPath, Sha256] = {}

    def to_bytes(self) -> bytes:
        return write_json(self)


__all__ = ["ApplyLock", "LOCK_NAME", "LOCK_VERSION", "LockEntry", "TreePath"]
