"""All-or-nothing changes to a tree: stage, journal, swap; recover after a kill.

Layout inside the tree (hidden state dir `.mi100-codegen/`):

    .mi100-codegen/txn/new/<n>        staged new contents (fsynced)
    .mi100-codegen/txn/old/<n>        hard links (or copies) of the files about to be replaced
    .mi100-codegen/txn/journal.json   the operation list; its atomic appearance is the commit point
    .mi100-codegen/txn/rollback.json  renamed from journal.json when an in-process failure undoes it

Protocol:
1. stage every new content and link every old one under txn/ (nothing in the tree changes);
2. write journal.json atomically (tmp + fsync + rename + fsync dir) -> committed;
3. run the operations (mkdir, write = rename staged file over the destination, delete, rmdir);
   each is idempotent, so running them again after a kill is harmless;
4. delete the journal, then txn/.

Recovery (`recover`, run first by every apply and revert): txn/ without a journal -> the kill
came before the commit point: discard txn/ (the tree was never touched). journal.json -> roll
forward (finish step 3-4). rollback.json -> finish the undo. A failure inside step 3 (e.g. a
permission error) renames the journal to rollback.json and undoes the operations done so far,
so a failed apply leaves the tree as it was. Ctrl-C before the commit point discards the stage
(the tree was never touched); after it, the swap is finished first: either way the tree is
pristine or fully applied when the command stops.

`MI100_CODEGEN_TXN_DELAY` (seconds, test-only) sleeps between operations so that kill tests can
land inside step 3.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

STATE_DIR = ".mi100-codegen"
TXN_DIR = f"{STATE_DIR}/txn"


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
        os.chmod(path, mode)


@dataclass
class Op:
    op: str  # mkdir | write | delete | rmdir
    path: str  # tree-relative
    data: bytes | None = None
    mode: int | None = None


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
        if not self.ops:
            return
        txn = self.tree / TXN_DIR
        if txn.exists():  # recover() must have run first
            raise RuntimeError(f"{txn} exists: an interrupted transaction was not recovered")
        entries = []
        try:
            for n, op in enumerate(self.ops):
                ent = {"op": op.op, "path": op.path}
                dest = self.tree / op.path
                if op.op == "write":
                    assert op.data is not None
                    write_durable(txn / "new" / str(n), op.data, op.mode)
                    ent["stage"] = str(n)
                if op.op in ("write", "delete") and dest.is_file():
                    old = txn / "old" / str(n)
                    old.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(dest, old)
                    except OSError:
                        shutil.copy2(dest, old)
                    ent["old"] = str(n)
                entries.append(ent)
            fsync_dir(txn / "new")
            journal = json.dumps({"version": 1, "ops": entries}, indent=1, sort_keys=True).encode()
            write_durable(txn / "journal.tmp", journal)
            os.replace(txn / "journal.tmp", txn / "journal.json")  # the commit point
            fsync_dir(txn)
        except BaseException:
            shutil.rmtree(txn, ignore_errors=True)
            _cleanup_state_dir(self.tree)
            raise
        try:
            _run(self.tree, entries)
        except KeyboardInterrupt:  # committed: finish the swap (each op is idempotent), then stop
            _run(self.tree, entries)
            _finish(self.tree)
            raise
        except Exception:
            os.replace(txn / "journal.json", txn / "rollback.json")
            _undo(self.tree, entries)
            raise
        _finish(self.tree)


def _delay() -> None:
    d = os.environ.get("MI100_CODEGEN_TXN_DELAY")
    if d:
        time.sleep(float(d))


def _run(tree: Path, entries: list[dict]) -> None:
    txn = tree / TXN_DIR
    touched: set[Path] = set()
    for ent in entries:
        _delay()
        dest = tree / ent["path"]
        if ent["op"] == "mkdir":
            dest.mkdir(parents=True, exist_ok=True)
        elif ent["op"] == "write":
            staged = txn / "new" / ent["stage"]
            if staged.exists():  # else: moved by an earlier (killed) run
                os.replace(staged, dest)
        elif ent["op"] == "delete":
            if dest.is_file() or dest.is_symlink():
                dest.unlink()
        elif ent["op"] == "rmdir":
            if dest.is_dir() and not any(dest.iterdir()):
                dest.rmdir()
        else:
            raise RuntimeError(f"journal: unknown op {ent['op']!r}")
        touched.add(dest.parent)
    for d in sorted(touched):
        if d.is_dir():
            fsync_dir(d)


def _undo(tree: Path, entries: list[dict]) -> None:
    txn = tree / TXN_DIR
    for ent in reversed(entries):
        dest = tree / ent["path"]
        if ent["op"] in ("write", "delete"):
            old = txn / "old" / ent["old"] if "old" in ent else None
            if old is not None and old.exists():
                os.replace(old, dest)
            elif old is None and ent["op"] == "write" and dest.exists():
                dest.unlink()
        elif ent["op"] == "mkdir":
            if dest.is_dir() and not any(dest.iterdir()):
                dest.rmdir()
        elif ent["op"] == "rmdir":
            dest.mkdir(parents=True, exist_ok=True)
    _finish(tree)


def _finish(tree: Path) -> None:
    txn = tree / TXN_DIR
    for name in ("journal.json", "rollback.json"):
        p = txn / name
        if p.exists():
            p.unlink()
    fsync_dir(txn)
    shutil.rmtree(txn, ignore_errors=True)
    _cleanup_state_dir(tree)


def _cleanup_state_dir(tree: Path) -> None:
    """Remove empty directories of the state dir (a reverted tree keeps no trace)."""
    root = tree / STATE_DIR
    if not root.is_dir():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
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
    if (txn / "journal.json").exists():
        return "forward"
    if (txn / "rollback.json").exists():
        return "rollback"
    if txn.exists():
        return "discard"
    return None


def recover(tree: Path) -> str | None:
    """Complete or undo an interrupted transaction; returns what was done (or None)."""
    tree = Path(tree)
    what = pending(tree)
    txn = tree / TXN_DIR
    if what == "forward":
        entries = json.loads((txn / "journal.json").read_text())["ops"]
        _run(tree, entries)
        _finish(tree)
    elif what == "rollback":
        entries = json.loads((txn / "rollback.json").read_text())["ops"]
        _undo(tree, entries)
    elif what == "discard":
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


__all__ = ["STATE_DIR", "TXN_DIR", "Transaction", "TreeBusy", "pending", "recover", "tree_lock"]
