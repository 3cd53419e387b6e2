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
}


def test_supported_releases_table():
    assert SUPPORTED_RELEASES == ("0.10b", "0.11b", "0.11.1b", "0.11.2b", "0.12b", "0.12.1b")
    assert release_name((0, 11, 0)) == "0.11b" and release_name((0, 11, 2)) == "0.11.2b"
    assert ADAPTERS[(0, 12, 0)].shard_path("gfx908", "attn_fwd") == \
        "v3python/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz"


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
    cm.write_text(cm.read_text().replace("MINOR_INT 9", "MINOR_INT 13"))
    (t / "python").mkdir()
    (t / "python" / "generate.py").write_text("")
    with pytest.raises(UnsupportedTree, match=r"0\.13b uses the python/ \+ modules/ layout.*0\.12\.1b$"):
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
def test_detect_refuses_013b(pristine_tree):
    with pytest.raises(UnsupportedTree, match="0.13b uses the python/ \\+ modules/ layout"):
        detect(pristine_tree("0.13b"))
