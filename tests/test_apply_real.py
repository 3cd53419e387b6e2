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
from codegen.formats.aks2 import parse_dispatch_table, parse_zip_table
from codegen.formats.compile_list import entry_names
from codegen.plan.kernel_list import parse_compile_list
from codegen.plan.database import compose_database
from codegen.upstream.generator import importable
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
    from codegen.formats.tuning_db import read_archive

    rel = adapter.shard_path("gfx908", "attn_fwd") if adapter.shard_root else adapter.tuning_db
    _, payload = read_archive((tree / rel).read_bytes(), rel)
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


def _names_round_trip(build: Path, adapter, entries) -> None:
    """Every image name of a real generator run, in every place it is spelt, is the model's
    (codegen.models.image_name): parsed, then printed back byte for byte; plan names every image."""
    names = adapter.image_names
    for e in entries:
        image = e.image_name(names)
        assert image is not None and image.file_stem == e.id, e.id
        assert str(names.parse(str(image), image.kernel)) == str(image)
    if names.digest_files:   # the names the clusters' entry lists give
        for hsaco, name in entry_names(build).items():
            kernel = Path(hsaco).name.rsplit("-", 1)[0]
            assert str(names.parse(name, kernel)) == name, name
    tables = sorted(build.glob("*/autotune.*/*.cc"))
    parse = parse_zip_table if adapter.image_format == "zip" else parse_dispatch_table
    refs = [r for t in tables for r in parse(t, names)]   # each comment split and printed by the model
    assert len(refs) == len(entries)


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
        with importable(adapter, gen_tree) as pkg_env:  # 0.13b: python/ imported as `aotriton`
            env = dict(os.environ, PYTHONHASHSEED="0", **pkg_env)
            compose_database(adapter, gen_tree, build, py, env)
            proc = subprocess.run([py, "-X", "utf8", "-m", adapter.generator_module, "--target_gpus",
                                   "gfx908_mod0", "--build_dir", str(build)],
                                  cwd=gen_tree, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "MissingLutEntry" not in proc.stdout + proc.stderr
        entries = parse_compile_list(build / "Bare.compile", gen_tree, build, adapter.image_names)
        _names_round_trip(build, adapter, entries)
        fwd = [e.config for e in entries if e.config.family == "attn_fwd"]
        got = {(c.block_m, c.block_n, c.waves_per_eu, c.num_warps, c.num_stages) for c in fwd}
        assert len(got) > 1  # not one default kernel per functional
        assert got == _target_configs(tree, adapter)  # exactly the seeded (donor-derived) configs
        assert {e.config.arch for e in entries} == {"gfx908"}
        named = [e.image_name(adapter.image_names) for e in entries if e.config.family == "attn_fwd"]
        perf = [n.named_perf or dict(zip(("", "", "BLOCK_M", "BLOCK_N"), n.perf)) for n in named]
        # the tiles and compiler options the image names spell are the seeded configs too
        assert {(int(p["BLOCK_M"]), int(p["BLOCK_N"]), n.waves_per_eu, n.num_warps, n.num_stages)
                for p, n in zip(perf, named)} == got
        assert len(named) > len({n.functional for n in named})

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

# A newer tree (main claiming 0.15.0, a 0.13b copy claiming 0.14.0) refused cleanly by apply and
# every other stage: tests/test_releases_real.py.


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


def _release_extracts(tree: Path) -> str:
    """How this release's CMake reads the tuning-database archives: `cmake -E tar xf` (0.10b,
    0.11b) or `file(ARCHIVE_EXTRACT ...)` (0.11.1b and later), read from its own v3src/CMakeLists.txt."""
    text = (tree / "v3src" / "CMakeLists.txt").read_text(encoding="utf-8")
    if "file(ARCHIVE_EXTRACT" in text:
        return "archive_extract"
    assert re.search(r"\$\{CMAKE_COMMAND\} -E tar xf\s+\"[^\"]*sqlite3\.tar\.xz\"", text), "unknown reader"
    return "tar_xf"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake (upstream's reader of the archives)")
@pytest.mark.parametrize("tag", TAGS)
def test_written_archives_extract_with_the_release_own_cmake_command(fresh_tree, tmp_path, tag):
    """Every tuning-database archive apply writes is read by the release's own CMake step, with
    the same command its CMakeLists.txt uses, into the exact sqlite file, which sqlite opens."""
    from codegen.formats.tuning_db import read_archive

    tree = fresh_tree(tag)
    assert _cli("apply", str(tree)).exit_code == 0
    how = _release_extracts(tree)
    written = sorted(rel for rel, ent in read_lock(tree).files.items() if ent.kind == "db")
    assert written
    for i, rel in enumerate(written):
        out = tmp_path / f"x{i}"
        out.mkdir()
        if how == "tar_xf":
            subprocess.run(["cmake", "-E", "tar", "xf", str(tree / rel)], cwd=out, check=True)
        else:
            script = tmp_path / f"x{i}.cmake"
            script.write_text(f'file(ARCHIVE_EXTRACT INPUT "{tree / rel}" DESTINATION "{out}")\n')
            subprocess.run(["cmake", "-P", str(script)], check=True)
        member, payload = read_archive((tree / rel).read_bytes(), rel)
        assert [p.name for p in out.iterdir()] == [member]
        assert (out / member).read_bytes() == payload
        conn = sqlite3.connect(out / member)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        finally:
            conn.close()
