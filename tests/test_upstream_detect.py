"""Release detection and adapter choice (fast synthetic trees + real release trees)."""

from __future__ import annotations

import pytest

from fake_tree import make_fake_tree
from codegen.errors import UserError
from codegen.upstream import ADAPTERS, SUPPORTED_RELEASES, UnsupportedTree, detect, release_name

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
}


def test_supported_releases_table():
    assert SUPPORTED_RELEASES == ("0.10b", "0.11b", "0.11.1b", "0.11.2b", "0.12b", "0.12.1b", "0.13b")
    assert release_name((0, 11, 0)) == "0.11b" and release_name((0, 11, 2)) == "0.11.2b"
    assert ADAPTERS[(0, 12, 0)].shard_path("gfx908", "attn_fwd") == \
        "v3python/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz"
    a13 = ADAPTERS[(0, 13, 0)]
    assert a13.shard_path("gfx908", "attn_fwd") == "modules/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz"
    assert (a13.layout, a13.generator_module, a13.db_compose_module, a13.package_dir) == \
        ("aotriton-python", "aotriton.generate", "aotriton.database_compose", "python")


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
    with pytest.raises(UnsupportedTree, match=r"0\.9b is not supported; supported releases: 0\.10b, 0\.11b"):
        detect(t)
    cm.write_text(cm.read_text().replace("MINOR_INT 9", "MINOR_INT 14"))
    with pytest.raises(UnsupportedTree, match=r"0\.14b is not supported; supported releases: 0\.10b, .*0\.13b$"):
        detect(t)


def test_other_layout_files_refused(tmp_path):
    """A tree that says 0.12b but holds the python/ + modules/ layout (or the reverse) is not the
    release it claims."""
    t = make_fake_tree(tmp_path / "t", (0, 12, 0))
    (t / "python").mkdir()
    (t / "python" / "generate.py").write_text("")
    with pytest.raises(UnsupportedTree, match=r"says AOTriton 0\.12b .*has python/generate\.py: another layout"):
        detect(t)
    cm = t / "CMakeLists.txt"
    cm.write_text(cm.read_text().replace("MINOR_INT 12", "MINOR_INT 13"))
    with pytest.raises(UnsupportedTree, match=r"says AOTriton 0\.13b .*missing: .*python/gpu_targets\.py"):
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


def test_python_layout_overlay_module_and_edits():
    """0.13b's layout: the module sits where the kdesc hook's relative import finds it, imports
    Config from aotriton.autotune, and every edit names a 0.13b path; the head-dims edit targets
    the env read inside block_dmodel_values()."""
    from codegen.overlay_inputs import render_overlay
    from codegen.spec import load_spec

    ov = render_overlay(load_spec(None), ADAPTERS[(0, 13, 0)].layout)
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
