"""apply / revert: put the rendered overlay into an AOTriton tree, or take it out again.

State kept in the tree (both removed by revert):
- `.mi100-codegen.lock.json` (`codegen.apply.lock.ApplyLock`): what was applied (spec sha256,
  toolkit version, release, adapter id, manifest sha256) and, per file, its sha256 before and
  after, the edit ids, and for the tuning-DB files the rows written and the hash of everything
  their bytes depend on;
- `.mi100-codegen/backup/<path>`: the pristine bytes of every pre-existing file apply changed.

`apply` is a plan and a commit. `plan_apply` reads the tree and computes everything (verdicts,
new bytes, the new lock) in this order, so refusals come before any expensive step: the tree's
release against the spec, the state of a previous apply, the new module and the anchored edits
(conflicts raise here), and only then the tuning-database rows. `commit_apply` writes the plan
as one journaled transaction (`codegen.apply.journal`). `--pretend` is the plan alone.

Every apply starts again from the pristine contents (backups), so a changed spec leaves no
stale rows or entries and a second apply with the same spec is byte-for-byte a no-op.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .. import __version__
from ..errors import UserError
from ..overlay_inputs import render_overlay
from ..render import Overlay
from ..spec import LoadedSpec
from ..upstream import Adapter, UnsupportedTree, detect
from ..upstream.registration import refuse_unsuitable_tree
from . import dbrows
from .edits import EditConflict, EditSkipped, apply_edit, arch_mentions, strip_mentions
from .journal import STATE_DIR, Transaction, TreeBusy, pending, recover, tree_lock
from .lock import LOCK_NAME, LOCK_VERSION, ApplyLock, LockEntry, read_lock

BACKUP_DIR = f"{STATE_DIR}/backup"
VERDICTS = ("create", "edit", "identical", "conflict", "skip")
Progress = Callable[[str], None]


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
    rows: dict[str, dict[str, dict]] = field(default_factory=dict)

    @property
    def conflicts(self) -> list[FileVerdict]:
        return [f for f in self.files if f.verdict == "conflict"]

    def to_json(self) -> dict:
        d = asdict(self)
        d["ok"] = not self.conflicts
        return d


# ----------------------------------------------------------------------------------- helpers --


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _read(tree: Path, rel: str) -> bytes | None:
    p = tree / rel
    return p.read_bytes() if p.is_file() else None


def _mode(tree: Path, rel: str, default: int = 0o644) -> int:
    try:
        return os.stat(tree / rel).st_mode & 0o7777
    except OSError:
        return default


def _link(tree: Path, rel: str) -> str | None:
    """'<rel> -> <target>' when rel, or a directory on its way inside the tree, is a symbolic link."""
    parts = Path(rel).parts
    for n in range(1, len(parts) + 1):
        p = tree.joinpath(*parts[:n])
        if p.is_symlink():
            return f"{Path(*parts[:n]).as_posix()} -> {os.readlink(p)}"
    return None


def _git_commit(tree: Path) -> str | None:
    if not (tree / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _parents_missing(tree: Path, rel: str) -> list[str]:
    """Missing ancestor dirs of rel, shallowest first."""
    out = []
    parent = Path(rel).parent
    while str(parent) not in ("", ".") and not (tree / parent).is_dir():
        out.append(parent.as_posix())
        parent = parent.parent
    return sorted(out, key=lambda p: p.count("/"))


class _Locked:
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


def _check_state(tree: Path, lock: ApplyLock | None, result: Result) -> None:
    """Applied files must still hold what apply wrote (as regular files), and their backups the
    pristine bytes."""
    if lock is None:
        if (tree / BACKUP_DIR).exists():
            raise UserError(f"{tree}: {BACKUP_DIR}/ exists but {LOCK_NAME} does not",
                            hint=f"restore {LOCK_NAME}, or remove {STATE_DIR}/ if the tree is pristine")
        return
    for rel, ent in sorted(lock.files.items()):
        cur = _sha(_read(tree, rel))
        link = _link(tree, rel)
        if cur != ent.after or link:
            what = (f"was replaced by a symbolic link ({link})" if link else
                    "was deleted" if cur is None else "was changed")
            result.files.append(FileVerdict(rel, "conflict", ent.kind, list(ent.edits),
                                            f"{what} since mi100-codegen applied it"))
            continue
        if ent.before is not None and _sha(_read(tree, f"{BACKUP_DIR}/{rel}")) != ent.before:
            result.files.append(FileVerdict(rel, "conflict", ent.kind, list(ent.edits),
                                            f"backup {BACKUP_DIR}/{rel} is missing or corrupt"))


def _conflict_message(result: Result, command: str = "apply") -> str:
    lines = [f"{f.path}: {f.detail}" for f in result.conflicts]
    return f"refusing to {command}, nothing was changed:\n" + "\n".join(lines)


def _commit(txn: Transaction, tree: Path) -> None:
    """Commit a transaction; an OS error (e.g. a full disk) leaves the tree as it was."""
    try:
        txn.commit()
    except OSError as exc:
        raise UserError(f"{tree}: could not write ({exc.strerror or exc}); the tree was left unchanged") \
            from None


# -------------------------------------------------------------------------------- apply: plan --


@dataclass
class _Target:
    rel: str
    kind: str
    data: bytes | None  # None: the file must not exist
    edits: list[str] = field(default_factory=list)
    inputs: str | None = None
    rows: dict | None = None
    detail: str = ""


@dataclass
class ApplyPlan:
    """Everything `apply` would do to a tree, computed without writing (`plan_apply`)."""

    tree: Path
    overlay: Overlay
    old: ApplyLock | None
    result: Result
    pristine: Callable[[str], bytes | None]
    targets: dict[str, _Target] = field(default_factory=dict)
    new_files: dict[str, LockEntry] = field(default_factory=dict)
    new_lock: ApplyLock | None = None
    old_dirs: set[str] = field(default_factory=set)
    new_dirs: set[str] = field(default_factory=set)


def _pristine_reader(tree: Path, lock: ApplyLock | None) -> Callable[[str], bytes | None]:
    old = lock.files if lock else {}

    def pristine(rel: str) -> bytes | None:
        ent = old.get(rel)
        if ent is None:
            return _read(tree, rel)
        return None if ent.before is None else _read(tree, f"{BACKUP_DIR}/{rel}")

    return pristine


def _module_targets(p: ApplyPlan) -> None:
    """The generated tuning-space module: a new file."""
    for f in sorted(p.overlay.files.values(), key=lambda f: f.path):
        if not f.path.startswith("tree/"):
            continue
        rel = f.path[len("tree/"):]
        if p.pristine(rel) is not None or _link(p.tree, rel):
            p.result.files.append(FileVerdict(rel, "conflict", "module", [],
                                              "already exists in the upstream tree; refusing to overwrite it"))
            continue
        p.targets[rel] = _Target(rel, "module", f.content)


def _edit_one(text: str, rel: str, edits: list, result: Result) -> tuple[str, list[str], list[str]]:
    """Apply `edits` to `text`: (new text, applied ids, problems); verdicts go to `result`."""
    applied, problems = [], []
    for e in sorted(edits, key=lambda e: e.id):
        try:
            text = apply_edit(text, e)
            applied.append(e.id)
            result.edits.append(EditVerdict(e.id, rel, "edit"))
        except EditSkipped as s:
            result.edits.append(EditVerdict(e.id, rel, "skip", str(s)))
        except EditConflict as c:
            problems.append(f"{e.id}: {c}")
            result.edits.append(EditVerdict(e.id, rel, "conflict", str(c)))
    return text, applied, problems


def _edit_file(p: ApplyPlan, rel: str, edits: list) -> None:
    """One file's anchored edits, from its pristine text. A file that already mentions the arch
    is a conflict naming each line, unless it holds exactly what the edits would write."""
    arch = p.overlay.spec.arch
    base, link = p.pristine(rel), _link(p.tree, rel)
    conflict = lambda ids, why: p.result.files.append(FileVerdict(rel, "conflict", "edit", ids, why))  # noqa: E731
    if link:
        return conflict([e.id for e in edits], f"is a symbolic link ({link}); apply edits regular files only "
                                               "(replace the link by a copy of its target, or refuse to patch it)")
    if base is None:
        return conflict([e.id for e in edits], "file is missing")
    try:
        text = base.decode("utf-8")
    except UnicodeDecodeError:
        return conflict([], "not UTF-8 text")
    mentions = arch_mentions(text, arch)
    new, applied, problems = _edit_one(strip_mentions(text, arch, edits) if mentions else text, rel, edits,
                                       Result("plan", ""))
    if mentions and not problems and new == text:  # the tree holds exactly our edits already
        p.result.edits += [EditVerdict(i, rel, "identical", "already in the upstream tree") for i in applied]
        return None
    if mentions:
        return conflict(applied, "; ".join(f"line {n} already mentions {arch}: {line.strip()!r}"
                                           for n, line in mentions))
    new, applied, problems = _edit_one(text, rel, edits, p.result)
    if problems:
        return conflict(applied, "; ".join(problems))
    if applied:
        p.targets[rel] = _Target(rel, "edit", new.encode("utf-8"), applied)
    return None


def _edit_targets(p: ApplyPlan) -> None:
    by_path: dict[str, list] = {}
    for e in p.overlay.edits:
        by_path.setdefault(e.path, []).append(e)
    for rel in sorted(by_path):
        _edit_file(p, rel, by_path[rel])


def _db_targets(p: ApplyPlan, adapter: Adapter, progress: Progress) -> None:
    """The target's tuning-database rows (the expensive step: only after every refusal)."""
    tree = p.tree

    def listdir(rel: str) -> list[str]:
        d = tree / rel
        return sorted(x.name for x in d.iterdir()) if d.is_dir() else []

    old_files = p.old.files if p.old else {}
    for t in dbrows.db_targets(adapter, p.overlay.rows, lambda r: p.pristine(r) is not None, listdir):
        rel = t["path"]
        link = _link(tree, rel) or (_link(tree, t["donor"]) if "donor" in t else None)
        if link:
            p.result.files.append(FileVerdict(rel, "conflict", "db", [], f"is a symbolic link ({link}); "
                                              "apply writes regular files only"))
            continue
        bases = {rel: _sha(p.pristine(rel))}
        if "donor" in t:
            bases[t["donor"]] = _sha(p.pristine(t["donor"]))
        key = dbrows.input_key(t, bases, p.overlay.rows)
        old = old_files.get(rel)
        if old and old.inputs == key and _sha(_read(tree, rel)) == old.after:
            p.targets[rel] = _Target(rel, "db", _read(tree, rel), inputs=key, rows=old.rows)
            continue
        progress(f"rows: {rel}")
        out = dbrows.build_db(t, p.pristine, p.overlay.rows)
        p.targets[rel] = _Target(rel, "db", out.content, inputs=key,
                                 rows={k: v.as_dict() for k, v in sorted(out.tables.items())})


def _restore_targets(p: ApplyPlan) -> None:
    """Files a previous apply changed that this spec no longer touches: back to pristine."""
    for rel in sorted(p.old.files if p.old else {}):
        if rel not in p.targets and not any(f.path == rel for f in p.result.files):
            p.targets[rel] = _Target(rel, "restore", p.pristine(rel), detail="no longer in the spec: restored")


def _raise_conflicts(p: ApplyPlan, hint: str) -> None:
    if p.result.conflicts:
        p.result.files.sort(key=lambda f: f.path)
        raise ApplyConflict(_conflict_message(p.result), p.result, hint=hint)


def _verdicts(p: ApplyPlan) -> None:
    """Per-file verdicts, and the lock entries of the files that differ from pristine."""
    old_files = p.old.files if p.old else {}
    for rel, t in sorted(p.targets.items()):
        cur = _read(p.tree, rel)
        verdict = "identical" if cur == t.data else ("create" if cur is None else "edit")
        detail = t.detail or ("removed" if t.data is None and cur is not None else "")
        p.result.files.append(FileVerdict(rel, verdict, t.kind, t.edits, detail))
        if t.rows is not None:
            p.result.rows[rel] = t.rows
        base = p.pristine(rel)
        if t.data == base:
            continue
        ent = {"kind": t.kind, "before": _sha(base), "after": _sha(t.data), "edits": t.edits}
        if base is not None:
            ent["mode"] = old_files[rel].mode if rel in old_files and old_files[rel].mode is not None \
                else _mode(p.tree, rel)
        if t.inputs:
            ent["inputs"], ent["rows"] = t.inputs, t.rows
        p.new_files[rel] = LockEntry(**ent)
    same = {f.path for f in p.result.files if f.verdict == "identical"}
    for e in p.result.edits:
        if e.verdict == "edit" and e.path in same:
            e.verdict = "identical"
    p.result.files.sort(key=lambda f: f.path)


def _new_lock(p: ApplyPlan, adapter: Adapter) -> None:
    p.old_dirs = set(p.old.created_dirs) if p.old else set()
    for rel, ent in p.new_files.items():
        if ent.before is None:
            p.new_dirs.update(_parents_missing(p.tree, rel))
            p.new_dirs.update(d for d in p.old_dirs if rel.startswith(d + "/"))
    if p.new_files:
        ov = p.overlay
        p.new_lock = ApplyLock(
            lock_version=LOCK_VERSION, toolkit="mi100-codegen", toolkit_version=__version__,
            spec_name=ov.spec.name, arch=ov.spec.arch, spec_sha256=ov.spec_sha256, manifest_sha256=ov.manifest_sha256,
            release=adapter.release, adapter=adapter.id, commit=_git_commit(p.tree),
            files=p.new_files, created_dirs=sorted(p.new_dirs))


def plan_apply(tree: Path, adapter: Adapter, loaded: LoadedSpec, progress: Progress) -> ApplyPlan:
    """Compute what apply would do (reads only). Refusals and anchor conflicts raise before the
    tuning-database work."""
    refuse_unsuitable_tree(tree, adapter, loaded.spec, loaded.display)
    ov = render_overlay(loaded, adapter.layout)
    lock = read_lock(tree)
    result = Result("apply", str(tree), adapter.release, adapter.id, ov.spec_sha256, ov.manifest_sha256)
    if lock is not None and lock.release != adapter.release:
        raise UserError(f"{tree}: {LOCK_NAME} was written for AOTriton {lock.release}, "
                        f"but the tree is {adapter.release}", hint="revert first")
    _check_state(tree, lock, result)
    p = ApplyPlan(tree, ov, lock, result, _pristine_reader(tree, lock))
    _raise_conflicts(p, "revert or undo the local change, then apply again")
    _module_targets(p)
    _edit_targets(p)
    _raise_conflicts(p, "the tree differs from the pristine release at these anchors")
    _db_targets(p, adapter, progress)
    _raise_conflicts(p, "apply writes regular files only")
    _restore_targets(p)
    _verdicts(p)
    _new_lock(p, adapter)
    lock_bytes = p.new_lock.to_bytes() if p.new_lock else None
    result.changed = any(f.verdict in ("create", "edit") for f in result.files) or \
        lock_bytes != _read(tree, LOCK_NAME)
    return p


# ------------------------------------------------------------------------------ apply: commit --


def _transaction(p: ApplyPlan) -> Transaction:
    tree, old_files = p.tree, (p.old.files if p.old else {})
    txn = Transaction(tree)
    for d in sorted(p.new_dirs - p.old_dirs, key=lambda d: d.count("/")):
        if not (tree / d).is_dir():
            txn.mkdir(d)
    for rel, ent in sorted(p.new_files.items()):  # backups of files changed for the first time
        if ent.before is not None and rel not in old_files:
            txn.mkdir(Path(f"{BACKUP_DIR}/{rel}").parent.as_posix())
            txn.write(f"{BACKUP_DIR}/{rel}", p.pristine(rel), ent.mode)
    for rel, t in sorted(p.targets.items()):
        cur = _read(tree, rel)
        if cur == t.data:
            continue
        if t.data is None:
            txn.delete(rel)
            continue
        ent = p.new_files.get(rel) or old_files.get(rel)
        mode = ent.mode if ent is not None and ent.mode is not None else \
            (_mode(tree, rel) if cur is not None else 0o644)
        txn.write(rel, t.data, mode)
    for rel, ent in sorted(old_files.items()):  # backups no longer needed
        if ent.before is not None and rel not in p.new_files:
            txn.delete(f"{BACKUP_DIR}/{rel}")
    for d in sorted(p.old_dirs - p.new_dirs, key=lambda d: d.count("/"), reverse=True):
        txn.rmdir(d)
    lock_bytes = p.new_lock.to_bytes() if p.new_lock else None
    if lock_bytes != _read(tree, LOCK_NAME):
        if lock_bytes is None:
            txn.delete(LOCK_NAME)
        else:
            txn.write(LOCK_NAME, lock_bytes, 0o644)
    return txn


def commit_apply(p: ApplyPlan, progress: Progress) -> Result:
    """Write a plan into its tree: one journaled transaction."""
    txn = _transaction(p)
    p.result.changed = bool(txn.ops)
    progress("writing")
    _commit(txn, p.tree)
    return p.result


def apply_overlay(tree: Path | str, loaded: LoadedSpec, pretend: bool = False,
                  progress: Progress | None = None) -> Result:
    """Apply the overlay rendered from `loaded` to the AOTriton tree `tree`.

    Returns a Result with per-file verdicts; raises ApplyConflict (nothing written) when a file
    cannot be changed safely, UnsupportedTree for a release that is not supported, UserError for
    other refusals. `pretend` is the plan alone: the same computation, nothing written."""
    tree = Path(tree).resolve()
    progress = progress or (lambda msg: None)
    adapter = detect(tree)  # refuses unknown trees before anything is written
    with _Locked(tree):
        recovered = None
        if pretend:
            if pending(tree):
                raise UserError(f"{tree}: an interrupted mi100-codegen run left a journal",
                                hint="run `mi100-codegen apply` or `revert` (without --pretend) to recover")
        else:
            recovered = recover(tree)
        plan = plan_apply(tree, adapter, loaded, progress)
        plan.result.recovered, plan.result.pretend = recovered, pretend
        return plan.result if pretend else commit_apply(plan, progress)


# ------------------------------------------------------------------------------------ revert --


def _local_changes(tree: Path, rel: str, pristine: bytes, arch_words: tuple[str, ...]) -> str:
    """What a user changed in an applied file: the lines neither upstream nor apply wrote."""
    cur = _read(tree, rel)
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
            result.files.append(FileVerdict(rel, "edit", ent.kind, [], "removed" + discarded.get(rel, "")))
            continue
        data = _read(tree, f"{BACKUP_DIR}/{rel}")
        assert data is not None
        same = _read(tree, rel) == data and not (tree / rel).is_symlink()
        if not same:
            txn.write(rel, data, ent.mode if ent.mode is not None else 0o644)
        result.files.append(FileVerdict(rel, "identical" if same else "edit", ent.kind, [],
                                        "restored" + discarded.get(rel, "")))
        txn.delete(f"{BACKUP_DIR}/{rel}")
    for d in sorted(lock.created_dirs, key=lambda d: d.count("/"), reverse=True):
        txn.rmdir(d)
    txn.delete(LOCK_NAME)
    return txn


def revert_tree(tree: Path | str, force: bool = False) -> Result:
    """Restore the tree byte-for-byte to its state before the first apply (created files, the
    lock and the backups removed). Refuses (ApplyConflict) when an applied file was changed
    since, unless `force`: then each such file's verdict says what local change was discarded."""
    tree = Path(tree).resolve()
    if not tree.is_dir():
        raise UnsupportedTree(f"{tree}: not a directory")
    result = Result("revert", str(tree))
    with _Locked(tree):
        result.recovered = recover(tree)
        lock = read_lock(tree)
        if lock is None:
            if (tree / BACKUP_DIR).exists():
                raise UserError(f"{tree}: {BACKUP_DIR}/ exists but {LOCK_NAME} does not: cannot revert safely")
            return result
        result.release, result.adapter = lock.release, lock.adapter
        result.spec_sha256, result.manifest_sha256 = lock.spec_sha256, lock.manifest_sha256
        _check_state(tree, lock, result)
        missing_backup = [f for f in result.conflicts if "backup" in f.detail]
        if missing_backup or (result.conflicts and not force):
            raise ApplyConflict(_conflict_message(result, "revert"), result,
                                hint=None if missing_backup else "--force restores them anyway, discarding "
                                "the local changes")
        words = _arch_words(lock)
        discarded = {f.path: "; discarded local changes: " + _local_changes(
            tree, f.path, _read(tree, f"{BACKUP_DIR}/{f.path}") or b"", words) for f in result.conflicts}
        result.files = []
        txn = _revert_transaction(tree, lock, discarded, result)
        result.changed = True
        _commit(txn, tree)
        return result


def _arch_words(lock: ApplyLock) -> tuple[str, ...]:
    """Lowercase words that mark a line as apply's own (the generated hook, the arch's entries)."""
    return ("mi100-codegen", "mi100_codegen", lock.arch, "0x" + lock.arch[3:])


def recover_tree(tree: Path | str) -> str | None:
    """Only the recovery step of apply/revert: finish or undo an interrupted transaction."""
    tree = Path(tree).resolve()
    with _Locked(tree):
        return recover(tree)


__all__ = ["BACKUP_DIR", "LOCK_NAME", "ApplyConflict", "ApplyPlan", "EditVerdict", "FileVerdict", "Result",
           "apply_overlay", "commit_apply", "plan_apply", "read_lock", "recover_tree", "revert_tree"]
