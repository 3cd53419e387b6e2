"""`revert`: restore a tree byte-for-byte to its state before the first apply (see
docs/apply.md). Uses no libcst, render or database code."""

from __future__ import annotations

from pathlib import Path

from codegen.core.errors import UserError
from codegen.upstream import UnsupportedTree, detect
from codegen.apply.applied_spec import recorded_paths
from codegen.apply.journal import Transaction
from codegen.apply.lock import LOCK_NAME, ApplyLock, read_lock
from codegen.apply.state import (  # noqa: F401  (ApplyConflict: what revert raises, for callers)
    BACKUP_DIR,
    ApplyConflict,
    FileVerdict,
    Result,
    check_state,
    commit_txn,
    conflict_message,
    Locked,
    read_rel,
    recover_state,
)


def _local_changes(tree: Path, rel: str, pristine: bytes, arch_words: tuple[str, ...]) -> str:
    """What a user changed in an applied file: the lines neither upstream nor apply wrote."""
    cur = read_rel(tree, rel)
    if cur is None:
        return "the file was deleted"
    try:
        now, before = cur.decode("utf-8").splitlines(), set(pristine.decode("utf-8").splitlines())
    except UnicodeDecodeError:
        return "binary content changed"
    ours = lambda line: any(w in line.lower() for w in arch_words)  # noqa: E731
    added = [line.strip() for line in now if line not in before and not ours(line)]
    gone = [line.strip() for line in before - set(now) if not ours(line)]
    parts = [f"+ {line!r}" for line in added[:5]] + [f"- {line!r}" for line in sorted(gone)[:5]]
    more = len(added) + len(gone) - len(parts)
    return ", ".join(parts + ([f"({more} more)"] if more > 0 else [])) or "changed (whitespace or order)"


def _revert_transaction(tree: Path, lock: ApplyLock, discarded: dict[str, str], result: Result) -> Transaction:
    txn = Transaction(tree)
    for rel, ent in sorted(lock.files.items()):
        if ent.before is None:
            if (tree / rel).exists() or (tree / rel).is_symlink():
                txn.delete(rel)
            result.files.append(FileVerdict(rel, "removed", ent.kind, [], discarded.get(rel, "")))
            continue
        data = read_rel(tree, f"{BACKUP_DIR}/{rel}")
        if data is None:  # check_state refuses a missing backup first; never write a guess
            raise UserError(f"{tree}: backup {BACKUP_DIR}/{rel} is missing; nothing was changed")
        same = read_rel(tree, rel) == data and not (tree / rel).is_symlink()
        if not same:
            txn.write(rel, data, ent.mode if ent.mode is not None else 0o644)
        result.files.append(FileVerdict(rel, "identical" if same else "restored", ent.kind, [],
                                        discarded.get(rel, "")))
        txn.delete(f"{BACKUP_DIR}/{rel}")
    for d in sorted(lock.created_dirs, key=lambda d: d.count("/"), reverse=True):
        txn.rmdir(d)
    txn.delete(LOCK_NAME)
    for rel in recorded_paths(tree, lock):
        txn.delete(rel)
    return txn


def revert_tree(tree: Path | str, force: bool = False) -> Result:
    """Restore the tree byte-for-byte to its state before the first apply (created files, the
    lock and the backups removed). Refuses (ApplyConflict) when an applied file was changed
    since, unless `force`: then each such file's verdict says what local change was discarded.
    A tree without a lock has nothing to revert; if `detect` refuses it (an unknown release such
    as upstream's development branch), so does revert (UnsupportedTree, exit 2), writing nothing.
    An applied tree is reverted whatever its CMakeLists.txt says now (the lock names the release)."""
    tree = Path(tree).resolve()
    if not tree.is_dir():
        raise UnsupportedTree(f"{tree}: not a directory")
    result = Result("revert", str(tree))
    with Locked(tree):
        result.recovered = recover_state(tree, "revert")
        lock = read_lock(tree)
        if lock is None:
            if (tree / BACKUP_DIR).exists():
                raise UserError(f"{tree}: {BACKUP_DIR}/ exists but {LOCK_NAME} does not: cannot revert safely")
            # no lock: never applied (or a first apply that recover just rolled back); a tree apply
            # would refuse (an unknown release, not an AOTriton tree) is refused the same way
            detect(tree)
            return result
        result.release, result.adapter = lock.release, lock.adapter
        result.spec_sha256, result.manifest_sha256 = lock.spec_sha256, lock.manifest_sha256
        check_state(tree, lock, result)
        missing_backup = [f for f in result.conflicts if "backup" in f.detail]
        if missing_backup or (result.conflicts and not force):
            raise ApplyConflict(conflict_message(result, "revert"), result,
                                hint=None if missing_backup else "--force restores them anyway, discarding "
                                "the local changes")
        words = _arch_words(lock)
        discarded = {f.path: "discarded local changes: " + _local_changes(
            tree, f.path, read_rel(tree, f"{BACKUP_DIR}/{f.path}") or b"", words) for f in result.conflicts}
        result.files = []
        txn = _revert_transaction(tree, lock, discarded, result)
        result.changed = True
        commit_txn(txn, tree, "revert")
        return result


def _arch_words(lock: ApplyLock) -> tuple[str, ...]:
    """Lowercase words that mark a line as apply's own (the generated hook, the arch's entries)."""
    return ("mi100-codegen", "mi100_codegen", lock.arch, "0x" + lock.arch[3:])


def recover_tree(tree: Path | str) -> str | None:
    """Only the recovery step of apply/revert: finish or undo an interrupted transaction."""
    tree = Path(tree).resolve()
    with Locked(tree):
        return recover_state(tree, "recover")
