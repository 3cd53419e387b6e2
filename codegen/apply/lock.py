"""`.mi100-codegen.lock.json`: what `apply` wrote into a tree, and the one reader of it.

Written by `codegen.apply.engine` (inside the apply transaction), read by apply, revert and
build. The lock is read as possibly hostile (a tree someone handed over): every path in it obeys
the containment rule (`codegen.core.contain.RelPath`: relative, no `..`, never inside `.git/`) and
names neither the lock itself nor the state folder, every hash is a sha256, every mode is
permission bits. A lock that is not valid JSON, or not of this shape, is one message,
"this tree's state file is damaged" (exit 2), and nothing is done."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from codegen.core.contain import RelPath, inside
from codegen.core.errors import UserError
from codegen.core.fsutil import read_input
from codegen.apply.journal import STATE_DIR, StateDamaged

LOCK_NAME = ".mi100-codegen.lock.json"
LOCK_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _not_state(rel: str) -> str:
    if rel == LOCK_NAME or rel == STATE_DIR or rel.startswith(STATE_DIR + "/"):
        raise ValueError(f"{rel!r} is mi100-codegen's own state, never an applied file")
    return rel


TreePath = Annotated[RelPath, AfterValidator(_not_state)]
Sha = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class LockEntry(_Model):
    """One file apply changed: sha256 before (None: apply created it) and after."""

    kind: Literal["module", "edit", "db", "restore"]
    before: Sha | None
    after: Sha | None
    edits: list[Annotated[str, Field(max_length=200)]] = []
    mode: Annotated[int, Field(ge=0, le=0o7777)] | None = None  # the pristine file's; used masked (perm_bits)
    inputs: Sha | None = None      # db files: hash of everything their bytes depend on
    rows: dict | None = None       # db files: per-table statistics


class ApplyLock(_Model):
    lock_version: Literal[1]
    toolkit: str
    toolkit_version: str
    spec_name: str
    arch: str                      # the spec's arch
    spec_sha256: str
    manifest_sha256: str
    release: str
    adapter: str
    commit: str | None
    files: dict[TreePath, LockEntry]
    created_dirs: list[TreePath] = []
    # the applied spec and the results it rendered with, kept in the state folder (path -> sha256;
    # codegen.apply.applied_spec writes them and checks every path before use)
    recorded: dict[RelPath, Sha] = {}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(exclude_unset=True), indent=2, sort_keys=True) + "\n").encode()


def read_lock(tree: Path | str) -> ApplyLock | None:
    """The tree's lock, None when there is none; StateDamaged when it cannot be trusted."""
    tree = Path(tree)
    p = tree / LOCK_NAME
    if not os.path.lexists(p):
        return None
    hint = ("mi100-codegen acts on no state file it cannot trust: restore the lock from a backup, or start "
            "again from a fresh copy of the release (a git clone: `git -C TREE checkout -- . && git -C TREE "
            "clean -fdx`)")
    try:
        inside(tree, LOCK_NAME)
        data = json.loads(read_input(p, what="lock file", limit=16 << 20))
    except (UserError, ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise StateDamaged(f"{p}: this tree's state file is damaged (unreadable lock file: {why}); nothing was "
                           "changed", hint=hint) from None
    try:
        return ApplyLock.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise StateDamaged(f"{p}: this tree's state file is damaged (unreadable lock file, not what mi100-codegen "
                           f"writes: {where}: {first['msg']}); nothing was changed", hint=hint) from None


__all__ = ["LOCK_NAME", "LOCK_VERSION", "ApplyLock", "LockEntry", "read_lock"]
