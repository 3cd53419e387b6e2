"""apply / revert on small synthetic trees (fast; the real releases are in test_apply_real.py)."""

from __future__ import annotations

import errno
import json
import os
import sqlite3

import pytest
from typer.testing import CliRunner

from codegen.apply.lock import LOCK_NAME, read_lock
from codegen.apply.engine import ApplyConflict, apply_overlay
from codegen.apply.revert import revert_tree
from codegen.apply import journal
from codegen.formats.tuning_db import read_archive
from codegen.upstream import SUPPORTED_RELEASES
from fake_tree import make_fake_tree, snapshot, spec_variant
from codegen.models import KernelConfig
from codegen.models.limits import cap_waves_per_eu
from codegen.render.inputs import render_overlay
from codegen.cli import app
from codegen.formats.spec import load_spec

VERSIONS = [(0, 10, 0), (0, 11, 0), (0, 11, 2), (0, 12, 0)]


@pytest.fixture(scope="module")
def spec():
    return load_spec(None)


def _spec_variant(tmp_path, **repl):
    return load_spec(spec_variant(tmp_path, **repl))


def _mtimes(root):
    return {p: p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def _rows(tree, rel, table, gpu):
    _, payload = read_archive((tree / rel).read_bytes(), rel)
    db = tree.parent / "peek.sqlite3"
    db.write_bytes(payload)
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f'SELECT * FROM "{table}" WHERE gpu=?', (gpu,)).fetchall()
    finally:
        conn.close()
        db.unlink()


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_twice_then_revert(tmp_path, spec, version):
    tree = make_fake_tree(tmp_path / "t", version)
    pristine = snapshot(tree)
    r = apply_overlay(tree, spec)
    verdicts = {f.path: f.verdict for f in r.files}
    assert verdicts["v3python/mi100_codegen_space.py"] == "create"
    assert verdicts["v3python/gpu_targets.py"] == "edit"
    assert r.changed and not r.conflicts
    skipped = {e.id for e in r.edits if e.verdict == "skip"}
    assert skipped == ({"gpu_targets.production_line"} if version >= (0, 12, 0) else set())
    lock = read_lock(tree)
    assert lock.release == r.release and lock.spec_sha256 == spec.sha256
    assert lock.manifest_sha256 == r.manifest_sha256 and lock.adapter == r.adapter

    applied, mtimes = snapshot(tree), _mtimes(tree)
    r2 = apply_overlay(tree, spec)
    assert {f.verdict for f in r2.files} == {"identical"} and not r2.changed
    assert snapshot(tree) == applied and _mtimes(tree) == mtimes  # not a byte, not a touch

    revert_tree(tree)
    assert snapshot(tree) == pristine
    assert not revert_tree(tree).files  # nothing left to revert


def test_rows_are_complete_capped_and_renamed(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    apply_overlay(tree, spec)
    shard = "v3python/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz"
    rows = _rows(tree, shard, "FLASH$attn_fwd", "gfx908_mod0")
    donor = _rows(tree, "v3python/database/amd/gfx90a/flash/attn_fwd.sqlite3.tar.xz", "FLASH$attn_fwd",
                  "gfx90a_mod0")
    assert len(rows) == len(donor) == 144  # hd 32/64 x 3 dtypes x 12 functionals... x 2x2 bins
    limits = render_overlay(spec).rows.waves_per_eu_limits  # tuning/gfx908/compile_report.json
    dtypes = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}
    for r in rows:  # BLOCK_M, BLOCK_N, PRE_LOAD_V, waves, warps, stages follow the 9 key columns
        bm, bn, waves = r[9], r[10], r[12]
        want = 1 if (bm, bn) in ((128, 64), (128, 128)) else 2  # the spec's caps
        key = KernelConfig("attn_fwd", "gfx908", dtypes[r[1]], r[5], bm, bn, 0, r[13], r[14], r[11]).limit_key
        assert waves == cap_waves_per_eu(limits, key, want)[0]  # then the compile report's limits
    # the op DB keeps every other GPU's rows
    op = "v3python/database/op_database.sqlite3.tar.xz"
    assert len(_rows(tree, op, "FLASH$op_attn_bwd", "gfx90a_mod0")) == 144
    assert len(_rows(tree, op, "FLASH$op_attn_bwd", "gfx908_mod0")) == 144


def test_changed_spec_reapplies_from_pristine(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 0))
    reference = make_fake_tree(tmp_path / "ref", (0, 11, 0))
    apply_overlay(reference, spec)
    apply_overlay(tree, spec)
    variant = _spec_variant(tmp_path, **{"experimental: false": "experimental: true",
                                         "block_n: 64, max_waves_per_eu: 1": "block_n: 64, max_waves_per_eu: 0"})
    r = apply_overlay(tree, variant)
    assert {f.path: f.verdict for f in r.files}["v3src/util.cc"] == "edit"
    assert "0x908" in (tree / "v3src/util.cc").read_text().split("isArchExperimentallySupported")[1]
    rows = _rows(tree, "v3python/rules/tuning_database.sqlite3.tar.xz", "FLASH$attn_fwd", "gfx908_mod0")
    assert {r[12] for r in rows if (r[10], r[11]) == (128, 64)} == {0}
    # back to the first spec: identical to a tree that only ever saw it (no stale rows/entries)
    apply_overlay(tree, spec)
    assert snapshot(tree) == snapshot(reference)


def test_local_edit_at_anchor_is_a_conflict(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    gt = tree / "v3python/gpu_targets.py"
    gt.write_text(gt.read_text().replace("    'gfx90a'     : 64,", "    'gfx90a' : 64,  # local"))
    before = snapshot(tree)
    with pytest.raises(ApplyConflict) as exc:
        apply_overlay(tree, spec)
    assert [f.path for f in exc.value.result.conflicts] == ["v3python/gpu_targets.py"]
    assert snapshot(tree) == before
    res = CliRunner().invoke(app, ["apply", str(tree), "--json"])
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert not out["ok"] and snapshot(tree) == before


def test_local_change_after_apply_is_a_conflict(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    apply_overlay(tree, spec)
    cc = tree / "v3src/util.cc"
    cc.write_text(cc.read_text() + "// local change\n")
    before = snapshot(tree)
    with pytest.raises(ApplyConflict, match="changed since mi100-codegen applied it"):
        apply_overlay(tree, spec)
    assert snapshot(tree) == before
    with pytest.raises(ApplyConflict):
        revert_tree(tree)
    assert snapshot(tree) == before
    revert_tree(tree, force=True)
    assert not (tree / LOCK_NAME).exists() and "gfx908" not in cc.read_text()


def test_pretend_writes_nothing(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 1))
    before = snapshot(tree)
    r = apply_overlay(tree, spec, pretend=True)
    assert r.changed and {f.verdict for f in r.files} == {"create", "edit"}
    assert snapshot(tree) == before


@pytest.mark.parametrize("fail_at", ["stage", "swap"])
def test_failure_leaves_tree_unchanged(tmp_path, spec, monkeypatch, fail_at):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    before = snapshot(tree)
    if fail_at == "stage":  # e.g. a full disk while staging
        real = journal.write_durable
        calls = {"n": 0}

        def full(path, data, mode=None):
            calls["n"] += 1
            if calls["n"] == 5:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, data, mode)

        monkeypatch.setattr(journal, "write_durable", full)
    else:  # a failing rename in the middle of the swap: rolled back in-process
        real_replace = os.replace
        calls = {"n": 0}

        def flaky(src, dst):
            if "txn/new" in str(src):
                calls["n"] += 1
                if calls["n"] == 4:
                    raise PermissionError(errno.EACCES, "Permission denied", str(dst))
            return real_replace(src, dst)

        monkeypatch.setattr(journal.os, "replace", flaky)
    with pytest.raises(Exception, match="No space left|Permission denied"):
        apply_overlay(tree, spec)
    assert snapshot(tree) == before


def test_cli_refuses_newer_release_with_one_message(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 15, 0))
    (tree / "modules").mkdir()
    before = snapshot(tree)
    res = CliRunner().invoke(app, ["apply", str(tree)])
    assert res.exit_code == 2
    assert len([l for l in res.stderr.splitlines() if l.strip()]) == 1
    assert "AOTriton 0.15.0 (as its CMakeLists.txt says) is not supported; supported releases: " in res.stderr
    assert "Traceback" not in res.stderr
    assert snapshot(tree) == before


def test_revert_refuses_an_unknown_release_it_never_applied_but_reverts_an_applied_one(tmp_path, spec):
    """A never-applied tree of an unknown release: one message naming the supported releases,
    exit 2, nothing written (as apply). A tree applied before its version lines changed (an
    upstream merge) is still revertable: the lock, not the tree, names the release; apply edited
    CMakeLists.txt, so the changed version lines are a local change that --force discards."""
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    cm = tree / "CMakeLists.txt"
    bumped = cm.read_text().replace("MINOR_INT 12", "MINOR_INT 15")
    assert bumped != cm.read_text()
    cm.write_text(bumped)
    before = snapshot(tree)
    res = CliRunner().invoke(app, ["revert", str(tree)])
    assert res.exit_code == 2, res.output
    assert [l for l in res.stderr.splitlines() if l.strip()] == [
        f"error: {tree}: AOTriton 0.15.0 (as its CMakeLists.txt says) is not supported; supported releases: "
        + ", ".join(SUPPORTED_RELEASES)]
    assert "nothing to revert" not in res.output and snapshot(tree) == before

    cm.write_text(cm.read_text().replace("MINOR_INT 15", "MINOR_INT 12"))
    pristine = snapshot(tree)
    apply_overlay(tree, spec)
    cm.write_text(cm.read_text().replace("MINOR_INT 12", "MINOR_INT 15"))
    res = CliRunner().invoke(app, ["revert", str(tree)])
    assert res.exit_code == 2 and "CMakeLists.txt" in res.output and "not supported" not in res.output
    res = CliRunner().invoke(app, ["revert", str(tree), "--force"])
    assert res.exit_code == 0, res.output
    assert snapshot(tree) == pristine
