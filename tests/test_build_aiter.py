"""The offline aiter stand-in (`build --aiter-stand-in`, codegen.imagebuild.aiter) on real release trees:
the record's `aiter_archs` are what each tree declares, the stand-in carries the tag the tree's CMake
checks, and hostile inputs (a tag file that is not a tag, a link in the build folder) are refused."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from codegen.imagebuild.aiter import MARKER, aiter_tag, place_stand_in
from codegen.core.contain import Escape
from codegen.core.errors import UserError
from codegen.upstream import detect

pytestmark = pytest.mark.aotriton
CLONING = ("0.12b", "0.12.1b", "0.13b", "0.14.0-dev")
_DECL = re.compile(r"(?:SUPPORTED_ARCH\s*=\s*|@ati\.affine\.arch\()\[([^\]]*)\]")


def _declared_archs(tree: Path) -> set[str]:
    """Every arch an aiter kernel of the tree declares (0.12b's SUPPORTED_ARCH, 0.13b's decorator)."""
    archs: set[str] = set()
    for p in tree.rglob("aiter_*.py"):
        for m in _DECL.finditer(p.read_text(errors="replace")):
            archs |= set(re.findall(r"gfx[0-9a-z]+", m.group(1)))
    return archs


@pytest.mark.parametrize("tag", CLONING)
def test_the_record_names_the_archs_the_tree_declares(pristine_tree, tag):
    tree = pristine_tree(tag)
    rel = detect(tree)
    assert rel.clones_aiter
    assert _declared_archs(tree) == set(rel.aiter_archs)
    assert re.match(r"^v\d+\.\d+\.\d+$", aiter_tag(tree, rel))


def test_the_stand_in_carries_the_tag_cmake_checks(pristine_tree, tmp_path):
    tree = pristine_tree("0.13b")
    rel = detect(tree)
    build = tmp_path / "build"
    assert place_stand_in(tree, build, rel, "gfx908") == "placed"
    repo = build / "v3src" / "aiter"
    head = subprocess.run(["git", "describe", "--tags", "--exact-match", "HEAD"], cwd=repo,
                          capture_output=True, text=True, check=True).stdout.strip()
    assert head == aiter_tag(tree, rel)
    assert (repo / MARKER).is_file()
    assert not [p for p in repo.parent.iterdir() if p.name.startswith(".aiter-stand-in-")]
    assert place_stand_in(tree, build, rel, "gfx908") == "kept: stand-in"   # re-running is safe
    (repo / MARKER).unlink()
    assert place_stand_in(tree, build, rel, "gfx908") == "kept: a clone"    # never replaces a clone


def test_refused_where_it_would_change_the_build(pristine_tree, tmp_path):
    tree = pristine_tree("0.13b")
    with pytest.raises(UserError, match="needs the real clone"):
        place_stand_in(tree, tmp_path / "b", detect(tree), "gfx942")
    old = pristine_tree("0.11b")
    with pytest.raises(UserError, match="clones no aiter"):
        place_stand_in(old, tmp_path / "b", detect(old), "gfx908")
    assert not (tmp_path / "b").exists()


def test_hostile_tag_file_and_build_folder(fresh_tree, tmp_path):
    tree = fresh_tree("0.13b")
    rel = detect(tree)
    (tree / rel.aiter_tag_file).write_text("v1\n--upload-pack=touch /tmp/x\n")
    with pytest.raises(UserError, match="not a tag name"):
        place_stand_in(tree, tmp_path / "b", rel, "gfx908")
    (tree / rel.aiter_tag_file).unlink()
    os.mkfifo(tree / rel.aiter_tag_file)
    with pytest.raises(UserError):
        place_stand_in(tree, tmp_path / "b", rel, "gfx908")
    (tree / rel.aiter_tag_file).unlink()
    (tree / rel.aiter_tag_file).write_text("v0.1.11\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "v3src").symlink_to(outside)
    with pytest.raises(Escape):
        place_stand_in(tree, tmp_path / "b", rel, "gfx908")
    assert list(outside.iterdir()) == []


def test_the_cli_refuses_before_any_work(fresh_tree, tmp_path):
    """`build --aiter-stand-in` on a release that clones no aiter: exit 2 before the build venv,
    the toolchain check or the build folder."""
    from typer.testing import CliRunner

    from codegen.cli import app

    tree = fresh_tree("0.11b")
    assert CliRunner().invoke(app, ["apply", str(tree)]).exit_code == 0
    r = CliRunner().invoke(app, ["build", str(tree), "--prefix", str(tmp_path / "p"), "--build-dir",
                                 str(tmp_path / "b"), "--aiter-stand-in"])
    assert r.exit_code == 2 and "clones no aiter" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "b").exists() and not (tmp_path / "p").exists()
