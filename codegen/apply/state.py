"""What apply and revert share: verdicts, the result, the tree lock, the check that applied files
still hold what apply wrote, and the transaction commit. Imports neither libcst nor render, so
`revert` starts fast."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from codegen.core.contain import Escape, inside, perm_bits
from codegen.core.errors import SystemFailure, UserError, os_failure, os_reason
from codegen.core.fsutil import sha256
from codegen.apply.journal import STATE_DIR, RollbackIncomplete, Transaction, TreeBusy, TxnFailed, recover, tree_lock
from codegen.apply.lock import LOCK_NAME, ApplyLock
from codegen.models.lock import TableRows

BACKUP_DIR = f"{STATE_DIR}/backup"
VERDICTS = ("create", "edit", "identical", "conflict", "skip")


class ApplyConflict(UserError):
    """The tree cannot be changed safely; `result` holds the per-file verdicts."""

    def __init__(self, message: str, result: "Result", hint: str | None = None):
        super().__init__(message, hint)
        self.result = result


@dataclass
class FileVerdict:
    path: str
    verdict: str  # create | edit | identical | conflict | skip
    kind: str  # module | edit | db | restore
    edits: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class EditVerdict:
    id: str
    path: str
    verdict: str  # edit | identical | conflict | skip
    detail: str = ""


@dataclass
class Result:
    command: str
    tree: str
    release: str | None = None
    adapter: str | None = None
    spec_sha256: str | None = None
    manifest_sha256: str | None = None
    pretend: bool = False
    recovered: str | None = None
    changed: bool = False
    files: list[FileVerdict] = field(default_factory=list)
    edits: list[EditVerdict] = field(default_factory=list)
    rows: dict[str, dict[str, TableRows]] = field(default_factory=dict)   # db file -> table -> what apply wrote

    @property
    def conflicts(self) -> list[FileVerdict]:
        return [f for f in self.files if f.verdict == "conflict"]

    def to_json(self) -> dict:
        d = asdict(self)
        d["rows"] = {path: {t: st.to_json() for t, st in tables.items()} for path, tables in self.rows.items()}
        d["ok"] = not self.conflicts
        return d


# ----------------------------------------------------------------------------------- helpers --


def sha(data: bytes | None) -> str | None:
    return None if data is None else sha256(data)


def read_rel(tree: Path, rel: str) -> bytes | None:
    """The bytes of the regular file `rel` inside `tree`; None when there is none, or when a link
    or a non-directory stands on the way (`codegen.core.contain.inside`): nothing outside is read."""
    try:
        p = inside(tree, rel)
    except Escape:
        return None
    return p.read_bytes() if p.is_file() else None


def mode_of(tree: Path, rel: str, default: int = 0o644) -> int:
    try:
        return perm_bits(os.stat(inside(tree, rel)).st_mode)
    except (OSError, Escape):
        return default


def link_of(tree: Path, rel: str) -> str | None:
    """'<rel> -> <target>' when rel, or a directory on its way inside the tree, is a symbolic link."""
    parts = Path(rel).parts
    for n in range(1, len(parts) + 1):
        p = tree.joinpath(*parts[:n])
        if p.is_symlink():
            return f"{Path(*parts[:n]).as_posix()} -> {os.readlink(p)}"
    return None


class Locked:
    def __init__(self, tree: Path):
        self.tree = tree
        self.cm = tree_lock(tree)

    def __enter__(self):
        try:
            return self.cm.__enter__()
        except TreeBusy:
            raise UserError(f"{self.tree}: another mi100-codegen command is working on this tree") from None

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def check_state(tree: Path, lock: ApplyLock | None, result: Result) -> None:
    """Applied files must still hold what apply wrote (as regular files), and their backups the
    pristine bytes."""
    if lock is None:
        if (tree / BACKUP_DIR).exists():
            raise UserError(f"{tree}: {BACKUP_DIR}/ exists but {LOCK_NAME} does not",
                            hint=f"restore {LOCK_NAME}, or remove {STATE_DIR}/ if the tree is pristine")
        return
    for rel, ent in sorted(lock.files.items()):
        cur = sha(read_rel(tree, rel))
        link = link_of(tree, rel)
        if ent.before is not None and sha(read_rel(tree, f"{BACKUP_DIR}/{rel}")) != ent.before:
            result.files.append(FileVerdict(rel, "conflict", ent.kind, list(ent.edits),
                                            f"backup {BACKUP_DIR}/{rel} is missing or corrupt"))
        elif cur != ent.after or link:
            what = (f"was replaced by a symbolic link ({link})" if link else
                    "was deleted" if cur is None else "was changed")
            result.files.append(FileVerdict(rel, "conflict", ent.kind, list(ent.edits),
                                            f"{what} since mi100-codegen applied it"))


def conflict_message(result: Result, command: str = "apply") -> str:
    lines = [f"{f.path}: {f.detail}" for f in result.conflicts]
    return f"refusing to {command}, nothing was changed:\n" + "\n".join(lines)


def commit_txn(txn: Transaction, tree: Path, command: str = "apply") -> None:
    """Commit a transaction; every failure is one message that says truthfully what state the
    tree is in (see `codegen.apply.journal`)."""
    try:
        txn.commit()
    except Escape as exc:
        raise UserError(f"{exc}; nothing was changed") from None
    except TxnFailed as exc:
        raise txn_failure(exc, tree, command) from None
    except RollbackIncomplete as exc:
        raise rollback_failure(exc, tree, command) from None


def txn_failure(exc: TxnFailed, tree: Path, command: str) -> UserError:
    cause = exc.cause
    why = os_reason(cause) if isinstance(cause, OSError) else str(cause)
    state = ("the change was rolled back: every file is as it was before" if exc.committed
             else "nothing in the tree was changed")
    msg = f"{tree}: {command} could not write ({why}); {state}"
    if exc.leftover is not None:
        msg += f" (its temporary folder {exc.leftover} remains: the next apply or revert removes it)"
    return os_failure(msg, cause) if isinstance(cause, OSError) else UserError(msg)


def rollback_failure(exc: RollbackIncomplete, tree: Path, command: str) -> UserError:
    cause = exc.cause
    why = (os_reason(cause) if isinstance(cause, OSError) else str(cause)) if cause is not None else None
    head = f"{tree}: {command} failed ({why}) and " if why else f"{tree}: finishing an interrupted rollback: "
    msg = (head + f"{len(exc.left)} path(s) could not be put back yet:\n" + "\n".join(exc.left) +
           f"\nwhat is needed to finish is kept in {tree / STATE_DIR}/txn/")
    hint = (f"fix the cause (permissions, immutable flag, free space), then run `mi100-codegen revert {tree}`: "
            "every apply and revert finishes the rollback first")
    return SystemFailure(msg, hint=hint)


def recover_state(tree: Path, command: str) -> str | None:
    """`journal.recover` with its failures as one message each (run first by apply and revert)."""
    try:
        return recover(tree)
    except TxnFailed as exc:  # a roll-forward failed and was rolled back: the tree is as before it
        raise txn_failure(exc, tree, f"finishing an interrupted {command}") from None
    except RollbackIncomplete as exc:
        raise rollback_failure(exc, tree, command) from None
