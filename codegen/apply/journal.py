"""All-or-nothing changes to a folder we do not own: stage, journal, swap; recover after a kill or
a failure. The one transaction engine: `apply`/`revert` change an AOTriton tree with it, `torch
install`/`torch restore` a torch folder (and the backup folder beside it, a second root).

Layout inside the tree (hidden state dir `.mi100-codegen/`):

    .mi100-codegen/txn/new/<n>        staged new contents (fsynced)
    .mi100-codegen/txn/old/<n>        hard links (or copies) of the files about to be replaced
    .mi100-codegen/txn/journal.json   the operation list; its atomic appearance is the commit point
    .mi100-codegen/txn/rollback.json  renamed from journal.json when the operations must be undone

Protocol:
1. check every operation's path (`codegen.core.contain.inside` its root: no link on the way,
   nothing but a regular file where a file is written), stage every new content (bytes, or a
   file copied in chunks: memory stays bounded whatever its size) and link every old one under
   txn/, recording each path's state before (`pre`) and the sha256 of what is written (`new`);
   nothing in the tree changes, so a failure here leaves the tree as it was;
2. write journal.json atomically (tmp + fsync + rename + fsync dir) -> committed;
3. run the operations (mkdir, write = rename staged file over the destination, delete, rmdir,
   rename within a root, check = the path holds what it must, else the whole is undone); each is
   idempotent, so running them again after a kill is harmless;
4. delete the journal, then txn/.

A failure inside step 3 (EPERM, EROFS, ENOSPC, EIO, a directory that appeared in the way)
renames the journal to rollback.json and undoes every operation. Undo steps look at the tree,
not at a counter, so they are idempotent and an operation that never ran is left alone: a file
is put back only where it holds what this transaction wrote. Then every path is compared with
its recorded `pre` state: only when all match does the command say the tree is unchanged
(`TxnFailed`); otherwise `RollbackIncomplete` names each path and its cause, and txn/ (with the
pristine copies) stays so that the next command — each starts with `recover` — finishes the undo
once the cause is fixed.

Recovery (`recover`): txn/ without a journal -> the kill came before the commit point: discard
txn/ (the tree was never touched). journal.json -> roll forward, once every path is checked to
hold its state before or one the journal writes (`Diverged` otherwise: nothing runs); a failure
while doing so rolls back as above. rollback.json -> finish the undo. Ctrl-C before the commit
point discards the stage; after it, the swap is finished first (`Finished`).

The journal is read as possibly hostile: one typed model (`Journal`), every path under the
containment rule, its other roots those the command names (`RootsDiffer` otherwise), and
anything else is `StateDamaged` (exit 2, with the recovery commands): nothing runs.

`MI100_CODEGEN_TXN_DELAY` (seconds, test-only) sleeps between operations so that kill tests can
land inside step 3.
"""

from __future__ import annotations

import contextlib
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
from codegen.core.fsutil import sha256, sha256_file
from codegen.models.journal import STATE_DIR, TXN_DIR, Journal, JournalOp
from codegen.models.records import RecordError, read_record

CHUNK = 1 << 20   # bytes read and written at a time when a file is staged


class StateDamaged(UserError):
    """A state file of the tree (lock, journal) that is not what mi100-codegen writes: nothing is
    done, and the message names the file and how to recover."""


class RootsDiffer(StateDamaged):
    """The journal was written for other folders than the ones this command names (`journal`)."""

    def __init__(self, msg: str, journal: Journal, hint: str | None = None):
        super().__init__(msg, hint=hint)
        self.journal = journal


class Diverged(StateDamaged):
    """A committed journal whose paths no longer hold what it recorded or writes: changed since by
    something else; rolling it forward would overwrite that, so nothing runs. `paths` lists them."""

    def __init__(self, msg: str, paths: list[str], hint: str | None = None):
        super().__init__(msg, hint=hint)
        self.paths = paths


class StagedDiffers(Exception):
    """A file copied into the stage is not the content the caller expected (changed meanwhile)."""

    def __init__(self, path: str, src: Path, got: str):
        super().__init__(f"{src}: not the content expected for {path} (sha256 {got[:12]}…)")
        self.path, self.src, self.got = path, src, got


class Mismatch(Exception):
    """A `check` operation found its path not holding what it must."""


class Finished(KeyboardInterrupt):
    """Ctrl-C after the commit point: the operations were finished first, then this is raised
    (its words: what was finished, for the interrupted message)."""


class TxnFailed(Exception):
    """The transaction failed and the tree is exactly as it was before it (checked)."""

    def __init__(self, exc: Exception, committed: bool, leftover: Path | None = None):
        super().__init__(str(exc))
        self.cause, self.committed, self.leftover = exc, committed, leftover


class RollbackIncomplete(Exception):
    """The transaction failed and undoing it could not put every path back: `left` lists them."""

    def __init__(self, cause: Exception | None, left: list[str]):
        super().__init__("; ".join(left))
        self.cause, self.left = cause, left


_FAILURES = (OSError, Escape, Mismatch)   # what rolls a committed transaction back


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


def copy_durable(src: Path, dest: Path) -> str:
    """Copy the regular file `src` (a link followed) to `dest` in CHUNK-sized pieces, synced, with
    its permission bits and times; returns the sha256 of the bytes copied."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Escape(f"{src}: not a regular file")
        with open(dest, "wb") as out:
            while chunk := os.read(fd, CHUNK):
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    finally:
        os.close(fd)
    os.chmod(dest, stat.S_IMODE(st.st_mode))
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    return h.hexdigest()


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
    return sha256_file(path)


@dataclass
class Op:
    op: str  # mkdir | write | delete | rmdir | rename | check
    path: str  # root-relative
    data: bytes | None = None
    mode: int | None = None
    src: Path | None = None   # write: the content copied from this file (its mode and times kept)
    sha: str | None = None    # write from src: the sha256 it must have; check: the content wanted (None: absent)
    root: int = 0             # 0: the tree; n: Transaction.others[n-1]
    to: str | None = None     # rename: the new name


def _txn_dir(tree: Path) -> Path:
    """The transaction folder, refused when a link or a file stands on its way."""
    return inside(tree, TXN_DIR)


def _roots(tree: Path, others) -> list[Path]:
    return [Path(tree), *(Path(o) for o in others)]


_WHAT = {"dir": "a directory", "link": "a symbolic link", "other": "not a regular file"}


def _preflight(roots: list[Path], op: Op) -> Path:
    """The destination of one operation, checked before anything is staged: inside its root,
    and no directory or other non-file where a file is written or deleted."""
    dest = inside(roots[op.root], op.path, final_link=op.op == "delete")
    pre = state_of(dest)
    if op.op == "write" and pre in ("dir", "other", "link"):
        raise Escape(f"{dest}: is {_WHAT[pre]}, where a file is to be written; remove or move it first")
    if op.op == "mkdir" and pre not in ("absent", "dir"):
        raise Escape(f"{dest}: exists and is not a directory, where a directory is to be made")
    if op.op == "rename":
        to = inside(roots[op.root], op.to)
        if pre in ("absent", "link"):
            raise Escape(f"{dest}: is {'absent' if pre == 'absent' else 'a symbolic link'}, where it is to be renamed")
        if os.path.lexists(to):
            raise Escape(f"{to}: exists, where {dest.name} is to be renamed to")
    return dest


@dataclass
class Transaction:
    """Collect operations, then `commit()` them atomically. `others`: folders besides the tree
    that operations with `root=n` change (others[n-1]); the journal stays in the tree."""

    tree: Path
    others: tuple[Path, ...] = ()
    label: str | None = None
    ops: list[Op] = field(default_factory=list)

    def mkdir(self, rel: str, root: int = 0) -> None:
        self.ops.append(Op("mkdir", rel, root=root))

    def write(self, rel: str, data: bytes, mode: int = 0o644, root: int = 0) -> None:
        self.ops.append(Op("write", rel, data, mode, root=root))

    def copy(self, rel: str, src: Path, sha: str | None = None, root: int = 0) -> None:
        """Write the content of the file `src` (streamed; its mode and times kept); `sha`: what it
        must hold (else StagedDiffers before anything changes)."""
        self.ops.append(Op("write", rel, src=Path(src), sha=sha, root=root))

    def delete(self, rel: str, root: int = 0) -> None:
        self.ops.append(Op("delete", rel, root=root))

    def rmdir(self, rel: str, root: int = 0) -> None:
        self.ops.append(Op("rmdir", rel, root=root))

    def rename(self, rel: str, to: str, root: int = 0) -> None:
        self.ops.append(Op("rename", rel, root=root, to=to))

    def check(self, rel: str, sha: str | None, root: int = 0) -> None:
        """Stop (and undo everything) unless `rel` holds the content `sha` (None: nothing) then."""
        self.ops.append(Op("check", rel, sha=sha, root=root))

    def commit(self) -> None:
        """Run the operations all or nothing. Raises TxnFailed (the tree is as it was, checked),
        RollbackIncomplete (it is not; txn/ kept for `recover`), Escape or StagedDiffers
        (refused before anything was written)."""
        if not self.ops:
            return
        roots = _roots(self.tree, self.others)
        dests = [_preflight(roots, op) for op in self.ops]  # Escape: nothing written
        txn = _txn_dir(self.tree)
        if txn.exists():  # recover() must have run first
            raise RuntimeError(f"{txn} exists: an interrupted transaction was not recovered")
        try:
            entries = [_stage(txn, n, op, dest) for n, (op, dest) in enumerate(zip(self.ops, dests))]
            fsync_dir(txn / "new")
            doc = Journal(version=1, label=self.label, roots=[str(o) for o in self.others],
                          ops=entries).model_dump(exclude_none=True, exclude_defaults=True)
            write_durable(txn / "journal.tmp", json.dumps(doc, indent=1, sort_keys=True).encode())
            os.replace(txn / "journal.tmp", txn / "journal.json")  # the commit point
            fsync_dir(txn)
        except BaseException as exc:
            shutil.rmtree(txn, ignore_errors=True)
            _cleanup_state_dir(self.tree)
            if isinstance(exc, OSError):
                raise TxnFailed(exc, committed=False) from None
            raise
        _forward(roots, entries)


def _stage(txn: Path, n: int, op: Op, dest: Path) -> JournalOp:
    """Step 1 for one operation: its new content and its old one under txn/, and its record."""
    ent: dict = {"op": op.op, "path": op.path, "pre": state_of(dest), "root": op.root, "to": op.to}
    if op.op == "write" and op.src is not None:
        got = copy_durable(op.src, txn / "new" / str(n))
        if op.sha is not None and got != op.sha:
            raise StagedDiffers(op.path, op.src, got)
        ent.update(stage=str(n), new=got)
    elif op.op == "write":
        assert op.data is not None
        write_durable(txn / "new" / str(n), op.data, op.mode)
        ent.update(stage=str(n), new=sha256(op.data), mode=perm_bits(op.mode))
    elif op.op == "check":
        ent["new"] = op.sha
    if op.op in ("write", "delete") and dest.is_file() and not dest.is_symlink():
        old = txn / "old" / str(n)
        old.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(dest, old)
        except OSError:
            shutil.copy2(dest, old)
        ent["old"] = str(n)
    return JournalOp(**{k: v for k, v in ent.items() if v is not None})


def _delay() -> None:
    d = os.environ.get("MI100_CODEGEN_TXN_DELAY")
    if d:
        time.sleep(float(d))


def _forward(roots: list[Path], entries: list[JournalOp]) -> None:
    """Run a committed journal; on failure roll it back (TxnFailed / RollbackIncomplete)."""
    txn = roots[0] / TXN_DIR
    try:
        _run(roots, entries)
    except KeyboardInterrupt:  # committed: finish the swap (each op is idempotent), then stop
        _run(roots, entries)
        _finish(roots[0])
        raise Finished("it came after the commit point, so the change was finished first") from None
    except _FAILURES as exc:
        os.replace(txn / "journal.json", txn / "rollback.json")
        _rollback(roots, entries, exc)
    _finish(roots[0])


def _run(roots: list[Path], entries: list[JournalOp]) -> None:
    for ent in entries:
        _delay()
        try:
            _run_one(roots, ent)
        except OSError as exc:  # named by the tree path it was for, not by a staged file's
            raise OSError(exc.errno, exc.strerror, ent.path) from None
    for d in sorted({(roots[ent.root] / ent.path).parent for ent in entries}):
        if d.is_dir():
            fsync_dir(d)


def _run_one(roots: list[Path], ent: JournalOp) -> None:
    txn = roots[0] / TXN_DIR
    dest = inside(roots[ent.root], ent.path, final_link=ent.op == "delete")
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
    elif ent.op == "rename":
        to = inside(roots[ent.root], ent.to)
        if os.path.lexists(dest) and not os.path.lexists(to):
            os.rename(dest, to)
        elif not os.path.lexists(to):   # else: renamed by an earlier (killed) run
            raise FileNotFoundError(2, "vanished before it was renamed", ent.path)
    elif ent.op == "check":
        now = state_of(dest)
        if now != (ent.new or "absent"):
            raise Mismatch(f"{ent.path}: holds {_says(now)}, not what this transaction wrote there")


def _undo_one(roots: list[Path], ent: JournalOp) -> None:
    """Put one path back to its `pre` state if this transaction changed it; leave it alone if it
    never did (the operation did not run, or was undone already)."""
    txn = roots[0] / TXN_DIR
    dest = inside(roots[ent.root], ent.path, final_link=True)
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
    elif ent.op == "rename" and now == "absent":
        to = inside(roots[ent.root], ent.to, final_link=True)
        if os.path.lexists(to):
            os.rename(to, dest)


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


def _rollback(roots: list[Path], entries: list[JournalOp], cause: Exception | None) -> None:
    """Undo every operation (last first), then check each path against its `pre` state."""
    failed: dict[tuple[int, str], str] = {}
    for ent in reversed(entries):
        try:
            _undo_one(roots, ent)
        except (OSError, Escape) as exc:
            failed.setdefault((ent.root, ent.path), os_reason(exc) if isinstance(exc, OSError) else str(exc))
    left = []
    for (root, path), pre in _first_pre(entries).items():
        try:
            now = state_of(inside(roots[root], path, final_link=True))
        except (OSError, Escape) as exc:
            now = f"unreadable ({exc})"
        if now != pre:
            where = path if root == 0 else str(roots[root] / path)
            left.append(f"{where}: {failed.get((root, path), 'not as it was before (' + _says(now) + ', was ' + _says(pre) + ')')}")
    if left:
        raise RollbackIncomplete(cause, left)
    clean = _finish(roots[0])
    if cause is not None:
        raise TxnFailed(cause, committed=True, leftover=None if clean else roots[0] / TXN_DIR)


def _says(state: str) -> str:
    return state if state in ("absent", "dir", "link", "other") or " " in state else "a file of other content"


def _first_pre(entries: list[JournalOp]) -> dict[tuple[int, str], str]:
    """Each path's state before the transaction (a rename's new name: absent)."""
    out: dict[tuple[int, str], str] = {}
    for ent in entries:
        out.setdefault((ent.root, ent.path), ent.pre)
        if ent.to is not None:
            out.setdefault((ent.root, ent.to), "absent")
    return out


def _diverged(roots: list[Path], entries: list[JournalOp]) -> list[str]:
    """The paths of a committed journal that hold neither their state before it nor one of the
    states its operations leave: changed by something else since."""
    allowed: dict[tuple[int, str], set[str]] = {}
    for key, pre in _first_pre(entries).items():
        allowed[key] = {pre}
    for ent in entries:
        key = (ent.root, ent.path)
        allowed[key] |= {"write": {ent.new}, "delete": {"absent"}, "mkdir": {"dir"}, "rmdir": {"absent", "dir"},
                         "rename": {"absent"}, "check": set()}[ent.op]
        if ent.to is not None:
            allowed[(ent.root, ent.to)].add(ent.pre)
    out = []
    for (root, path), states in allowed.items():
        try:
            now = state_of(inside(roots[root], path, final_link=True))
        except (OSError, Escape) as exc:
            now = f"unreadable ({exc})"
        if now not in states:
            out.append(f"{path if root == 0 else roots[root] / path}: {_says(now)}")
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
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


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


def _read_journal(tree: Path, name: str, others, hint: str | None) -> Journal:
    """The journal, its roots those named, every path checked; StateDamaged otherwise (nothing done)."""
    path = tree / TXN_DIR / name
    hint = hint or ("an earlier command was interrupted and its record cannot be trusted: "
                    + RECOVERY.format(txn=tree / TXN_DIR, tree=tree))
    roots = _roots(tree, others)
    try:
        _txn_dir(tree)
        journal = read_record(Journal, path, what="journal", hint=hint)
        if journal.roots != [str(r) for r in roots[1:]]:
            raise RootsDiffer(f"{path}: an interrupted {journal.label or 'command'} was changing "
                              f"{', '.join(journal.roots) or 'this folder only'} as well, not "
                              f"{', '.join(map(str, roots[1:])) or 'this folder only'}; nothing was changed",
                              journal, hint=hint)
        for ent in journal.ops:
            inside(roots[ent.root], ent.path, final_link=True)
            if ent.to is not None:
                inside(roots[ent.root], ent.to, final_link=True)
    except RootsDiffer:
        raise
    except UserError as exc:   # RecordError and Escape included
        why = exc.problem if isinstance(exc, RecordError) else str(exc)
        raise StateDamaged(f"{path}: this tree's state file is damaged ({why}); nothing was changed",
                           hint=hint) from None
    return journal


def journal_label(tree: Path) -> str | None:
    """The label of the pending journal (the command that wrote it), None when none can be read."""
    for name in ("journal.json", "rollback.json"):
        try:
            return read_record(Journal, Path(tree) / TXN_DIR / name, what="journal").label
        except UserError:
            continue
    return None


def recover(tree: Path, others=(), *, hint: str | None = None, vet=None) -> str | None:
    """Complete or undo an interrupted transaction; returns what was done (or None). `others`:
    the folders besides the tree the command changes (the journal must name the same); `vet`:
    called with the journal before anything runs, raises to refuse it. Raises
    StateDamaged (RootsDiffer, Diverged) for a journal it cannot trust or follow,
    RollbackIncomplete when undoing is still blocked (TxnFailed when a roll-forward failed and
    was rolled back)."""
    tree = Path(tree)
    what = pending(tree)
    txn = tree / TXN_DIR
    roots = _roots(tree, others)
    if what in ("forward", "rollback"):
        journal = _read_journal(tree, f"{'journal' if what == 'forward' else 'rollback'}.json", others, hint)
        if vet is not None:
            vet(journal)
    if what == "forward":
        entries = journal.ops
        moved = _diverged(roots, entries)
        if moved:
            raise Diverged(f"{tree}: an interrupted command's journal ({txn / 'journal.json'}) cannot be finished: "
                           f"{len(moved)} path(s) changed since it was written:\n" + "\n".join(moved[:10])
                           + "\nnothing was changed", moved,
                           hint=hint or RECOVERY.format(txn=txn, tree=tree))
        _forward(roots, entries)
    elif what == "rollback":
        _rollback(roots, journal.ops, None)
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
