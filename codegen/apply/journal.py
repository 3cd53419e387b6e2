"""All-or-nothing changes to a tree: stage, journal, swap; recover after a kill or a failure.

Layout inside the tree (hidden state dir `.mi100-codegen/`):

    .mi100-codegen/txn/new/<n>        staged new contents (fsynced)
    .mi100-codegen/txn/old/<n>        hard links (or copies) of the files about to be replaced
    .mi100-codegen/txn/journal.json   the operation list; its atomic appearance is the commit point
    .mi100-codegen/txn/rollback.json  renamed from journal.json when the operations must be undone

Protocol:
1. check every operation's path (`codegen.core.contain.inside`: no link on the way, nothing but a
   regular file where a file is written), stage every new content and link every old one under
   txn/, recording each path's state before (`pre`) and the sha256 of what is written (`new`);
   nothing in the tree changes, so a failure here leaves the tree as it was;
2. write journal.json atomically (tmp + fsync + rename + fsync dir) -> committed;
3. run the operations (mkdir, write = rename staged file over the destination, delete, rmdir);
   each is idempotent, so running them again after a kill is harmless;
4. delete the journal, then txn/.

A failure inside step 3 (EPERM, EROFS, ENOSPC, EIO, a directory that appeared in the way)
renames the journal to rollback.json and undoes every operation. Undo steps look at the tree,
not at a counter, so they are idempotent and an operation that never ran is left alone: a file
is put back only where it holds what this transaction wrote. Then every path is compared with
its recorded `pre` state: only when all match does the command say the tree is unchanged
(`TxnFailed`); otherwise `RollbackIncomplete` names each path and its cause, and txn/ (with the
pristine copies) stays so that the next command — any apply or revert starts with `recover` —
finishes the undo once the cause is fixed.

Recovery (`recover`): txn/ without a journal -> the kill came before the commit point: discard
txn/ (the tree was never touched). journal.json -> roll forward (a failure while doing so rolls
back as above). rollback.json -> finish the undo. Ctrl-C before the commit point discards the
stage; after it, the swap is finished first.

The journal is read as possibly hostile: one typed model (`Journal`), every path under the
containment rule, and anything else is `StateDamaged` (exit 2, with the recovery commands):
nothing runs.

`MI100_CODEGEN_TXN_DELAY` (seconds, test-only) sleeps between operations so that kill tests can
land inside step 3.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from codegen.core.contain import Escape, inside, perm_bits
from codegen.core.errors import UserError, os_reason
from codegen.models.journal import STATE_DIR, TXN_DIR, Journal, JournalOp
from codegen.models.records import RecordError, read_record


class StateDamaged(UserError):
    """A state file of the tree (lock, journal) that is not what mi100-codegen writes: nothing is
    done, and the message names the file and how to recover."""


class TxnFailed(Exception):
    """The transaction failed and the tree is exactly as it was before it (checked)."""

    def __init__(self, exc: OSError | Escape, committed: bool, leftover: Path | None = None):
        super().__init__(str(exc))
        self.cause, self.committed, self.leftover = exc, committed, leftover


class RollbackIncomplete(Exception):
    """The transaction failed and undoing it could not put every path back: `left` lists them."""

    def __init__(self, cause: OSError | Escape | None, left: list[str]):
        super().__init__("; ".join(left))
        self.cause, self.left = cause, left


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if mode is not None:
        os.chmod(path, perm_bits(mode))


def state_of(path: Path) -> str:
    """What is at `path` now, in the journal's `pre` vocabulary."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if not stat.S_ISREG(st.st_mode):
        return "other"
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Op:
    op: str  # mkdir | write | delete | rmdir
    path: str  # tree-relative
    data: bytes | None = None
    mode: int | None = None


def _txn_dir(tree: Path) -> Path:
    """The transaction folder, refused when a link or a file stands on its way."""
    return inside(tree, TXN_DIR)


def _preflight(tree: Path, op: Op) -> Path:
    """The destination of one operation, checked before anything is staged: inside the tree,
    and no directory or other non-file where a file is written or deleted."""
    dest = inside(tree, op.path, final_link=op.op == "delete")
    pre = state_of(dest)
    if op.op == "write" and pre in ("dir", "other", "link"):
        what = {"dir": "a directory", "link": "a symbolic link", "other": "not a regular file"}[pre]
        raise Escape(f"{dest}: is {what}, where a file is to be written; remove or move it first")
    if op.op == "mkdir" and pre not in ("absent", "dir"):
        raise Escape(f"{dest}: exists and is not a directory, where a directory is to be made")
    return dest


@dataclass
class Transaction:
    """Collect operations, then `commit()` them atomically."""

    tree: Path
    ops: list[Op] = field(default_factory=list)

    def mkdir(self, rel: str) -> None:
        self.ops.append(Op("mkdir", rel))

    def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        self.ops.append(Op("write", rel, data, mode))

    def delete(self, rel: str) -> None:
        self.ops.append(Op("delete", rel))

    def rmdir(self, rel: str) -> None:
        self.ops.append(Op("rmdir", rel))

    def commit(self) -> None:
        """Run the operations all or nothing. Raises TxnFailed (the tree is as it was, checked),
        RollbackIncomplete (it is not; txn/ kept for `recover`) or Escape (refused before
        anything was written)."""
        if not self.ops:
            return
        dests = [_preflight(self.tree, op) for op in self.ops]  # Escape: nothing written
        txn = _txn_dir(self.tree)
        if txn.exists():  # recover() must have run first
            raise RuntimeError(f"{txn} exists: an interrupted transaction was not recovered")
        entries: list[JournalOp] = []
        try:
            for n, (op, dest) in enumerate(zip(self.ops, dests)):
                ent: dict = {"op": op.op, "path": op.path, "pre": state_of(dest)}
                if op.op == "write":
                    assert op.data is not None
                    write_durable(txn / "new" / str(n), op.data, op.mode)
                    ent.update(stage=str(n), new=hashlib.sha256(op.data).hexdigest(), mode=perm_bits(op.mode))
                if op.op in ("write", "delete") and dest.is_file() and not dest.is_symlink():
                    old = txn / "old" / str(n)
                    old.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(dest, old)
                    except OSError:
                        shutil.copy2(dest, old)
                    ent["old"] = str(n)
                entries.append(JournalOp(**ent))
            fsync_dir(txn / "new")
            doc = Journal(version=1, ops=entries).model_dump(exclude_none=True)
            write_durable(txn / "journal.tmp", json.dumps(doc, indent=1, sort_keys=True).encode())
            os.replace(txn / "journal.tmp", txn / "journal.json")  # the commit point
            fsync_dir(txn)
        except BaseException as exc:
            shutil.rmtree(txn, ignore_errors=True)
            _cleanup_state_dir(self.tree)
            if isinstance(exc, OSError):
                raise TxnFailed(exc, committed=False) from None
            raise
        _forward(self.tree, entries)


def _delay() -> None:
    d = os.environ.get("MI100_CODEGEN_TXN_DELAY")
    if d:
        time.sleep(float(d))


def _forward(tree: Path, entries: list[JournalOp]) -> None:
    """Run a committed journal; on failure roll it back (TxnFailed / RollbackIncomplete)."""
    txn = tree / TXN_DIR
    try:
        _run(tree, entries)
    except KeyboardInterrupt:  # committed: finish the swap (each op is idempotent), then stop
        _run(tree, entries)
        _finish(tree)
        raise
    except (OSError, Escape) as exc:
        os.replace(txn / "journal.json", txn / "rollback.json")
        _rollback(tree, entries, exc)
    _finish(tree)


def _run(tree: Path, entries: list[JournalOp]) -> None:
    for ent in entries:
        _delay()
        try:
            _run_one(tree, ent)
        except OSError as exc:  # named by the tree path it was for, not by a staged file's
            raise OSError(exc.errno, exc.strerror, ent.path) from None
    for d in sorted({(tree / ent.path).parent for ent in entries}):
        if d.is_dir():
            fsync_dir(d)


def _run_one(tree: Path, ent: JournalOp) -> None:
    txn = tree / TXN_DIR
    dest = inside(tree, ent.path, final_link=ent.op == "delete")
    if ent.op == "mkdir":  # parents too: a backup folder's (the state dir is cleaned up after)
        dest.mkdir(parents=True, exist_ok=True)
    elif ent.op == "write":
        staged = txn / "new" / ent.stage
        if staged.exists():  # else: moved by an earlier (killed) run
            os.replace(staged, dest)
    elif ent.op == "delete":
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
    elif ent.op == "rmdir":
        if dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir()):
            dest.rmdir()


def _undo_one(tree: Path, ent: JournalOp) -> None:
    """Put one path back to its `pre` state if this transaction changed it; leave it alone if it
    never did (the operation did not run, or was undone already)."""
    txn = tree / TXN_DIR
    dest = inside(tree, ent.path, final_link=True)
    now = state_of(dest)
    old = txn / "old" / ent.old if ent.old else None
    if ent.op == "write" and now == ent.new and now != ent.pre:
        if old is not None and old.exists():
            os.replace(old, dest)
        elif ent.pre == "absent":
            dest.unlink()
    elif ent.op == "delete" and now == "absent" and old is not None and old.exists():
        os.replace(old, dest)
    elif ent.op == "mkdir" and ent.pre == "absent" and now == "dir":
        _remove_empty_dirs(dest)
    elif ent.op == "rmdir" and ent.pre == "dir" and now == "absent":
        dest.mkdir()


def _remove_empty_dirs(top: Path) -> None:
    """Remove `top` if it holds nothing but empty folders (a mkdir with parents made those)."""
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        if filenames:
            return
        for d in dirnames:
            p = Path(dirpath) / d
            if not p.is_symlink() and p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    if not any(top.iterdir()):
        top.rmdir()


def _rollback(tree: Path, entries: list[JournalOp], cause: OSError | Escape | None) -> None:
    """Undo every operation (last first), then check each path against its `pre` state."""
    failed: dict[str, str] = {}
    for ent in reversed(entries):
        try:
            _undo_one(tree, ent)
        except (OSError, Escape) as exc:
            failed.setdefault(ent.path, os_reason(exc) if isinstance(exc, OSError) else str(exc))
    left = []
    for path, pre in _first_pre(entries).items():
        try:
            now = state_of(inside(tree, path, final_link=True))
        except (OSError, Escape) as exc:
            now = f"unreadable ({exc})"
        if now != pre:
            left.append(f"{path}: {failed.get(path, 'not as it was before (' + _says(now) + ', was ' + _says(pre) + ')')}")
    if left:
        raise RollbackIncomplete(cause, left)
    clean = _finish(tree)
    if cause is not None:
        raise TxnFailed(cause, committed=True, leftover=None if clean else tree / TXN_DIR)


def _says(state: str) -> str:
    return state if state in ("absent", "dir", "link", "other") or " " in state else "a file of other content"


def _first_pre(entries: list[JournalOp]) -> dict[str, str]:
    out: dict[str, str] = {}
    for ent in entries:
        out.setdefault(ent.path, ent.pre)
    return out


def _finish(tree: Path) -> bool:
    """Remove the journal, then txn/ (best effort: a leftover txn/ without a journal is discarded
    by the next command's `recover`); True when txn/ is gone."""
    txn = tree / TXN_DIR
    try:
        for name in ("journal.json", "rollback.json"):
            p = txn / name
            if p.exists():
                p.unlink()
        fsync_dir(txn)
    except OSError:
        return False
    shutil.rmtree(txn, ignore_errors=True)
    _cleanup_state_dir(tree)
    return not os.path.lexists(txn)


def _cleanup_state_dir(tree: Path) -> None:
    """Remove empty directories of the state dir (a reverted tree keeps no trace); a state dir
    that is a link is never walked."""
    root = tree / STATE_DIR
    if root.is_symlink() or not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir() and not p.is_symlink()),
                    key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        root.rmdir()
    except OSError:
        pass


def pending(tree: Path) -> str | None:
    """'forward', 'rollback', 'discard' or None: what `recover` would do."""
    txn = Path(tree) / TXN_DIR
    if os.path.lexists(txn / "journal.json"):
        return "forward"
    if os.path.lexists(txn / "rollback.json"):
        return "rollback"
    if os.path.lexists(txn):
        return "discard"
    return None


RECOVERY = ("remove {txn} (rm -r), then run `mi100-codegen revert --force {tree}` to put back every file apply "
            "recorded, from its backup; or start again from a fresh copy of the release")


def _read_journal(tree: Path, name: str) -> list[JournalOp]:
    """The journal's operations, every path checked; StateDamaged otherwise (nothing done)."""
    path = tree / TXN_DIR / name
    hint = "an earlier command was interrupted and its record cannot be trusted: " + \
        RECOVERY.format(txn=tree / TXN_DIR, tree=tree)
    try:
        _txn_dir(tree)
        entries = read_record(Journal, path, what="journal", hint=hint).ops
        for ent in entries:
            inside(tree, ent.path, final_link=True)
    except UserError as exc:   # RecordError and Escape included
        why = exc.problem if isinstance(exc, RecordError) else str(exc)
        raise StateDamaged(f"{path}: this tree's state file is damaged ({why}); nothing was changed",
                           hint=hint) from None
    return entries


def recover(tree: Path) -> str | None:
    """Complete or undo an interrupted transaction; returns what was done (or None). Raises
    StateDamaged for a journal it cannot trust, RollbackIncomplete when undoing is still blocked
    (TxnFailed when a roll-forward failed and was rolled back)."""
    tree = Path(tree)
    what = pending(tree)
    txn = tree / TXN_DIR
    if what == "forward":
        _forward(tree, _read_journal(tree, "journal.json"))
    elif what == "rollback":
        _rollback(tree, _read_journal(tree, "rollback.json"), None)
    elif what == "discard":
        try:
            _txn_dir(tree)
        except Escape as exc:
            raise StateDamaged(f"{exc}; nothing was changed",
                               hint=f"remove {txn} (it holds no journal, so nothing of the tree depends on it)") \
                from None
        shutil.rmtree(txn, ignore_errors=True)
        _cleanup_state_dir(tree)
    else:
        _cleanup_state_dir(tree)
    return what


class TreeBusy(Exception):
    pass


@contextmanager
def tree_lock(tree: Path):
    """Exclusive advisory lock on the tree directory itself (flock on its fd): nothing is written
    into the tree for it, so a reverted tree stays byte-identical. Released by the kernel when
    the process dies."""
    fd = os.open(tree, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TreeBusy(str(tree)) from None
        yield
    finally:
        os.close(fd)


__all__ = ["STATE_DIR", "TXN_DIR", "Journal", "JournalOp", "RollbackIncomplete", "StateDamaged", "Transaction",
           "TreeBusy", "TxnFailed", "pending", "recover", "state_of", "tree_lock"]
