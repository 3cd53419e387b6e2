"""`.mi100-codegen.lock.json`: what `apply` wrote into a tree, and the one reader of it.

Written by `codegen.apply.engine` (inside the apply transaction), read by apply, revert and
build. The model (`codegen.models.lock.ApplyLock`) holds the rules a lock read as possibly
hostile obeys; a lock that is not valid JSON, or not of this shape, is one message, "this tree's
state file is damaged" (exit 2), and nothing is done."""

from __future__ import annotations

import os
from pathlib import Path

from codegen.core.contain import inside
from codegen.core.errors import UserError
from codegen.apply.journal import StateDamaged
from codegen.models.lock import LOCK_NAME, ApplyLock
from codegen.models.records import RecordError, read_record


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
        return read_record(ApplyLock, p, what="lock file", hint=hint)
    except UserError as exc:   # RecordError and Escape included
        shape = isinstance(exc, RecordError) and exc.kind == "shape"
        why = exc.problem if isinstance(exc, RecordError) else str(exc)
        raise StateDamaged(f"{p}: this tree's state file is damaged (unreadable lock file"
                           f"{', not what mi100-codegen writes' if shape else ''}: {why}); nothing was changed",
                           hint=hint) from None
