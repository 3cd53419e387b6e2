"""Release detection and adapter choice (fast synthetic trees + real release trees)."""

from __future__ import annotations

import pytest

from fake_tree import make_fake_tree
from codegen.core.errors import UserError
from codegen.upstream import SUPPORTED_RELEASES, UnsupportedTree, by_release, detect, release_name
from codegen.upstream.releases import RELEASES

EXPECTED = {
    "0.10b": ("v3python-central-db", "central", "v3python/rules/tuning_database.sqlite3.tar.xz", None),
    "0.11b": ("v3python-central-db", "central", "v3python/rules/tuning_database.sqlite3.tar.xz",
              "v3python/rules/op_database.sqlite3.tar.xz"),
    "0.11.1b": ("v3python-sharded-db", "sharded", "v3python/database/tuning_database.sqlite3.tar.xz",
                "v3python/database/op_database.sqlite3.tar.xz"),
    "0.11.2b": ("v3python-sharded-db", "sharded", "v3python/database/tuning_database.sqlite3.tar.xz",
                "v3python/database/op_database.sqlite3.tar.xz"),
    "0.12b": ("v3python-sharded-db", "sharded", "v3python/database/tuning_database.sqlite3.tar.xz",
              "v3python/database/op_database.sqlite3.tar.xz"),
    "0.12.1b": ("v3python-sharded-db", "sharded", "v3python/database/tuning_database.sqlite3.tar.xz",
                "v3python/database/op_database.sqlite3.tar.xz"),
    "0.13b": ("aotriton-python", "sharded", "modules/database/tuning_database.sqlite3.tar.xz",
              "modules/database/op_database.sqlite3.tar.xz"),
    "0.14.0-dev": ("aotriton-modular", "sharded", "modules/flash/database/tuning_database.sqlite3.tar.xz",
                   "modules/flash/database/op_database.sqlite3.tar.xz"),
}


def test_supported_releases_table():
    assert SUPPORTED_RELEASES == ("0.10b", "0.11b", "0.11.1b", "0.11.2b", "0.12b", "0.12.1b", "0.13b", "0.14.0-dev")
    assert release_name((0, 11, 0)) == "0.11b" and release_name((0, 11, 2)) == "0.11.2b"
    assert by_release("0.12b").shard_path("gfx908", "attn_fwd") == \
        "v3python/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz"
    a13 = by_release("0.13b")
    assert a13.shard_path("gfx908", "attn_fwd") == "modules/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz"
    assert (a13.layout, a13.generator_module, a13.db_compose_module, a13.package_dir) == \
        ("aotriton-python", "aotriton.generate", "aotriton.database_compose", "python")
    dev = by_release("0.14.0-dev")
    assert dev.shard_path("gfx908", "attn_fwd") == "modules/flash/database/amd/gfx908/attn_fwd.sqlite3.tar.xz"
    assert (dev.layout, dev.build_db_dir, dev.snapshot, dev.library, dev.torch_lines) == \
        ("aotriton-python", "flash/database", True, "libaotriton_v2.so.0.14.0", ())
    assert dev.label == "0.14.0-dev (main at 30ae967, not a release)"


def test_record_table():
    """One record per release: names and versions unique, supported ones have layout traits, a
    tag's commit and tree ids are full ids, a snapshot is named <version>-dev."""
    names = [r.release for r in RELEASES]
    assert len(set(names)) == len(names)
    for r in RELEASES:
        if not r.supported:
            assert not r.id and r.torch_lines, r.release
            continue
        assert r.id and r.layout and r.required_files and r.shipped_archs, r.release
        assert r.commit and len(r.commit) == 40, r.release
        if r.snapshot:
            assert r.release == ".".join(map(str, r.version)) + "-dev" and r.tree is None
        else:
            assert release_name(r.version) == r.release and len(r.tree) == 40, r.release
    assert len({r.version for r in RELEASES if r.supported and not r.snapshot}) == \
        len([r for r in RELEASES if r.supported and not r.snapshot])


def test_records_match_the_archive_tags():
    """The shared archive's TAGS (tag, commit, date) and the records agree."""
    from conftest import release_archive

    archive = release_archive()
    if archive is None or not (archive.parent / "TAGS").is_file():
        pytest.skip("no shared archive TAGS file")
    for line in (archive.parent / "TAGS").read_text().split("\n"):
        if not line.strip():
            continue
        tag, commit, date = line.split()[:3]
        rec = by_release(tag[5:-1] if tag.startswith("main(") else tag)
        assert (rec.commit, rec.date, rec.snapshot) == (commit, date, tag.startswith("main(")), tag


@pytest.mark.parametrize("version", [(0, 10, 0), (0, 11, 0), (0, 11, 1), (0, 12, 0), (0, 12, 1)])
def test_detect_fake_trees(tmp_path, version):
    a = detect(make_fake_tree(tmp_path / "t", version))
    assert a.version == version and a.layout == "v3python"
    assert a.tuning_db_layout == ("central" if version < (0, 11, 1) else "sharded")
    assert issubclass(UnsupportedTree, UserError)


def test_unknown_and_newer_releases_refused(tmp_path):
    t = make_fake_tree(tmp_path / "t", (0, 12, 0))
    cm = t / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace("MINOR_INT 12", "MINOR_INT 9"))
    with pytest.raises(UnsupportedTree, match=r"AOTriton 0\.9\.0 \(as its CMakeLists\.txt says\) is not supported; "
                                              r"supported releases: 0\.10b, 0\.11b"):
        detect(t)
    cm.write_text(cm.read_text().replace("MINOR_INT 9", "MINOR_INT 15"))
    with pytest.raises(UnsupportedTree, match=r"0\.15\.0 .*is not supported; supported releases: 0\.10b, .*0\.14\.0-dev$"):
        detect(t)
    # 0.14.0 is known, as a snapshot of main in the modular layout: an old layout claiming it is not it
    cm.write_text(cm.read_text().replace("MINOR_INT 15", "MINOR_INT 14"))
    with pytest.raises(UnsupportedTree, match=r"says AOTriton 0\.14\.0 but is not 0\.14\.0-dev \(main at 30ae967, "
                                              r"not a release\) \(missing: .*modules/flash/database/"):
        detect(t)


def test_other_layout_files_refused(tmp_path):
    """A tree that says 0.12b but holds the python/ + modules/ layout (or the reverse) is not the
    release it claims."""
    t = make_fake_tree(tmp_path / "t", (0, 12, 0))
    (t / "python").mkdir()
    (t / "python" / "generate.py").write_text("")
    with pytest.raises(UnsupportedTree, match=r"says AOTriton 0\.12\.0 .*has python/generate\.py: another layout"):
        detect(t)
    cm = t / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace("MINOR_INT 12", "MINOR_INT 13"))
    with pytest.raises(UnsupportedTree, match=r"says AOTriton 0\.13\.0 .*missing: .*python/gpu_targets\.py"):
        detect(t)


def test_not_a_tree_and_mangled_tree_refused(tmp_path):
    with pytest.raises(UnsupportedTree, match="not an AOTriton source tree"):
        detect(tmp_path)
    t = make_fake_tree(tmp_path / "t", (0, 11, 1))
    (t / "v3python" / "database_compose.py").unlink()
    with pytest.raises(UnsupportedTree, match="modified beyond recognition"):
        detect(t)


@pytest.mark.aotriton
@pytest.mark.parametrize("tag", sorted(EXPECTED))
def test_detect_real_releases(pristine_tree, tag):
    a = detect(pristine_tree(tag))
    assert a.release == tag
    assert (a.id, a.tuning_db_layout, a.tuning_db, a.op_db) == EXPECTED[tag]


@pytest.mark.aotriton
def test_detect_013b_python_layout(pristine_tree):
    tree = pristine_tree("0.13b")
    a = detect(tree)
    assert a.layout == "aotriton-python"
    assert not (tree / a.shard_root / "gfx908").exists()
    assert (tree / a.shard_root / "gfx90a" / "flash" / "attn_fwd.sqlite3.tar.xz").is_file()


@pytest.mark.aotriton
def test_detect_main_snapshot_by_layout(pristine_tree, tmp_path):
    """main (0.14.0-dev) is recognised by its layout: DB shards in one folder per family
    (modules/flash/database/amd/<arch>/<kernel>), C++ under modules/flash/csrc, no v3python/ or
    tritonsrc/, and the varlen API it still has. A tree of the same version whose API moved on
    (0.14b's VarlenBits), or in 0.13b's layout, is refused: a later 0.14 tag needs a re-check."""
    import shutil

    tree = pristine_tree("0.14.0-dev")
    a = detect(tree)
    assert (a.release, a.id, a.version) == ("0.14.0-dev", "aotriton-modular", (0, 14, 0))
    assert (tree / a.shard_root / "gfx90a" / "attn_fwd.sqlite3.tar.xz").is_file()
    assert {"gfx1150", "gfx1151"} <= {d.name for d in (tree / a.shard_root).iterdir()}
    assert not (tree / "v3python").exists() and not (tree / "tritonsrc").exists()
    newer = tmp_path / "newer"
    shutil.copytree(tree, newer, symlinks=True)
    h = newer / "include" / "aotriton" / "flash.h"
    h.write_text(h.read_text().replace("struct AOTRITON_API VarlenType", "struct AOTRITON_API VarlenBits"))
    with pytest.raises(UnsupportedTree, match=r"says AOTriton 0\.14\.0 but is not 0\.14\.0-dev .*"
                                              r"lacks 'struct AOTRITON_API VarlenType'.*has 'VarlenBits'"):
        detect(newer)


def test_python_layout_overlay_module_and_edits():
    """0.13b's layout: the module sits where the kdesc hook's relative import finds it, imports
    Config from aotriton.autotune, and every edit names a 0.13b path; the head-dims edit targets
    the env read inside block_dmodel_values()."""
    from codegen.render.inputs import render_overlay
    from codegen.formats.spec import load_spec

    ov = render_overlay(load_spec(None), by_release("0.13b").layout)
    module = ov.files["tree/" + ov.module_dest].content.decode()
    assert ov.module_dest == "python/template_instantiation/mi100_codegen_space.py"
    assert "\nfrom aotriton.autotune import Config\n" in module
    hook = next(e for e in ov.edits if e.id == "kdesc.tuning_space_hook")
    assert hook.path == "python/template_instantiation/ir/kdesc.py"
    assert hook.payload["lines"][0].startswith("from ..mi100_codegen_space import ")
    hd = next(e for e in ov.edits if e.id == "op_attn_fwd.head_dims")
    assert (hd.path, hd.op, hd.symbol, hd.payload) == (
        "modules/flash/aot/_common.py", "python.set_getenv_default_in_function", "block_dmodel_values", "'32, 64'")
    assert all(e.path.startswith(("python/", "modules/", "include/", "v3src/", "CMakeLists.txt")) for e in ov.edits)
    assert not any(e.path.startswith("v3python/") for e in ov.edits)
