"""Issue 20: a tree's own state files are possibly hostile, and a failed apply really rolls back.

- A lock or journal that names a path outside the tree (`../x`, an absolute path, a link on the
  way), a reserved path (`.git/`, the state folder), a setuid mode or an unknown op is "this
  tree's state file is damaged": exit 2, one message with the recovery commands, nothing changed
  inside or outside the tree.
- Apply under every filesystem failure (a directory in the way, an immutable file — real
  `chattr +i` —, and EPERM/EROFS/ENOSPC/EIO injected at every step, also while rolling back):
  either the tree is byte-identical and the message says so, or the message names each path that
  could not be put back and `revert` finishes the job once the cause is gone.
- Property-based: mutated locks and journals (hypothesis) never make a command touch anything
  outside the tree, never set a setuid bit, never print a traceback.
Synthetic trees (tests/fake_tree.py) keep these fast; test_apply_real.py covers the real trees.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, strategies as st
from typer.testing import CliRunner

from codegen.apply import journal
from codegen.apply.engine import apply_overlay
from codegen.apply.lock import LOCK_NAME
from codegen.cli import app
from codegen.formats.spec import load_spec
from fake_tree import make_fake_tree, snapshot
from fuzz_profiles import fast, slow

TXN = journal.TXN_DIR


@pytest.fixture(scope="module")
def spec():
    return load_spec(None)


@pytest.fixture(scope="module")
def templates(tmp_path_factory, spec):
    """A pristine and an applied synthetic tree, copied by each test."""
    root = tmp_path_factory.mktemp("templates")
    pristine = make_fake_tree(root / "pristine", (0, 12, 0))
    applied = root / "applied"
    shutil.copytree(pristine, applied, symlinks=True)
    apply_overlay(applied, spec)
    return pristine, applied


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def _world(tmp_path: Path) -> dict:
    """Everything beside the tree (the victims), with modes."""
    out = {}
    for p in sorted(tmp_path.rglob("*")):
        if "t" in p.relative_to(tmp_path).parts[:1]:
            continue
        st_ = os.lstat(p)
        out[str(p.relative_to(tmp_path))] = (st_.st_mode, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
    return out


def _no_setuid(tree: Path) -> bool:
    return not any(os.lstat(p).st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX) for p in tree.rglob("*"))


def _victims(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "victim.txt").write_text("precious\n")
    (tmp_path / "victim_dir").mkdir(exist_ok=True)
    (tmp_path / "victim_dir" / "keep").write_text("keep\n")
    return tmp_path / "victim.txt", tmp_path / "victim_dir"


def _sha(p: Path) -> str:
    import hashlib
    return hashlib.sha256(p.read_bytes()).hexdigest()


# -------------------------------------------------------------------- a hostile lock file --

def _hostile_locks(tmp_path: Path, victim: Path) -> dict[str, object]:
    v = _sha(victim)
    ent = {"kind": "module", "before": None, "after": v, "edits": []}
    return {
        "file ../victim.txt": ("files", "../victim.txt", ent),
        "file absolute": ("files", str(victim), ent),
        "file .git/config": ("files", ".git/config", ent),
        "file inside the state folder": ("files", ".mi100-codegen/backup/v3src/util.cc", ent),
        "the lock itself": ("files", LOCK_NAME, ent),
        "created_dirs ..": ("created_dirs", "..", None),
        "created_dirs outside": ("created_dirs", str(tmp_path / "victim_dir"), None),
        "created_dirs a/../..": ("created_dirs", "v3python/../..", None),
        "a sha that is not one": ("files", "v3src/util.cc", {**ent, "before": "x" * 64}),
        "an unknown kind": ("files", "v3src/zzz", {**ent, "kind": "anything"}),
    }


@pytest.mark.parametrize("case", list(_hostile_locks(Path("/x"), Path(__file__)).keys()))
def test_hostile_lock_is_damaged_and_touches_nothing(tmp_path, templates, case):
    tree = _copy(templates[1], tmp_path / "t")
    victim, _ = _victims(tmp_path)
    field, key, value = _hostile_locks(tmp_path, victim)[case]
    lock = json.loads((tree / LOCK_NAME).read_text())
    if field == "files":
        lock["files"][key] = value
    else:
        lock["created_dirs"].append(key)
    (tree / LOCK_NAME).write_text(json.dumps(lock))
    before, world = snapshot(tree), _world(tmp_path)
    for cmd in (("revert", tree), ("revert", "--force", tree), ("apply", tree)):
        res = _cli(*cmd)
        assert res.exit_code == 2, (cmd, res.output)
        assert "this tree's state file is damaged" in res.stderr and "Traceback" not in res.output
        assert snapshot(tree) == before and _world(tmp_path) == world


def test_recorded_setuid_mode_is_masked_to_permission_bits(tmp_path, templates):
    tree = _copy(templates[1], tmp_path / "t")
    lock = json.loads((tree / LOCK_NAME).read_text())
    rel = next(r for r, e in lock["files"].items() if e.get("mode") is not None)
    lock["files"][rel]["mode"] = 0o6777
    (tree / LOCK_NAME).write_text(json.dumps(lock))
    (tree / rel).write_text("changed locally\n")  # revert must write it back, with the recorded mode
    res = _cli("revert", "--force", tree)
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE(os.stat(tree / rel).st_mode) == 0o777 and _no_setuid(tree)


def test_linked_folder_in_an_applied_tree_is_never_written_through(tmp_path, templates):
    tree = _copy(templates[1], tmp_path / "t")
    outside = tmp_path / "outside"
    shutil.move(tree / "v3src", outside)
    os.symlink(outside, tree / "v3src")
    world = _world(tmp_path)
    for cmd in (("revert", tree), ("revert", "--force", tree), ("apply", tree)):
        res = _cli(*cmd)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert "symbolic link" in res.stderr
    assert _world(tmp_path) == world


# --------------------------------------------------------------- a hostile or broken journal --

def _journal_doc(ops) -> str:
    return json.dumps({"version": 1, "ops": ops})


BAD_JOURNALS = {
    "delete ../victim2.txt": _journal_doc([{"op": "delete", "path": "../victim2.txt", "pre": "absent"}]),
    "delete absolute": _journal_doc([{"op": "delete", "path": "/tmp/victim2.txt"}]),
    "rmdir ..": _journal_doc([{"op": "rmdir", "path": ".."}]),
    "write with a stage outside": _journal_doc([{"op": "write", "path": "x", "stage": "../../../etc/passwd",
                                                 "new": "0" * 64}]),
    "an unknown op": _journal_doc([{"op": "chmod", "path": "x"}]),
    "no ops": json.dumps({"version": 1}),
    "not JSON": "{ops: [",
    "a list": "[]",
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "write into the transaction folder": _journal_doc([{"op": "write", "path": ".mi100-codegen/txn/new/0",
                                                        "stage": "0", "new": "0" * 64}]),
}


@pytest.mark.parametrize("name", ["journal.json", "rollback.json"])
@pytest.mark.parametrize("case", list(BAD_JOURNALS))
def test_damaged_journal_is_one_message_with_recovery(tmp_path, templates, case, name):
    tree = _copy(templates[1], tmp_path / "t")
    victim = tmp_path / "victim2.txt"
    victim.write_text("precious\n")
    (tree / TXN).mkdir(parents=True)
    (tree / TXN / name).write_text(BAD_JOURNALS[case])
    before, world = snapshot(tree), _world(tmp_path)
    for cmd in (("apply", tree), ("revert", tree), ("build", tree, "--prefix", tmp_path / "p", "--pretend")):
        res = _cli(*cmd)
        if cmd[0] == "build" and res.exit_code != 2:
            continue  # build refuses a tree with a pending journal its own way (not a state reader)
        assert res.exit_code == 2, (cmd, res.output)
        assert "Traceback" not in res.output
        if cmd[0] != "build":
            assert "state file is damaged" in res.stderr and "rm -r" in res.stderr
            assert f"mi100-codegen revert --force {tree}" in res.stderr.replace("\n", " ")
        assert snapshot(tree) == before and _world(tmp_path) == world
    # the recovery the message names works
    shutil.rmtree(tree / TXN)
    assert _cli("revert", "--force", tree).exit_code == 0
    assert snapshot(tree) == snapshot(templates[0])


def test_journal_that_is_a_fifo_or_a_folder_does_not_hang(tmp_path, templates):
    for kind in ("fifo", "dir"):
        tree = _copy(templates[1], tmp_path / f"t{kind}")
        (tree / TXN).mkdir(parents=True)
        (os.mkfifo if kind == "fifo" else os.mkdir)(tree / TXN / "journal.json")
        res = _cli("revert", tree)
        assert res.exit_code == 2 and "state file is damaged" in res.stderr, res.output


def test_state_folder_that_is_a_link_out_is_refused(tmp_path, templates):
    tree = _copy(templates[0], tmp_path / "t")
    outside = tmp_path / "outside"
    (outside / "txn").mkdir(parents=True)
    (outside / "txn" / "junk").write_text("x")
    os.symlink(outside, tree / ".mi100-codegen")
    world = _world(tmp_path)
    res = _cli("apply", tree)
    assert res.exit_code == 2 and "symbolic link" in res.stderr and "Traceback" not in res.output, res.output
    assert _world(tmp_path) == world


# ------------------------------------------------------------------ real filesystem failures --

def test_directory_in_the_way_changes_nothing(tmp_path, templates, spec):
    tree = _copy(templates[0], tmp_path / "t")
    lock = json.loads((templates[1] / LOCK_NAME).read_text())
    module = next(rel for rel, ent in lock["files"].items() if ent["kind"] == "module")
    (tree / module).mkdir()
    before = snapshot(tree)
    res = _cli("apply", tree)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "is a directory" in res.stderr and "nothing was changed" in res.stderr
    assert snapshot(tree) == before
    (tree / module).rmdir()
    assert _cli("apply", tree).exit_code == 0  # nothing left behind blocks the next run


def _immutable(path: Path, on: bool) -> bool:
    r = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    return r.returncode == 0


def test_immutable_file_rolls_back_byte_identical(tmp_path, templates):
    tree = _copy(templates[0], tmp_path / "t")
    target = tree / "v3src" / "util.cc"
    if not _immutable(target, True):
        pytest.skip("chattr +i needs root and a filesystem with the immutable flag")
    try:
        before = snapshot(tree)
        res = _cli("apply", tree)
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert "Operation not permitted" in res.stderr and "rolled back" in res.stderr
        assert snapshot(tree) == before and not (tree / journal.STATE_DIR).exists()
        assert _cli("revert", tree).exit_code == 0  # no traceback, nothing to finish
    finally:
        _immutable(target, False)
    assert _cli("apply", tree).exit_code == 0


def test_rollback_blocked_by_an_immutable_file_says_so_and_revert_finishes_it(tmp_path, templates, monkeypatch):
    """Apply fails late (EIO injected on its last swap); meanwhile a file it already replaced is made
    immutable, so the undo cannot restore it: the message lists it, exit 3, the state needed is
    kept; after `chattr -i`, `revert` finishes the rollback and the tree is pristine."""
    tree = _copy(templates[0], tmp_path / "t")
    real_replace = os.replace
    seen: list[Path] = []

    def late_failure(src, dst):
        if "txn/new" in str(src) and not str(dst).endswith(LOCK_NAME):
            seen.append(Path(dst))
            return real_replace(src, dst)
        if str(dst).endswith(LOCK_NAME) and "txn/new" in str(src):
            locked = next(p for p in seen if ".mi100-codegen" not in str(p))
            if not _immutable(locked, True):
                pytest.skip("chattr +i needs root and a filesystem with the immutable flag")
            seen.insert(0, locked)
            raise OSError(errno.EIO, "Input/output error", str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(journal.os, "replace", late_failure)
    before = snapshot(tree)
    try:
        res = _cli("apply", tree)
        assert res.exit_code == 3 and "Traceback" not in res.output, res.output
        assert "could not be put back" in res.stderr and str(seen[0].relative_to(tree)) in res.stderr
        assert "Input/output error" in res.stderr and f"mi100-codegen revert {tree}" in res.stderr
        monkeypatch.setattr(journal.os, "replace", real_replace)
        again = _cli("revert", tree)  # still blocked: the same message, no traceback
        assert again.exit_code == 3 and "could not be put back" in again.stderr
    finally:
        _immutable(seen[0], False)
    assert _cli("revert", tree).exit_code == 0
    assert snapshot(tree) == before


# --------------------------------------------------------- every failure at every step (fuzz) --

ERRNOS = [errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EIO, errno.EISDIR, errno.EACCES]


FAULTS = dict(fail_at=st.integers(0, 60), err=st.sampled_from(ERRNOS), undo_fail=st.integers(-1, 20),
              command=st.sampled_from(["apply", "revert"]))


@fast(40)
@given(**FAULTS)
def test_any_failure_at_any_step_is_truthful(tmp_path_factory, templates, fail_at, err, undo_fail, command):
    _fault_case(tmp_path_factory, templates, fail_at, err, undo_fail, command)


@pytest.mark.slow
@slow(400)
@given(**FAULTS)
def test_any_failure_at_any_step_is_truthful_slow(tmp_path_factory, templates, fail_at, err, undo_fail, command):
    _fault_case(tmp_path_factory, templates, fail_at, err, undo_fail, command)


def _fault_case(tmp_path_factory, templates, fail_at, err, undo_fail, command):
    tmp = tmp_path_factory.mktemp("fault")
    tree = _copy(templates[0] if command == "apply" else templates[1], tmp / "t")
    before = snapshot(tree)
    calls = {"run": 0, "undo": 0}
    real = {name: getattr(journal.os, name) for name in ("replace", "unlink", "rmdir", "mkdir")}
    undoing = {"on": False}

    def faulty(name):
        def op(*args, **kwargs):
            if not undoing["on"]:
                calls["run"] += 1
                if calls["run"] == fail_at:
                    raise OSError(err, os.strerror(err), str(args[-1] if name == "replace" else args[0]))
            else:
                calls["undo"] += 1
                if calls["undo"] == undo_fail:
                    raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(args[0]))
            return real[name](*args, **kwargs)
        return op

    real_rollback = journal._rollback

    def rollback(*a, **k):
        undoing["on"] = True
        return real_rollback(*a, **k)

    mp = pytest.MonkeyPatch()
    try:
        for name in real:
            mp.setattr(journal.os, name, faulty(name))
        mp.setattr(journal, "_rollback", rollback)
        res = _cli(command, tree)
    finally:
        mp.undo()
    assert "Traceback" not in res.output and res.exit_code in (0, 2, 3), res.output
    if res.exit_code == 0:
        return  # the fault never fired
    if "could not be put back" in res.stderr:
        assert res.exit_code == 3 and f"mi100-codegen revert {tree}" in res.stderr
        assert (tree / TXN / "rollback.json").is_file()
        fin = _cli("revert", tree)  # the faults are gone: finishes the rollback (and a revert)
        assert fin.exit_code == 0, fin.output
        if command == "revert":
            assert snapshot(tree) == snapshot(templates[0])
        else:
            assert snapshot(tree) == before
    else:
        assert "nothing in the tree was changed" in res.stderr or "every file is as it was before" in res.stderr
        if "temporary folder" in res.stderr:  # a failure while removing txn/ itself: said, and gone next time
            assert journal.recover(tree) in ("discard", "rollback")  # what the next command does first
        assert snapshot(tree) == before, res.stderr
        assert not (tree / journal.STATE_DIR / "txn").exists()


# -------------------------------------------------------------- mutated locks (property based) --

HOSTILE_PATHS = ["../victim.txt", "/tmp/x", "..", ".git/HEAD", "a/../../b", "", ".", "v3src/util.cc",
                 "v3python/x.py", ".mi100-codegen/backup/v3src/util.cc", "new/dir", "a\nb", "x" * 5000]


@fast(30)
@given(data=st.data())
def test_mutated_lock_never_touches_outside_or_tracebacks(tmp_path_factory, templates, data):
    _lock_case(tmp_path_factory, templates, data)


@pytest.mark.slow
@slow(300)
@given(data=st.data())
def test_mutated_lock_never_touches_outside_or_tracebacks_slow(tmp_path_factory, templates, data):
    _lock_case(tmp_path_factory, templates, data)


def _lock_case(tmp_path_factory, templates, data):
    tmp = tmp_path_factory.mktemp("lockfuzz")
    tree = _copy(templates[1], tmp / "t")
    victim, _ = _victims(tmp)
    lock = json.loads((tree / LOCK_NAME).read_text())
    for _ in range(data.draw(st.integers(1, 4))):
        what = data.draw(st.sampled_from(["add", "mode", "dirs", "drop", "kind", "sha", "top"]))
        if what == "add":
            lock["files"][data.draw(st.sampled_from(HOSTILE_PATHS))] = {
                "kind": "module", "before": data.draw(st.sampled_from([None, _sha(victim)])),
                "after": _sha(victim), "edits": []}
        elif what == "mode":
            rel = data.draw(st.sampled_from(sorted(lock["files"])))
            lock["files"][rel]["mode"] = data.draw(st.sampled_from([0o6777, 0o4755, -1, 2**40, "x", None, 0o777]))
        elif what == "dirs":
            lock["created_dirs"] = data.draw(st.lists(st.sampled_from(HOSTILE_PATHS), max_size=3))
        elif what == "drop" and lock["files"]:
            lock["files"].pop(data.draw(st.sampled_from(sorted(lock["files"]))))
        elif what == "kind":
            rel = data.draw(st.sampled_from(sorted(lock["files"])))
            lock["files"][rel]["kind"] = data.draw(st.sampled_from(["edit", "db", "x", 3]))
        elif what == "sha":
            rel = data.draw(st.sampled_from(sorted(lock["files"])))
            lock["files"][rel]["after"] = data.draw(st.sampled_from([_sha(victim), None, "z", "0" * 64]))
        else:  # the whole document of another shape: nothing more to mutate
            lock = data.draw(st.sampled_from([lock, [lock], {"files": lock}, None]))
            break
    (tree / LOCK_NAME).write_text(json.dumps(lock))
    world = _world(tmp)
    for cmd in (("revert", "--force", tree), ("apply", tree), ("revert", tree)):
        res = _cli(*cmd)
        assert "Traceback" not in res.output and res.exit_code in (0, 2, 3), (cmd, res.output)
        assert _world(tmp) == world and _no_setuid(tree)


# ------------------------------------------------------------------------- on the real trees --

@pytest.mark.aotriton
@pytest.mark.parametrize("tag", ["0.11b", "0.13b"])
def test_real_tree_failures_roll_back_byte_identical(fresh_tree, tag):
    """On the real release trees: a directory where the overlay writes its module (refused before
    anything is staged), then an immutable upstream file (`chattr +i`, rolled back after the swap
    started): each time one message, the tree byte-identical, and the next apply succeeds."""
    tree = fresh_tree(tag)
    ref = tree.parent / "ref"
    shutil.copytree(tree, ref, symlinks=True)
    assert _cli("apply", ref).exit_code == 0
    lock = json.loads((ref / LOCK_NAME).read_text())
    module = next(rel for rel, e in lock["files"].items() if e["kind"] == "module")
    edited = sorted(rel for rel, e in lock["files"].items() if e["kind"] == "edit")[-1]
    before = snapshot(tree)
    (tree / module).mkdir()
    res = _cli("apply", tree)
    assert res.exit_code == 2 and "is a directory" in res.stderr and "Traceback" not in res.output, res.output
    (tree / module).rmdir()
    assert snapshot(tree) == before
    if not _immutable(tree / edited, True):
        pytest.skip("chattr +i needs root and a filesystem with the immutable flag")
    try:
        res = _cli("apply", tree)
        assert res.exit_code == 2 and "rolled back" in res.stderr and "Traceback" not in res.output, res.output
        assert edited in res.stderr
    finally:
        _immutable(tree / edited, False)
    assert snapshot(tree) == before
    assert _cli("apply", tree).exit_code == 0 and snapshot(tree) == snapshot(ref)
