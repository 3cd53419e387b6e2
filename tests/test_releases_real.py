"""Releases newer than the adapter table, on real trees: a copy of 0.13b (the newest supported
release) that claims 0.14.0 in its CMake version lines, as upstream's development branch does.
Every stage that takes a tree refuses them with one message naming the supported releases, exit 2,
and writes nothing (not in the tree, not the build prefix)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fake_tree import snapshot
from codegen.cli import app
from codegen.upstream import SUPPORTED_RELEASES, read_version

pytestmark = pytest.mark.aotriton

# (stage argv before the tree, argv after it); each must refuse before doing any work.
STAGES = (
    ("apply",),
    ("plan",),
    ("precompile", "--sample", "2", "--no-cache"),
    ("build", "--noimage", "--prefix", "{prefix}"),
    ("revert",),  # never applied: not "nothing to revert" (exit 0) but the same refusal
)


def _claiming(src: Path, dest: Path, minor: int) -> Path:
    """A copy of `src` whose CMake version lines say 0.<minor>.0."""
    shutil.copytree(src, dest, symlinks=True)
    cm = dest / "CMakeLists.txt"
    text, n = re.subn(r"(set\(AOTRITON_VERSION_MINOR_INT )\d+\)", rf"\g<1>{minor})", cm.read_text())
    assert n == 1
    cm.write_text(text)
    assert read_version(dest) == (0, minor, 0)
    return dest


def test_newer_release_refused_by_every_stage(pristine_tree, tmp_path):
    tree = _claiming(pristine_tree("0.13b"), tmp_path / "aotriton-dev", 14)
    shown = "0.14b"
    before = snapshot(tree)
    prefix = tmp_path / "prefix"
    for stage in STAGES:
        argv = [stage[0], str(tree), *(a.replace("{prefix}", str(prefix)) for a in stage[1:])]
        res = CliRunner().invoke(app, argv)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2, (argv, res.output)
        assert len(lines) == 1, (argv, res.stderr)
        assert f"AOTriton {shown} " in lines[0], lines[0]
        assert lines[0].endswith("supported releases: " + ", ".join(SUPPORTED_RELEASES)), lines[0]
        assert "Traceback" not in res.output
        assert res.stdout == "", (argv, res.stdout)
        assert snapshot(tree) == before, argv
        assert not prefix.exists(), argv
