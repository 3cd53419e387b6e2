"""The journaled transaction: recovery after a crash, and SIGKILL at random moments of a real
`mi100-codegen apply`/`revert` subprocess (synthetic tree, so it stays fast)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from codegen.apply.engine import apply_overlay
from codegen.apply.revert import recover_tree, revert_tree
from codegen.apply import journal
from fake_tree import make_fake_tree, snapshot
from codegen.formats.spec import load_spec

REPO = Path(__file__).resolve().parents[1]


def test_commit_and_discard_of_unjournaled_stage(tmp_path):
    tree = tmp_path / "t"
    (tree / "a").mkdir(parents=True)
    (tree / "a" / "f").write_text("old")
    t = journal.Transaction(tree)
    t.mkdir("b/c")
    t.write("b/c/new", b"new")
    t.write("a/f", b"changed")
    t.commit()
    assert (tree / "a/f").read_text() == "changed" and (tree / "b/c/new").read_bytes() == b"new"
    assert not (tree / journal.STATE_DIR).exists()
    # a kill before the commit point leaves a stage without journal: discarded, tree untouched
    (tree / journal.TXN_DIR / "new").mkdir(parents=True)
    (tree / journal.TXN_DIR / "new" / "0").write_bytes(b"junk")
    assert journal.recover(tree) == "discard"
    assert not (tree / journal.STATE_DIR).exists()


def test_kill_after_commit_point_rolls_forward(tmp_path, monkeypatch):
    tree = tmp_path / "t"
    tree.mkdir()
    for n in range(4):
        (tree / f"f{n}").write_text(f"old{n}")
    t = journal.Transaction(tree)
    for n in range(4):
        t.write(f"f{n}", f"new{n}".encode())
    real = journal.os.replace
    calls = {"n": 0}

    def die(src, dst):  # simulate a kill after two of the four swaps (BaseException: no undo)
        if "txn/new" in str(src):
            calls["n"] += 1
            if calls["n"] == 3:
                raise SystemExit("killed")
        return real(src, dst)

    monkeypatch.setattr(journal.os, "replace", die)
    with pytest.raises(SystemExit):
        t.commit()
    monkeypatch.setattr(journal.os, "replace", real)
    assert journal.pending(tree) == "forward"
    assert journal.recover(tree) == "forward"
    assert [(tree / f"f{n}").read_text() for n in range(4)] == [f"new{n}" for n in range(4)]
    assert not (tree / journal.STATE_DIR).exists()


def _states(tmp_path, version):
    spec = load_spec(None)
    ref = make_fake_tree(tmp_path / "ref", version)
    pristine = snapshot(ref)
    apply_overlay(ref, spec)
    return pristine, snapshot(ref)


def _kill_at(cmd: list[str], delay: float, env: dict) -> int | None:
    p = subprocess.Popen([sys.executable, "-m", "codegen.cli", *cmd], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    return p.wait()


def kill_loop(tree_factory, pristine, applied, runs, max_delay, seed, txn_delay, min_delay=0.0):
    """Start apply (or revert of an applied tree) in a subprocess, SIGKILL it after a random
    delay, recover, and check the tree is exactly pristine or exactly applied."""
    rng = random.Random(seed)
    env = dict(os.environ, MI100_CODEGEN_TXN_DELAY=str(txn_delay))
    seen = {"pristine": 0, "applied": 0, "forward": 0, "discard": 0}
    for n in range(runs):
        tree = tree_factory(n)
        cmd = "apply" if n % 3 else "revert"
        if cmd == "revert":
            apply_overlay(tree, load_spec(None))
        _kill_at([cmd, str(tree)], rng.uniform(min_delay, max_delay), env)
        what = recover_tree(tree)
        if what in seen:
            seen[what] += 1
        state = snapshot(tree)
        assert state in (pristine, applied), f"run {n} ({cmd}): half-applied tree"
        seen["pristine" if state == pristine else "applied"] += 1
        # the next command works from whatever state the kill left
        apply_overlay(tree, load_spec(None))
        assert snapshot(tree) == applied
        revert_tree(tree)
        assert snapshot(tree) == pristine
    return seen


def test_sigkill_at_random_moments_never_half_applies(tmp_path):
    version = (0, 12, 0)
    pristine, applied = _states(tmp_path, version)
    seen = kill_loop(lambda n: make_fake_tree(tmp_path / f"k{n}", version), pristine, applied,
                     runs=6, max_delay=3.0, seed=908, txn_delay=0.05)
    assert seen["pristine"] + seen["applied"] == 6


# ---------------------------------------------------------------- the engine the torch install uses --

def _two_roots(tmp_path):
    tree, other = tmp_path / "tree", tmp_path / "beside"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / "f").write_bytes(b"old")
    (other / "bk.tmp").mkdir(parents=True)
    (other / "bk.tmp" / "m").write_text("backup")
    return tree, other


def test_a_second_root_rename_and_copy_commit_and_roll_back(tmp_path):
    """A transaction with the backup folder beside the tree as its second root: the staged backup
    renamed into place, a file copied in (streamed, its sha256 checked), a check; an I/O error on
    the last step undoes everything, the rename included."""
    tree, other = _two_roots(tmp_path)
    src = tmp_path / "src"
    src.write_bytes(b"new" * 1000)
    t = journal.Transaction(tree, (other,), "test")
    t.rename("bk.tmp", "bk", root=1)
    t.copy("lib/f", src, journal.state_of(src))
    t.check("lib/f", journal.state_of(src))
    t.commit()
    assert (tree / "lib" / "f").read_bytes() == src.read_bytes() and (other / "bk" / "m").is_file()
    assert not (other / "bk.tmp").exists() and not (tree / journal.STATE_DIR).exists()

    tree, other = _two_roots(tmp_path / "again")
    t = journal.Transaction(tree, (other,), "test")
    t.rename("bk.tmp", "bk", root=1)
    t.copy("lib/f", src)
    t.check("lib/f", "0" * 64)   # not what was written: the whole is undone
    with pytest.raises(journal.TxnFailed) as exc:
        t.commit()
    assert exc.value.committed and isinstance(exc.value.cause, journal.Mismatch)
    assert (tree / "lib" / "f").read_bytes() == b"old" and (other / "bk.tmp" / "m").is_file()
    assert not (other / "bk").exists() and not (tree / journal.STATE_DIR).exists()


def test_a_copy_that_is_not_what_was_planned_changes_nothing(tmp_path):
    tree, other = _two_roots(tmp_path)
    src = tmp_path / "src"
    src.write_bytes(b"changed meanwhile")
    t = journal.Transaction(tree, (other,), "test")
    t.copy("lib/f", src, "0" * 64)
    with pytest.raises(journal.StagedDiffers):
        t.commit()
    assert (tree / "lib" / "f").read_bytes() == b"old" and not (tree / journal.STATE_DIR).exists()


def _committed_not_run(tmp_path):
    """A committed journal none of whose operations ran (as after a kill at the commit point)."""
    tree, other = _two_roots(tmp_path)
    t = journal.Transaction(tree, (other,), "test install")
    t.rename("bk.tmp", "bk", root=1)
    t.write("lib/f", b"new")
    real = journal._forward
    journal._forward = lambda *a: None
    try:
        t.commit()
    finally:
        journal._forward = real
    assert journal.pending(tree) == "forward"
    return tree, other


def test_recovery_follows_only_the_roots_the_command_names(tmp_path):
    tree, other = _committed_not_run(tmp_path)
    for wrong in ((), (tmp_path / "elsewhere",)):
        with pytest.raises(journal.RootsDiffer) as exc:
            journal.recover(tree, wrong)
        assert exc.value.journal.label == "test install" and exc.value.journal.roots == [str(other)]
    assert journal.pending(tree) == "forward" and (tree / "lib" / "f").read_bytes() == b"old"
    assert journal.journal_label(tree) == "test install"
    assert journal.recover(tree, (other,)) == "forward"
    assert (tree / "lib" / "f").read_bytes() == b"new" and (other / "bk" / "m").is_file()


def test_a_journal_the_tree_moved_away_from_is_not_rolled_forward(tmp_path):
    """A path holding neither its state before the journal nor what the journal writes (torch
    reinstalled meanwhile): recovery refuses (Diverged) and changes nothing."""
    tree, other = _committed_not_run(tmp_path)
    (tree / "lib" / "f").write_bytes(b"someone else's")
    with pytest.raises(journal.Diverged) as exc:
        journal.recover(tree, (other,))
    assert exc.value.paths == ["lib/f: a file of other content"]
    assert (tree / "lib" / "f").read_bytes() == b"someone else's" and journal.pending(tree) == "forward"
