"""`.mi100-codegen.lock.json`: what `apply` wrote into a tree, and the one reader of it.

Written by `codegen.apply.engine` (inside the apply transaction), read by apply, revert and
build. A lock that is not valid JSON, or not of this shape, is one clear error (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..contain import RelPath
from ..errors import UserError

LOCK_NAME = ".mi100-codegen.lock.json"
LOCK_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LockEntry(_Model):
    """One file apply changed: sha256 before (None: apply created it) and after."""

    kind: str  # module | edit | db | restore
    before: str | None
    after: str | None
    edits: list[str] = []
    mode: int | None = None        # permission bits of the pristine file
    inputs: str | None = None      # db files: hash of everything their bytes depend on
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
    files: dict[str, LockEntry]
    created_dirs: list[str] = []
    # the applied spec and the results it rendered with, recorded in .mi100-codegen/ (path -> sha256;
    # codegen.apply.applied_spec checks the paths and the bytes)
    recorded: dict[RelPath, str] = {}

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(exclude_unset=True), indent=2, sort_keys=True) + "\n").encode()


def read_lock(tree: Path | str) -> ApplyLock | None:
    """The tree's lock, None when there is none; UserError when it is unreadable."""
    p = Path(tree) / LOCK_NAME
    if not p.is_file():
        return None
    hint = "restore it from a backup, or start again from a pristine tree"
    try:
        data = json.loads(p.read_bytes())
    except (OSError, ValueError) as exc:
        raise UserError(f"{p}: unreadable lock file ({exc})", hint=hint) from None
    try:
        return ApplyLock.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise UserError(f"{p}: unreadable lock file, not what mi100-codegen writes ({where}: {first['msg']})",
                        hint=hint) from None


__all__ = ["LOCK_NAME", "LOCK_VERSION", "ApplyLock", "LockEntry", "read_lock"]
