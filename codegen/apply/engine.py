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

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from codegen import __version__
from codegen.core import processes
from codegen.core.errors import UserError
from codegen.core.fsutil import sha256
from codegen.render.inputs import render_overlay
from codegen.render.overlay import Overlay
from codegen.formats.spec import LoadedSpec
from codegen.upstream import Adapter, detect
from codegen.upstream.registration import refuse_unsuitable_tree
from codegen.apply import dbrows
from codegen.apply.applied_spec import recorded_files, recorded_paths
from codegen.apply.mentions import arch_mentions, strip_mentions
from codegen.apply.journal import Transaction, pending
from codegen.apply.lock import read_lock
from codegen.models.lock import LOCK_NAME, LOCK_VERSION, ApplyLock, LockEntry, TableRows
from codegen.apply.state import (
    BACKUP_DIR,
    ApplyConflict,
    EditVerdict,
    FileVerdict,
    Result,
    check_state,
    commit_txn,
    conflict_message,
    link_of,
    Locked,
    mode_of,
    read_rel,
    recover_state,
    sha,
)

Progress = Callable[[str], None]
EDITS_CODE_VERSION = 1  # bump when the edit ops change what they write: invalidates reused edits


def _git_commit(tree: Path) -> str | None:
    if not (tree / ".git").exists():
        return None
    try:
        out = processes.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
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


# -------------------------------------------------------------------------------- apply: plan --


@dataclass
class _Target:
    rel: str
    kind: str
    data: bytes | None  # None: the file must not exist
    edits: list[str] = field(default_factory=list)
    inputs: str | None = None
    rows: dict[str, TableRows] | None = None
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
    recorded: dict[str, bytes] = field(default_factory=dict)  # kept with the lock (codegen.apply.applied_spec)


def _pristine_reader(tree: Path, lock: ApplyLock | None) -> Callable[[str], bytes | None]:
    old = lock.files if lock else {}

    def pristine(rel: str) -> bytes | None:
        ent = old.get(rel)
        if ent is None:
            return read_rel(tree, rel)
        return None if ent.before is None else read_rel(tree, f"{BACKUP_DIR}/{rel}")

    return pristine


def _module_targets(p: ApplyPlan) -> None:
    """The generated tuning-space module: a new file."""
    for f in sorted(p.overlay.files.values(), key=lambda f: f.path):
        if not f.path.startswith("tree/"):
            continue
        rel = f.path[len("tree/"):]
        if p.pristine(rel) is not None or link_of(p.tree, rel):
            p.result.files.append(FileVerdict(rel, "conflict", "module", [],
                                              "already exists in the upstream tree; refusing to overwrite it"))
            continue
        p.targets[rel] = _Target(rel, "module", f.content)


def _edit_one(text: str, rel: str, edits: list, result: Result) -> tuple[str, list[str], list[str]]:
    """Apply `edits` to `text`: (new text, applied ids, problems); verdicts go to `result`."""
    from codegen.apply import edits as ops  # start-up: libcst loads only when some file's edits must be computed

    applied, problems = [], []
    for e in sorted(edits, key=lambda e: e.id):
        try:
            text = ops.apply_edit(text, e)
            applied.append(e.id)
            result.edits.append(EditVerdict(e.id, rel, "edit"))
        except ops.EditSkipped as s:
            result.edits.append(EditVerdict(e.id, rel, "skip", str(s)))
        except ops.EditConflict as c:
            problems.append(f"{e.id}: {c}")
            result.edits.append(EditVerdict(e.id, rel, "conflict", str(c)))
    return text, applied, problems


def _edit_key(base: bytes, edits: list, arch: str) -> str:
    """Everything a file's edited bytes depend on: equal keys, equal bytes."""
    blob = json.dumps({"base": sha(base), "arch": arch, "edits": [e.to_json() for e in sorted(edits, key=lambda e: e.id)],
                       "code": EDITS_CODE_VERSION}, sort_keys=True)
    return sha256(blob.encode())


def _reuse_edits(p: ApplyPlan, rel: str, edits: list, key: str) -> bool:
    """A file a previous apply edited from the same pristine bytes with the same edits, and that
    still holds what it wrote: its bytes are known without computing them again."""
    old = (p.old.files if p.old else {}).get(rel)
    if old is None or old.inputs != key or sha(read_rel(p.tree, rel)) != old.after:
        return False
    for e in sorted(edits, key=lambda e: e.id):
        done = e.id in old.edits
        p.result.edits.append(EditVerdict(e.id, rel, "edit" if done else "skip",
                                          "" if done else f"{e.symbol} is absent (optional edit)"))
    p.targets[rel] = _Target(rel, "edit", read_rel(p.tree, rel), list(old.edits), inputs=key)
    return True


def _edit_file(p: ApplyPlan, rel: str, edits: list) -> None:
    """One file's anchored edits, from its pristine text. A file that already mentions the arch
    is a conflict naming each line, unless it holds exactly what the edits would write."""
    arch = p.overlay.spec.arch
    base, link = p.pristine(rel), link_of(p.tree, rel)
    conflict = lambda ids, why: p.result.files.append(FileVerdict(rel, "conflict", "edit", ids, why))  # noqa: E731
    if link:
        return conflict([e.id for e in edits], f"is a symbolic link ({link}); apply edits regular files only "
                                               "(replace the link by a copy of its target to apply)")
    if base is None:
        return conflict([e.id for e in edits], "file is missing")
    key = _edit_key(base, edits, arch)
    if _reuse_edits(p, rel, edits, key):
        return None
    try:
        text = base.decode("utf-8")
    except UnicodeDecodeError:
        return conflict([], "not UTF-8 text")
    mentions = arch_mentions(text, arch)
    if mentions:
        new, applied, problems = _edit_one(strip_mentions(text, arch, edits), rel, edits, Result("plan", ""))
        if not problems and new == text:  # the tree holds exactly our edits already
            p.result.edits += [EditVerdict(i, rel, "identical", "already in the upstream tree") for i in applied]
            return None
        return conflict(applied, "; ".join(f"line {n} already mentions {arch}: {line.strip()!r}"
                                           for n, line in mentions))
    new, applied, problems = _edit_one(text, rel, edits, p.result)
    if problems:
        return conflict(applied, "; ".join(problems))
    if applied:
        p.targets[rel] = _Target(rel, "edit", new.encode("utf-8"), applied, inputs=key)
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
    jobs = []
    for t in dbrows.db_targets(adapter, p.overlay.rows, lambda r: p.pristine(r) is not None, listdir):
        rel = t["path"]
        link = link_of(tree, rel) or (link_of(tree, t["donor"]) if "donor" in t else None)
        if link:
            p.result.files.append(FileVerdict(rel, "conflict", "db", [], f"is a symbolic link ({link}); "
                                              "apply writes regular files only"))
            continue
        reads = [rel] + ([t["donor"]] if "donor" in t else [])
        data = {r: p.pristine(r) for r in reads}
        key = dbrows.input_key(t, {r: sha(d) for r, d in data.items()}, p.overlay.rows)
        old = old_files.get(rel)
        if old and old.inputs == key and sha(read_rel(tree, rel)) == old.after:
            p.targets[rel] = _Target(rel, "db", read_rel(tree, rel), inputs=key, rows=old.rows)
        else:
            jobs.append((t, key, sum(len(d or b"") for d in data.values())))
    if p.result.conflicts or not jobs:
        return
    progress(f"rows: {len(jobs)} database file(s)")
    # Each file is independent: sqlite and xz release the GIL, so they build side by side, the
    # largest first (on 0.11.1b+ the op database is ~7x a shard: last, it would run alone).
    jobs.sort(key=lambda job: (-job[2], job[0]["path"]))
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        outs = list(pool.map(lambda job: dbrows.build_db(job[0], p.pristine, p.overlay.rows), jobs))
    for (t, key, _), out in zip(jobs, outs):
        p.targets[t["path"]] = _Target(t["path"], "db", out.content, inputs=key,
                                       rows={k: v.counts() for k, v in sorted(out.tables.items())})


def _restore_targets(p: ApplyPlan) -> None:
    """Files a previous apply changed that this spec no longer touches: back to pristine."""
    for rel in sorted(p.old.files if p.old else {}):
        if rel not in p.targets and not any(f.path == rel for f in p.result.files):
            p.targets[rel] = _Target(rel, "restore", p.pristine(rel), detail="no longer in the spec: restored")


def _raise_conflicts(p: ApplyPlan, hint: str) -> None:
    if p.result.conflicts:
        p.result.files.sort(key=lambda f: f.path)
        raise ApplyConflict(conflict_message(p.result), p.result, hint=hint)


def _verdicts(p: ApplyPlan) -> None:
    """Per-file verdicts, and the lock entries of the files that differ from pristine."""
    old_files = p.old.files if p.old else {}
    for rel, t in sorted(p.targets.items()):
        cur = read_rel(p.tree, rel)
        verdict = "identical" if cur == t.data else ("create" if cur is None else "edit")
        detail = t.detail or ("removed" if t.data is None and cur is not None else "")
        p.result.files.append(FileVerdict(rel, verdict, t.kind, t.edits, detail))
        if t.rows is not None:
            p.result.rows[rel] = t.rows
        base = p.pristine(rel)
        if t.data == base:
            continue
        ent = {"kind": t.kind, "before": sha(base), "after": sha(t.data), "edits": t.edits}
        if base is not None:
            ent["mode"] = old_files[rel].mode if rel in old_files and old_files[rel].mode is not None \
                else mode_of(p.tree, rel)
        if t.inputs:
            ent["inputs"] = t.inputs
        if t.rows is not None:
            ent["rows"] = t.rows
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
            files=p.new_files, created_dirs=sorted(p.new_dirs),
            recorded={rel: sha256(data) for rel, data in sorted(p.recorded.items())})


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
    check_state(tree, lock, result)
    p = ApplyPlan(tree, ov, lock, result, _pristine_reader(tree, lock), recorded=recorded_files(loaded))
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
        lock_bytes != read_rel(tree, LOCK_NAME)
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
        cur = read_rel(tree, rel)
        if cur == t.data:
            continue
        if t.data is None:
            txn.delete(rel)
            continue
        ent = p.new_files.get(rel) or old_files.get(rel)
        mode = ent.mode if ent is not None and ent.mode is not None else \
            (mode_of(tree, rel) if cur is not None else 0o644)
        txn.write(rel, t.data, mode)
    for rel, ent in sorted(old_files.items()):  # backups no longer needed
        if ent.before is not None and rel not in p.new_files:
            txn.delete(f"{BACKUP_DIR}/{rel}")
    for d in sorted(p.old_dirs - p.new_dirs, key=lambda d: d.count("/"), reverse=True):
        txn.rmdir(d)
    lock_bytes = p.new_lock.to_bytes() if p.new_lock else None
    if lock_bytes != read_rel(tree, LOCK_NAME):
        if lock_bytes is None:
            txn.delete(LOCK_NAME)
        else:
            txn.write(LOCK_NAME, lock_bytes, 0o644)
    new = p.recorded if p.new_lock else {}
    for rel in sorted(set(recorded_paths(tree, p.old)) - set(new) if p.old else ()):
        txn.delete(rel)
    for rel, data in sorted(new.items()):
        if data != read_rel(tree, rel):
            if not (tree / rel).parent.is_dir():
                txn.mkdir(Path(rel).parent.as_posix())
            txn.write(rel, data, 0o644)
    return txn


def commit_apply(p: ApplyPlan, progress: Progress) -> Result:
    """Write a plan into its tree: one journaled transaction."""
    txn = _transaction(p)
    p.result.changed = bool(txn.ops)
    progress("writing")
    commit_txn(txn, p.tree)
    return p.result


def apply_overlay(tree: Path | str, loaded: LoadedSpec, pretend: bool = False,
                  progress: Progress | None = None, release: Adapter | None = None) -> Result:
    """Apply the overlay rendered from `loaded` to the AOTriton tree `tree`.

    Returns a Result with per-file verdicts; raises ApplyConflict (nothing written) when a file
    cannot be changed safely, UnsupportedTree for a release that is not supported, UserError for
    other refusals. `pretend` is the plan alone: the same computation, nothing written. `release`:
    the tree's record when the caller detected it already."""
    tree = Path(tree).resolve()
    progress = progress or (lambda msg: None)
    adapter = release or detect(tree)  # the tree's record (refuses unknown trees before anything is written)
    with Locked(tree):
        recovered = None
        if pretend:
            if pending(tree):
                raise UserError(f"{tree}: an interrupted mi100-codegen run left a journal",
                                hint=f"run `mi100-codegen apply {tree}` or `mi100-codegen revert {tree}` (without --pretend) to recover")
        else:
            recovered = recover_state(tree, "apply")
        plan = plan_apply(tree, adapter, loaded, progress)
        plan.result.recovered, plan.result.pretend = recovered, pretend
        return plan.result if pretend else commit_apply(plan, progress)
