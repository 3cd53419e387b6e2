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


class TableRows(Record):
    """What apply wrote into one table of a database file (`codegen.apply.dbrows.TableStats`): the
    counts a table without them leaves out are 0, the compile report's only there when the overlay
    had one."""

    donor_rows: Count
    rows_written: Count
    waves_capped: Count
    measured_overrides: Count
    measured_unmatched: Count
    tiles_replaced: Count = 0
    warps_raised: Count = 0
    split_routed: Count = 0            # op_attn_bwd rows moved from the fused to the split backend
    compile_capped: Count | None = None
    compile_clean_rows: Count | None = None
    compile_unclean: list[Text] | None = None      # configs that spill or fail at every measured waves_per_eu
    compile_unmeasured: list[Text] | None = None   # configs the compile report does not know


class LockEntry(Record):
    """One file apply changed: sha256 before (None: apply created it) and after."""

    kind: Literal["module", "edit", "db", "restore"]
    before: Sha256 | None
    after: Sha256 | None
    edits: list[Annotated[str, Field(max_length=200)]] = []
    mode: Annotated[int, Field(ge=0, le=0o7777)] | None = None  # the pristine file's; used masked (perm_bits)
    inputs: Sha256 | None = None   # db files: hash of everything their bytes depend on
    rows: dict[Text, TableRows] | None = None  # db files: per-table statistics


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
