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
