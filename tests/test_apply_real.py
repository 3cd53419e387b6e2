"""apply / revert on the real release trees (AOTRITON_GIT or AOTRITON_SRC), and proof that the
rows work: the tree's own generator, run for gfx908_mod0 only, succeeds (no MissingLutEntry)
and compiles exactly the seeded configs instead of one 16x16 default per functional."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.apply.lock import LOCK_NAME, read_lock
from codegen.upstream.database import compose_database
from fake_tree import snapshot
from codegen.cli import app
from codegen.upstream import SUPPORTED_RELEASES, detect

from test_apply_journal import kill_loop

pytestmark = pytest.mark.aotriton
TAGS = SUPPORTED_RELEASES  # the adapter table: every supported release
REPO = Path(__file__).resolve().parents[1]


def _generator_python() -> str | None:
    """A python with the generator's requirements (pandas, numpy): AOTRITON_GEN_PYTHON, the
    team's venv, or this interpreter."""
    cands = [os.environ.get("AOTRITON_GEN_PYTHON"), "/work/scratch/venv-gen/bin/python", sys.executable]
    for c in cands:
        if c and Path(c).exists():
            ok = subprocess.run([c, "-c", "import pandas, numpy"], capture_output=True).returncode == 0
            if ok:
                return c
    return None


def _cli(*args):
    return CliRunner().invoke(app, list(args))


def _diff_r(a: Path, b: Path) -> str:
    return subprocess.run(["diff", "-r", str(a), str(b)], capture_output=True, text=True).stdout


def _target_configs(tree: Path, adapter) -> set[tuple]:
    """(BLOCK_M, BLOCK_N, waves, warps, stages) of gfx908_mod0's attn_fwd rows in the tree."""
    from codegen.apply.dbrows import read_tarxz

    rel = adapter.shard_path("gfx908", "attn_fwd") if adapter.shard_root else adapter.tuning_db
    _, payload = read_tarxz((tree / rel).read_bytes(), rel)
    db = tree.parent / f"{tree.name}.peek.sqlite3"
    db.write_bytes(payload)
    conn = sqlite3.connect(db)
    try:
        return set(conn.execute(
            'SELECT DISTINCT "tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N", "compiler_options$waves_per_eu", '
            '"compiler_options$num_warps", "compiler_options$num_stages" FROM "FLASH$attn_fwd" '
            "WHERE gpu='gfx908_mod0'"))
    finally:
        conn.close()
        db.unlink()


HSACO = re.compile(r"(?P<k>[a-z_]+)-Sig-F__(?P<f>.*?)__P__(?P<p>.*?)__CO__wave(?P<w>\d+)_warp(?P<n>\d+)_stg(?P<s>\d+)"
                   r"--Arch_(?P<a>\w+)\.hsaco$")


def _compiled(build: Path) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for line in (build / "Bare.compile").read_text(encoding="utf-8").splitlines():
        hs = next(Path(x).name for x in line.split(";") if x.endswith(".hsaco"))
        m = HSACO.match(hs)
        assert m, hs
        out.setdefault(m["k"], []).append((m["f"], m["p"], int(m["w"]), int(m["n"]), int(m["s"]), m["a"]))
    return out


@pytest.mark.parametrize("tag", TAGS)
def test_release_apply_idempotent_generate_revert(pristine_tree, fresh_tree, tmp_path, tag):
    pristine, tree = pristine_tree(tag), fresh_tree(tag)
    res = _cli("apply", str(tree), "--json")
    assert res.exit_code == 0, res.stderr
    first = json.loads(res.stdout)
    assert first["release"] == tag and first["ok"]
    assert {f["verdict"] for f in first["files"]} <= {"create", "edit"}
    for path, tables in first["rows"].items():
        for table, st in tables.items():
            if not table.startswith("FLASH$op_"):
                assert st["rows_written"] > 0, (path, table)
    lock = read_lock(tree)
    assert lock.release == tag and lock.adapter == detect(tree).id

    applied = snapshot(tree)
    res = _cli("apply", str(tree), "--json")
    assert res.exit_code == 0, res.stderr
    second = json.loads(res.stdout)
    assert [(f["path"], f["verdict"]) for f in second["files"] if f["verdict"] != "identical"] == []
    assert not second["changed"]
    assert snapshot(tree) == applied

    py = _generator_python()
    if py is not None:  # the rows work: the tree's own generator for gfx908_mod0 only
        gen_tree, build = tmp_path / "gen", tmp_path / "build"
        shutil.copytree(tree, gen_tree)
        adapter = detect(gen_tree)
        compose_database(adapter, gen_tree, build, py)
        env = dict(os.environ, PYTHONHASHSEED="0")
        proc = subprocess.run([py, "-X", "utf8", "-m", adapter.generator_module, "--target_gpus", "gfx908_mod0",
                               "--build_dir", str(build)], cwd=gen_tree, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "MissingLutEntry" not in proc.stdout + proc.stderr
        kernels = _compiled(build)
        fwd = kernels["attn_fwd"]
        functionals = {k[0] for k in fwd}
        assert len(fwd) > len(functionals)  # not one default kernel per functional
        got = {(int(p.split("_")[2]), int(p.split("_")[3]), w, n, s) for _, p, w, n, s, _ in fwd}
        assert got == _target_configs(tree, adapter)  # exactly the seeded (donor-derived) configs
        assert {a for v in kernels.values() for *_, a in v} == {"gfx908"}

    res = _cli("revert", str(tree))
    assert res.exit_code == 0, res.stderr
    assert _diff_r(pristine, tree) == ""
    assert not (tree / LOCK_NAME).exists() and not (tree / ".mi100-codegen").exists()


@pytest.mark.parametrize("tag", ["0.11.2b"])
def test_local_edit_at_anchor_refused_real(fresh_tree, tag):
    tree = fresh_tree(tag)
    h = tree / "include/aotriton/util.h"
    h.write_text(h.read_text().replace("GPU_AMD_ARCH_GFX90A_MOD0  = TRICAT(GpuVendor::kAMD,  0x90a, 0),",
                                       "GPU_AMD_ARCH_GFX90A_MOD0 = TRICAT(GpuVendor::kAMD, 0x90a, 1),"))
    gt = tree / "v3python/gpu_targets.py"
    gt.write_text(gt.read_text().replace("    'gfx90a_mod0',\n", "    'gfx90a_mod0', 'gfx90a_mod1',\n"))
    before = snapshot(tree)
    res = _cli("apply", str(tree), "--json")
    assert res.exit_code == 2
    out = json.loads(res.stdout)
    assert sorted(f["path"] for f in out["files"] if f["verdict"] == "conflict") == \
        ["include/aotriton/util.h", "v3python/gpu_targets.py"]
    assert snapshot(tree) == before


def test_013b_refused_cleanly(fresh_tree):
    tree = fresh_tree("0.13b")
    before = snapshot(tree)
    res = _cli("apply", str(tree))
    assert res.exit_code == 2
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "0.13b uses the python/ + modules/ layout" in lines[0]
    assert "supported releases: " + ", ".join(SUPPORTED_RELEASES) in lines[0]
    assert snapshot(tree) == before


@pytest.mark.slow
def test_sigkill_real_tree_never_half_applied(pristine_tree, tmp_path):
    """Kill real `apply`/`revert` runs on 0.12b; most kills are aimed at the second half of a
    run (measured first), where the journaled swap happens."""
    import time

    src = pristine_tree("0.12b")
    ref = tmp_path / "ref"
    shutil.copytree(src, ref)
    pristine = snapshot(ref)
    env = dict(os.environ, MI100_CODEGEN_TXN_DELAY="0.05")
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "codegen.cli", "apply", str(ref)], cwd=REPO, env=env, check=True,
                   capture_output=True)
    took = time.monotonic() - t0
    applied = snapshot(ref)

    def factory(n):
        dest = tmp_path / f"k{n}"
        shutil.copytree(src, dest)
        return dest

    seen = kill_loop(factory, pristine, applied, runs=5, min_delay=0.4 * took, max_delay=1.05 * took,
                     seed=9080, txn_delay=0.05)
    assert seen["pristine"] + seen["applied"] == 5
