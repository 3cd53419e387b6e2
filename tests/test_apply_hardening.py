"""apply/revert refusals and hardening (issue 11), the plan/commit split and the order of checks
(issue 12): fast units on synthetic trees, and the behaviour on the real release trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.apply.lock import LOCK_NAME, read_lock
from codegen.apply.engine import ApplyConflict, apply_overlay, plan_apply
from codegen.apply.revert import revert_tree
from codegen.apply import dbrows
from codegen.apply import journal
from codegen.formats import tuning_db
from codegen.cli import app
from codegen.core.errors import UserError
from codegen.core.resources import default_spec_path
from codegen.formats.spec import load_spec
from codegen.upstream import detect
from fake_tree import make_fake_tree, releases_line, snapshot, spec_variant

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spec():
    return load_spec(None)


def _cli(*args):
    return CliRunner().invoke(app, list(args))


# ------------------------------------------------------------------------------- the lock --

@pytest.mark.parametrize("content", ["[1,2,3]", "{not json", '{"lock_version": 1}', '"x"', ""])
def test_bad_lock_then_revert_is_one_message_and_nothing_changes(tmp_path, spec, content):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    (tree / LOCK_NAME).write_text(content)
    before = snapshot(tree)
    for cmd in (["revert", str(tree)], ["apply", str(tree)]):
        res = _cli(*cmd)
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output and "AttributeError" not in res.output
        assert "unreadable lock file" in res.stderr and res.stderr.count("unreadable lock file") == 1
        assert snapshot(tree) == before


def test_lock_is_typed_and_round_trips(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 0))
    apply_overlay(tree, spec)
    lock = read_lock(tree)
    assert lock.arch == spec.spec.arch and lock.files
    assert lock.to_bytes() == (tree / LOCK_NAME).read_bytes()  # one writer, one reader, same bytes
    created = [rel for rel, ent in lock.files.items() if ent.before is None]
    assert created == ["v3python/mi100_codegen_space.py"]
    assert json.loads((tree / LOCK_NAME).read_text())["files"][created[0]]["before"] is None


# ------------------------------------------------------------------------ plan, then commit --

def test_pretend_is_the_plan_of_a_real_apply(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    pretend = apply_overlay(tree, spec, pretend=True)
    real = apply_overlay(tree, spec)
    strip = lambda r: [(f.path, f.verdict, f.edits) for f in r.files]  # noqa: E731
    assert pretend.pretend and strip(pretend) == strip(real) and pretend.rows == real.rows
    plan = plan_apply(tree, detect(tree), spec, lambda m: None)  # the plan alone: all identical now
    assert {f.verdict for f in plan.result.files} == {"identical"} and not plan.result.changed


def test_anchor_conflicts_come_before_any_database_work_and_print_once(tmp_path, spec, monkeypatch):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 0))
    gt = tree / "v3python/gpu_targets.py"
    gt.write_text(gt.read_text().replace("    'gfx90a'     : 64,", "    'gfx90a' : 64,  # local"))
    before = snapshot(tree)

    def no_db(*a, **k):
        raise AssertionError("database work before the anchor check")

    monkeypatch.setattr(dbrows, "build_db", no_db)
    with pytest.raises(ApplyConflict):
        apply_overlay(tree, spec)
    res = _cli("apply", str(tree))
    assert res.exit_code == 2 and snapshot(tree) == before
    assert res.stderr.count("was changed locally") == 1, res.stderr
    assert "1 conflict (listed above)" in res.stderr


def test_ctrl_c_after_the_commit_point_finishes_the_swap(tmp_path, spec, monkeypatch):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    ref = make_fake_tree(tmp_path / "ref", (0, 12, 0))
    apply_overlay(ref, spec)
    real_run, calls = journal._run, {"n": 0}

    def interrupted(t, entries):
        calls["n"] += 1
        if calls["n"] == 1:
            real_run(t, entries[:2])
            raise KeyboardInterrupt
        return real_run(t, entries)

    monkeypatch.setattr(journal, "_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        apply_overlay(tree, spec)
    assert snapshot(tree) == snapshot(ref)  # fully applied, no journal left


def test_ctrl_c_is_exit_130_without_traceback(tmp_path, monkeypatch):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    before = snapshot(tree)

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(dbrows, "build_db", interrupt)  # during the plan: nothing written yet
    res = _cli("apply", str(tree))
    assert res.exit_code == 130 and "Traceback" not in res.output and "interrupted" in res.stderr
    assert snapshot(tree) == before


# ------------------------------------------------------------------- specs that do not fit --

def test_spec_for_other_releases_is_refused_with_the_list(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 0))
    p = spec_variant(tmp_path, **{releases_line(): "  releases: [0.12b, 0.11.2b]"})
    before = snapshot(tree)
    res = _cli("apply", str(tree), "--spec", str(p))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "AOTriton 0.11b" in res.stderr and "upstream.releases 0.12b, 0.11.2b" in res.stderr
    assert snapshot(tree) == before


def test_arch_llvm_does_not_know_is_a_spec_error(tmp_path):
    p = spec_variant(tmp_path, **{"arch: gfx908": "arch: gfx9999"})
    res = _cli("spec", "check", str(p))
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "'gfx9999' is not an AMDGPU target LLVM knows" in res.stderr
    line = next(n for n, l in enumerate(p.read_text().splitlines(), 1) if l.startswith("arch:"))
    assert f"variant.yaml:{line}:" in res.stderr


def test_arch_the_release_ships_is_refused_as_supported(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    text = default_spec_path().read_text().replace("gfx908", "gfx942").replace("0x908", "0x942")
    p = tmp_path / "gfx942.yaml"
    p.write_text(text)
    loaded = load_spec(p)
    before = snapshot(tree)
    with pytest.raises(UserError, match="AOTriton 0.12b already supports gfx942") as exc:
        apply_overlay(tree, loaded)
    assert "patched by something else" not in str(exc.value)
    assert snapshot(tree) == before


# ----------------------------------------------------------------- edits the tree already has --

def test_comment_on_a_cpp_anchor_line_is_refused(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    h = tree / "include/aotriton/util.h"
    line = "  GPU_AMD_ARCH_GFX90A_MOD0  = TRICAT(GpuVendor::kAMD,  0x90a, 0),"
    h.write_text(h.read_text().replace(line, line + "  // MI210"))
    before = snapshot(tree)
    with pytest.raises(ApplyConflict) as exc:
        apply_overlay(tree, spec)
    conflict = {f.path: f.detail for f in exc.value.result.conflicts}
    assert "include/aotriton/util.h:3: the anchor line carries a comment" in conflict["include/aotriton/util.h"]
    assert snapshot(tree) == before


def test_earlier_partial_patch_is_a_conflict_with_file_and_line(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    gt = tree / "v3python/gpu_targets.py"
    gt.write_text(gt.read_text().replace("    'gfx1100'    : 32,\n", "    'gfx1100'    : 32,\n    'gfx908'     : 32,\n"))
    before = snapshot(tree)
    with pytest.raises(ApplyConflict) as exc:
        apply_overlay(tree, spec)
    [c] = exc.value.result.conflicts
    assert c.path == "v3python/gpu_targets.py"
    n = gt.read_text().splitlines().index("    'gfx908'     : 32,") + 1
    assert f"line {n} already mentions gfx908" in c.detail
    assert snapshot(tree) == before


def test_tree_that_already_holds_exactly_our_edits_is_identical(tmp_path, spec):
    ref = make_fake_tree(tmp_path / "ref", (0, 12, 0))
    apply_overlay(ref, spec)
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    for rel in ("v3python/compile.py", "include/aotriton/util.h"):  # hand-patched exactly as we would
        (tree / rel).write_bytes((ref / rel).read_bytes())
    r = apply_overlay(tree, spec)
    verdicts = {e.id: (e.verdict, e.detail) for e in r.edits}
    assert verdicts["compile.known_targets"] == ("identical", "already in the upstream tree")
    assert "v3python/compile.py" not in read_lock(tree).files
    assert (tree / "v3python/compile.py").read_bytes() == (ref / "v3python/compile.py").read_bytes()
    revert_tree(tree)
    assert "gfx908" in (tree / "v3python/compile.py").read_text()  # it was the user's, not ours


# -------------------------------------------------------------------------- symbolic links --

def test_anchored_file_that_is_a_link_is_refused_and_stays_a_link(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    cc = tree / "v3src/util.cc"
    real = tree / "v3src/util.real.cc"
    cc.rename(real)
    cc.symlink_to("util.real.cc")
    before = snapshot(tree)
    res = _cli("apply", str(tree))
    assert res.exit_code == 2 and "is a symbolic link (v3src/util.cc -> util.real.cc)" in res.stderr
    assert cc.is_symlink() and snapshot(tree) == before


def test_applied_file_replaced_by_a_link_is_not_reverted_over(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    apply_overlay(tree, spec)
    cc = tree / "v3src/util.cc"
    (tree / "elsewhere.cc").write_bytes(cc.read_bytes())
    cc.unlink()
    cc.symlink_to("../elsewhere.cc")
    with pytest.raises(ApplyConflict, match="replaced by a symbolic link"):
        revert_tree(tree)
    assert cc.is_symlink()


# ----------------------------------------------------------------------------- revert --force --

def test_revert_force_says_which_local_changes_it_discards(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    apply_overlay(tree, spec)
    cc = tree / "v3src/util.cc"
    cc.write_text(cc.read_text() + "// my local fix\n")
    res = _cli("revert", str(tree), "--force", "--json")
    assert res.exit_code == 0, res.output
    files = {f["path"]: (f["verdict"], f["detail"]) for f in json.loads(res.stdout)["files"]}
    assert files["v3src/util.cc"] == ("restored", "discarded local changes: + '// my local fix'")
    assert "discarded local changes: + '// my local fix'" in res.stderr
    assert "my local fix" not in cc.read_text()


# ------------------------------------------------------------------------- the xz archives --

def test_database_archive_is_valid_xz_and_deterministic(tmp_path):
    payload = os.urandom(1 << 16) * 200 + b"tail"  # 12.5 MiB: 201 stored LZMA2 chunks, the last short
    a, b = tuning_db.write_archive("x.sqlite3", payload), tuning_db.write_archive("x.sqlite3", payload)
    assert a == b and tuning_db.read_archive(a, "a") == ("x.sqlite3", payload)
    p = tmp_path / "x.sqlite3.tar.xz"
    p.write_bytes(a)
    if shutil.which("xz"):
        assert subprocess.run(["xz", "-t", str(p)]).returncode == 0
    if shutil.which("cmake"):  # upstream's reader: `cmake -E tar xf` (libarchive)
        out = tmp_path / "out"
        out.mkdir()
        subprocess.run(["cmake", "-E", "tar", "xf", str(p)], cwd=out, check=True)
        assert (out / "x.sqlite3").read_bytes() == payload


def test_database_archive_refusals_are_one_message(tmp_path):
    """The one archive reader: a cut archive, one of two members, a member that is no database or
    would land outside the folder it is extracted to: one ArchiveError/Escape (exit 2), nothing written."""
    import io
    import sqlite3
    import tarfile

    from codegen.core.contain import Escape
    from codegen.formats.xzstore import xz_stored

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (a)")
    good = tuning_db.write_archive("t.sqlite3", conn.serialize())
    p = tmp_path / "t.sqlite3.tar.xz"
    p.write_bytes(good)
    assert tuning_db.open_archive(p).execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]
    assert tuning_db.extract_archive(p, tmp_path / "out") == tmp_path / "out" / "t.sqlite3"
    two = io.BytesIO()
    with tarfile.open(fileobj=two, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name in ("a.sqlite3", "b.sqlite3"):
            t.addfile(tarfile.TarInfo(name))
    for data, why in ((good[:100], "not a readable .tar.xz"), (xz_stored(two.getvalue()), "found 2"),
                      (tuning_db.write_archive("t.sqlite3", b"not sqlite" * 100), "not a sqlite database")):
        p.write_bytes(data)
        with pytest.raises(tuning_db.ArchiveError, match=why) as exc:
            tuning_db.open_archive(p)
        assert exc.value.exit_code == 2
    p.write_bytes(tuning_db.write_archive("../escape.sqlite3", b"x"))
    with pytest.raises(Escape):
        tuning_db.extract_archive(p, tmp_path / "out2")
    assert not (tmp_path / "escape.sqlite3").exists() and not (tmp_path / "out2").exists()


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65537, 3 * 65536 + 5])
def test_stored_xz_frames_every_size(tmp_path, size):
    """Stored LZMA2 chunks are at most 64 KiB: the chunk boundaries, an empty payload and a short
    last chunk all decode with liblzma (Python) and the xz tool, and the file is barely larger."""
    import lzma

    from codegen.formats.xzstore import xz_stored

    data = os.urandom(size)
    x = xz_stored(data)
    assert lzma.decompress(x, format=lzma.FORMAT_XZ) == data
    assert len(x) - len(data) <= 64 + 3 * (size // 65536 + 1)
    if shutil.which("xz"):
        p = tmp_path / "x.xz"
        p.write_bytes(x)
        assert subprocess.run(["xz", "-t", str(p)]).returncode == 0


def test_database_tar_is_byte_for_byte_what_tarfile_writes():
    """tar_bytes builds the one-member tar in one copy; it is tarfile's GNU output exactly."""
    import io
    import tarfile

    for size in (0, 1, 511, 512, 513, 10240, 12345, 1 << 16):
        payload = os.urandom(size)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
            ti = tarfile.TarInfo("x.sqlite3")
            ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o644, 0, 0, "", ""
            t.addfile(ti, io.BytesIO(payload))
        assert tuning_db.tar_bytes("x.sqlite3", payload) == buf.getvalue(), size


def test_render_does_not_import_the_apply_engine():
    code = ("import sys; import codegen.render.overlay, codegen.render.inputs; "
            "bad = [m for m in ('libcst', 'codegen.apply', 'codegen.compile', 'codegen.formats.tuning_csv') "
            "if m in sys.modules and m != 'codegen.formats.tuning_csv']; "
            "assert not bad, bad; "
            "assert not any(m.startswith('codegen.compile') for m in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    code = "import sys, codegen.render.overlay; assert 'codegen.formats.tuning_csv' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr


# ----------------------------------------------------------------------- on the real trees --

@pytest.mark.aotriton
@pytest.mark.parametrize("tag", ["0.11b", "0.12b"])
def test_real_tree_refusals_come_first_and_change_nothing(fresh_tree, tmp_path, tag):
    tree = fresh_tree(tag)
    before = snapshot(tree)
    h = tree / "include/aotriton/util.h"
    text = h.read_text()
    line = "  GPU_AMD_ARCH_GFX90A_MOD0  = TRICAT(GpuVendor::kAMD,  0x90a, 0),"
    h.write_text(text.replace(line, line + " // local note"))
    res = _cli("apply", str(tree))
    assert res.exit_code == 2 and "the anchor line carries a comment" in res.stderr
    assert res.stderr.count("the anchor line carries a comment") == 1
    h.write_text(text)
    gt = tree / "v3python/compile.py"
    gtext = gt.read_text()
    gt.write_text(gtext.replace("KNOWN_TARGETS_64 = ['gfx90a',", "KNOWN_TARGETS_64 = ['gfx908', 'gfx90a', 'gfx908',"))
    res = _cli("apply", str(tree))
    assert res.exit_code == 2 and "v3python/compile.py" in res.stderr and "already mentions gfx908" in res.stderr
    gt.write_text(gtext)
    res = _cli("apply", str(tree), "--spec", str(spec_variant(tmp_path, **{
        releases_line(): "  releases: [0.11.1b]"})))
    assert res.exit_code == 2 and f"AOTriton {tag}, but" in res.stderr and "0.11.1b" in res.stderr
    assert snapshot(tree) == before


@pytest.mark.aotriton
def test_real_tree_link_kept_and_gfx942_refused(fresh_tree, tmp_path):
    tree = fresh_tree("0.12b")
    cc = tree / "v3src/util.cc"
    shutil.move(cc, tree / "util.cc.orig")
    cc.symlink_to("../util.cc.orig")
    res = _cli("apply", str(tree))
    assert res.exit_code == 2 and "is a symbolic link" in res.stderr and cc.is_symlink()
    cc.unlink()
    shutil.move(tree / "util.cc.orig", cc)
    p = tmp_path / "gfx942.yaml"
    p.write_text(default_spec_path().read_text().replace("gfx908", "gfx942"))
    before = snapshot(tree)
    res = _cli("apply", str(tree), "--spec", str(p))
    assert res.exit_code == 2 and "AOTriton 0.12b already supports gfx942" in res.stderr
    assert snapshot(tree) == before


def test_second_apply_reuses_and_revert_loads_no_engine(tmp_path, spec):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 2))
    apply_overlay(tree, spec)
    applied = snapshot(tree)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    again = ("import sys; from codegen.apply.engine import apply_overlay; from codegen.formats.spec import load_spec; "
             "r = apply_overlay(sys.argv[1], load_spec(None)); "
             "assert not r.changed and {f.verdict for f in r.files} == {'identical'}, r.files; "
             "assert 'libcst' not in sys.modules, 'a second apply re-parsed a file'")
    proc = subprocess.run([sys.executable, "-c", again, str(tree)], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert snapshot(tree) == applied
    back = ("import sys; from codegen.apply.revert import revert_tree; revert_tree(sys.argv[1]); "
            "bad = [m for m in ('libcst', 'sqlite3', 'jinja2', 'codegen.render.overlay', 'codegen.apply.engine') "
            "if m in sys.modules]; assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", back, str(tree)], cwd=REPO, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not (tree / LOCK_NAME).exists()
