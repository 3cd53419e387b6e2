"""apply / revert: put the rendered overlay into an AOTriton tree, or take it out again.

State kept in the tree (both removed by revert):
- `.mi100-codegen.lock.json`: what was applied (spec sha256, toolkit version, release, adapter
  id, manifest sha256) and, per file, its sha256 before and after, the edit ids, and for the
  tuning-DB files the rows written and the hash of everything their bytes depend on;
- `.mi100-codegen/backup/<path>`: the pristine bytes of every pre-existing file apply changed.

Every apply starts again from the pristine contents (backups), so a changed spec leaves no
stale rows or entries and a second apply with the same spec is byte-for-byte a no-op. Nothing
is written until every file's new content is known and no conflict was found; the writing is
one journaled transaction (`codegen.apply.journal`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .. import __version__
from ..errors import UserError
from ..render import Overlay, plan_overlay
from ..spec import LoadedSpec
from ..upstream import Adapter, UnsupportedTree, detect
from . import dbrows
from .edits import EditConflict, EditSkipped, apply_edit
from .journal import STATE_DIR, Transaction, TreeBusy, pending, recover, tree_lock

LOCK_NAME = ".mi100-codegen.lock.json"
BACKUP_DIR = f"{STATE_DIR}/backup"
LOCK_VERSION = 1
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


def _json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def read_lock(tree: Path) -> dict | None:
    p = Path(tree) / LOCK_NAME
    if not p.is_file():
        return None
    try:
        lock = json.loads(p.read_text(encoding="utf-8"))
        if lock.get("lock_version") != LOCK_VERSION or not isinstance(lock.get("files"), dict):
            raise ValueError("unknown lock format")
        return lock
    except (ValueError, OSError) as exc:
        raise UserError(f"{p}: unreadable mi100-codegen lock file ({exc})",
                        hint="restore it from a backup, or start again from a pristine tree") from None


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


def _check_state(tree: Path, lock: dict | None, result: Result) -> None:
    """Applied files must still hold what apply wrote, and their backups the pristine bytes."""
    if lock is None:
        if (tree / BACKUP_DIR).exists():
            raise UserError(f"{tree}: {BACKUP_DIR}/ exists but {LOCK_NAME} does not",
                            hint=f"restore {LOCK_NAME}, or remove {STATE_DIR}/ if the tree is pristine")
        return
    for rel, ent in sorted(lock["files"].items()):
        cur = _sha(_read(tree, rel))
        if cur != ent["after"]:
            what = "was deleted" if cur is None else "was changed"
            result.files.append(FileVerdict(rel, "conflict", ent.get("kind", "edit"), ent.get("edits", []),
                                            f"{what} since mi100-codegen applied it"))
            continue
        if ent["before"] is not None and _sha(_read(tree, f"{BACKUP_DIR}/{rel}")) != ent["before"]:
            result.files.append(FileVerdict(rel, "conflict", ent.get("kind", "edit"), ent.get("edits", []),
                                            f"backup {BACKUP_DIR}/{rel} is missing or corrupt"))


# ------------------------------------------------------------------------------------- apply --


@dataclass
class _Target:
    rel: str
    kind: str
    data: bytes | None  # None: the file must not exist
    edits: list[str] = field(default_factory=list)
    inputs: str | None = None
    rows: dict | None = None
    detail: str = ""


def _plan_targets(tree: Path, adapter: Adapter, ov: Overlay, lock: dict | None, pristine: Callable,
                  result: Result, progress: Callable[[str], None]) -> dict[str, _Target]:
    targets: dict[str, _Target] = {}
    old_files = (lock or {}).get("files", {})

    # 1. new files (the generated tuning-space module)
    for f in sorted(ov.files.values(), key=lambda f: f.path):
        if not f.path.startswith("tree/"):
            continue
        rel = f.path[len("tree/"):]
        if pristine(rel) is not None:
            result.files.append(FileVerdict(rel, "conflict", "module", [],
                                            "already exists in the upstream tree; refusing to overwrite it"))
            continue
        targets[rel] = _Target(rel, "module", f.content)

    # 2. anchored edits, file by file, each starting from the pristine text
    by_path: dict[str, list[dict]] = {}
    for e in ov.edits:
        by_path.setdefault(e["path"], []).append(e)
    for rel in sorted(by_path):
        base = pristine(rel)
        if base is None:
            result.files.append(FileVerdict(rel, "conflict", "edit", [e["id"] for e in by_path[rel]],
                                            "file is missing"))
            continue
        try:
            text = base.decode("utf-8")
        except UnicodeDecodeError:
            result.files.append(FileVerdict(rel, "conflict", "edit", [], "not UTF-8 text"))
            continue
        applied, problems = [], []
        for e in sorted(by_path[rel], key=lambda e: e["id"]):
            try:
                text = apply_edit(text, e)
                applied.append(e["id"])
                result.edits.append(EditVerdict(e["id"], rel, "edit"))
            except EditSkipped as s:
                result.edits.append(EditVerdict(e["id"], rel, "skip", str(s)))
            except EditConflict as c:
                problems.append(f"{e['id']}: {c}")
                result.edits.append(EditVerdict(e["id"], rel, "conflict", str(c)))
        if problems:
            result.files.append(FileVerdict(rel, "conflict", "edit", applied, "; ".join(problems)))
        elif applied:
            targets[rel] = _Target(rel, "edit", text.encode("utf-8"), applied)

    # 3. the target's tuning-database rows
    def listdir(rel: str) -> list[str]:
        p = tree / rel
        return sorted(x.name for x in p.iterdir()) if p.is_dir() else []

    for t in dbrows.db_targets(adapter, ov.rows, lambda r: pristine(r) is not None, listdir):
        rel = t["path"]
        bases = {rel: _sha(pristine(rel))}
        if "donor" in t:
            bases[t["donor"]] = _sha(pristine(t["donor"]))
        key = dbrows.input_key(t, bases, ov.rows)
        old = old_files.get(rel)
        if old and old.get("inputs") == key and _sha(_read(tree, rel)) == old["after"]:
            targets[rel] = _Target(rel, "db", _read(tree, rel), inputs=key, rows=old.get("rows"))
            continue
        progress(f"rows: {rel}")
        out = dbrows.build_db(t, pristine, ov.rows)
        targets[rel] = _Target(rel, "db", out.content, inputs=key,
                               rows={k: v.as_dict() for k, v in sorted(out.tables.items())})

    # 4. files a previous apply changed that this spec no longer touches: back to pristine
    for rel in sorted(old_files):
        if rel not in targets and not any(f.path == rel for f in result.files):
            targets[rel] = _Target(rel, "restore", pristine(rel), detail="no longer in the spec: restored")
    return targets


def apply_overlay(tree: Path | str, loaded: LoadedSpec, pretend: bool = False,
                  progress: Callable[[str], None] | None = None) -> Result:
    """Apply the overlay rendered from `loaded` to the AOTriton tree `tree`.

    Returns a Result with per-file verdicts; raises ApplyConflict (nothing written) when a file
    cannot be changed safely, UnsupportedTree for a release that is not supported, UserError for
    other refusals. With `pretend`, computes everything and writes nothing."""
    tree = Path(tree).resolve()
    progress = progress or (lambda msg: None)
    adapter = detect(tree)  # refuses unknown trees before anything is written
    result = Result("apply", str(tree), adapter.release, adapter.id, pretend=pretend)
    with _Locked(tree):
        if pretend:
            if pending(tree):
                raise UserError(f"{tree}: an interrupted mi100-codegen run left a journal",
                                hint="run `mi100-codegen apply` or `revert` (without --pretend) to recover")
        else:
            result.recovered = recover(tree)
        ov = plan_overlay(loaded, layout=adapter.layout)
        result.spec_sha256, result.manifest_sha256 = ov.spec_sha256, ov.manifest_sha256
        lock = read_lock(tree)
        if lock is not None and lock.get("release") != adapter.release:
            raise UserError(f"{tree}: {LOCK_NAME} was written for AOTriton {lock.get('release')}, "
                            f"but the tree is {adapter.release}", hint="revert first")
        _check_state(tree, lock, result)
        old_files = (lock or {}).get("files", {})

        def pristine(rel: str) -> bytes | None:
            ent = old_files.get(rel)
            if ent is None:
                return _read(tree, rel)
            return None if ent["before"] is None else _read(tree, f"{BACKUP_DIR}/{rel}")

        if result.conflicts:  # a locally modified applied file: do not even compute
            raise ApplyConflict(_conflict_message(result), result,
                                hint="revert or undo the local change, then apply again")
        targets = _plan_targets(tree, adapter, ov, lock, pristine, result, progress)
        if result.conflicts:
            result.files.sort(key=lambda f: f.path)
            raise ApplyConflict(_conflict_message(result), result,
                                hint="the tree differs from the pristine release at these anchors")

        # verdicts + the new lock
        new_files: dict[str, dict] = {}
        for rel, t in sorted(targets.items()):
            cur = _read(tree, rel)
            verdict = "identical" if cur == t.data else ("create" if cur is None else "edit")
            detail = t.detail or ("removed" if t.data is None and cur is not None else "")
            result.files.append(FileVerdict(rel, verdict, t.kind, t.edits, detail))
            if t.rows is not None:
                result.rows[rel] = t.rows
            base = pristine(rel)
            if t.data != base:
                ent = {"kind": t.kind, "before": _sha(base), "after": _sha(t.data), "edits": t.edits}
                if base is not None:
                    ent["mode"] = old_files.get(rel, {}).get("mode", _mode(tree, rel))
                if t.inputs:
                    ent["inputs"], ent["rows"] = t.inputs, t.rows
                new_files[rel] = ent
        for e in result.edits:
            if e.verdict == "edit" and any(f.path == e.path and f.verdict == "identical" for f in result.files):
                e.verdict = "identical"
        result.files.sort(key=lambda f: f.path)

        created = [rel for rel, ent in new_files.items() if ent["before"] is None]
        old_dirs = set((lock or {}).get("created_dirs", []))
        new_dirs = set()
        for rel in created:
            for d in _parents_missing(tree, rel):
                new_dirs.add(d)
            for d in old_dirs:
                if rel.startswith(d + "/"):
                    new_dirs.add(d)
        new_lock = None
        if new_files:
            new_lock = {
                "lock_version": LOCK_VERSION, "toolkit": "mi100-codegen", "toolkit_version": __version__,
                "spec_name": ov.spec.name, "spec_sha256": ov.spec_sha256, "manifest_sha256": ov.manifest_sha256,
                "release": adapter.release, "adapter": adapter.id, "commit": _git_commit(tree),
                "files": new_files, "created_dirs": sorted(new_dirs),
            }
        lock_bytes = _json_bytes(new_lock) if new_lock else None
        if pretend:
            result.changed = any(f.verdict in ("create", "edit") for f in result.files) or \
                lock_bytes != _read(tree, LOCK_NAME)
            return result

        txn = Transaction(tree)
        for d in sorted(new_dirs - old_dirs, key=lambda d: d.count("/")):
            if not (tree / d).is_dir():
                txn.mkdir(d)
        for rel, ent in sorted(new_files.items()):  # backups of files changed for the first time
            if ent["before"] is not None and rel not in old_files:
                for d in [Path(f"{BACKUP_DIR}/{rel}").parent.as_posix()]:
                    txn.mkdir(d)
                txn.write(f"{BACKUP_DIR}/{rel}", pristine(rel), ent["mode"])
        for rel, t in sorted(targets.items()):
            cur = _read(tree, rel)
            if cur == t.data:
                continue
            if t.data is None:
                txn.delete(rel)
            else:
                mode = new_files.get(rel, {}).get("mode") or old_files.get(rel, {}).get("mode") or \
                    (_mode(tree, rel) if cur is not None else 0o644)
                txn.write(rel, t.data, mode)
        for rel, ent in sorted(old_files.items()):  # backups no longer needed
            if ent["before"] is not None and rel not in new_files:
                txn.delete(f"{BACKUP_DIR}/{rel}")
        for d in sorted(old_dirs - new_dirs, key=lambda d: d.count("/"), reverse=True):
            txn.rmdir(d)
        if lock_bytes != _read(tree, LOCK_NAME):
            if lock_bytes is None:
                txn.delete(LOCK_NAME)
            else:
                txn.write(LOCK_NAME, lock_bytes, 0o644)
        result.changed = bool(txn.ops)
        progress("writing")
        _commit(txn, tree)
        return result


def _commit(txn: Transaction, tree: Path) -> None:
    """Commit a transaction; an OS error (e.g. a full disk) leaves the tree as it was."""
    try:
        txn.commit()
    except OSError as exc:
        raise UserError(f"{tree}: could not write ({exc.strerror or exc}); the tree was left unchanged") \
            from None


def _conflict_message(result: Result) -> str:
    lines = [f"{f.path}: {f.detail}" for f in result.conflicts]
    return "refusing to apply, nothing was changed:\n" + "\n".join(lines)


# ------------------------------------------------------------------------------------ revert --


def revert_tree(tree: Path | str, force: bool = False) -> Result:
    """Restore the tree byte-for-byte to its state before the first apply (created files, the
    lock and the backups removed). Refuses (ApplyConflict) when an applied file was changed
    since, unless `force`."""
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
        result.release, result.adapter = lock.get("release"), lock.get("adapter")
        result.spec_sha256, result.manifest_sha256 = lock.get("spec_sha256"), lock.get("manifest_sha256")
        _check_state(tree, lock, result)
        missing_backup = [f for f in result.conflicts if "backup" in f.detail]
        if missing_backup or (result.conflicts and not force):
            raise ApplyConflict(_conflict_message(result).replace("apply", "revert"), result,
                                hint=None if missing_backup else "--force restores them anyway")
        result.files = []
        txn = Transaction(tree)
        for rel, ent in sorted(lock["files"].items()):
            if ent["before"] is None:
                if (tree / rel).exists():
                    txn.delete(rel)
                result.files.append(FileVerdict(rel, "edit", ent.get("kind", "module"), [], "removed"))
            else:
                data = _read(tree, f"{BACKUP_DIR}/{rel}")
                assert data is not None
                same = _read(tree, rel) == data
                if not same:
                    txn.write(rel, data, ent.get("mode", 0o644))
                result.files.append(FileVerdict(rel, "identical" if same else "edit", ent.get("kind", "edit"),
                                                [], "restored"))
                txn.delete(f"{BACKUP_DIR}/{rel}")
        for d in sorted(lock.get("created_dirs", []), key=lambda d: d.count("/"), reverse=True):
            txn.rmdir(d)
        txn.delete(LOCK_NAME)
        result.changed = True
        _commit(txn, tree)
        return result


def recover_tree(tree: Path | str) -> str | None:
    """Only the recovery step of apply/revert: finish or undo an interrupted transaction."""
    tree = Path(tree).resolve()
    with _Locked(tree):
        return recover(tree)


__all__ = ["LOCK_NAME", "BACKUP_DIR", "ApplyConflict", "EditVerdict", "FileVerdict", "Result", "apply_overlay",
           "read_lock", "recover_tree", "revert_tree"]
