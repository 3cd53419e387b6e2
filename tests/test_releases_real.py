"""Trees newer than the record table, on real trees: a copy of main (0.14.0-dev, the newest known
tree) that claims 0.15.0 in its CMake version lines (an unknown version), and a copy of 0.13b that
claims 0.14.0 (a known version in a layout its record does not have: what a newer tree of the same
version looks like). Every stage that takes a tree refuses them with one message naming the
supported releases, exit 2, and writes nothing (not in the tree, not the build prefix)."""

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


# (source release, the minor version it is made to claim, what the one line says)
CASES = (
    ("0.14.0-dev", 15, "AOTriton 0.15.0 (as its CMakeLists.txt says) is not supported; "),
    ("0.13b", 14, "says AOTriton 0.14.0 but is not 0.14.0-dev (main at 30ae967, not a release) (missing: "),
)


@pytest.mark.parametrize("src,minor,says", CASES, ids=["unknown-version", "unknown-layout"])
def test_newer_tree_refused_by_every_stage(pristine_tree, tmp_path, src, minor, says):
    tree = _claiming(pristine_tree(src), tmp_path / "aotriton-dev", minor)
    before = snapshot(tree)
    prefix = tmp_path / "prefix"
    for stage in STAGES:
        argv = [stage[0], str(tree), *(a.replace("{prefix}", str(prefix)) for a in stage[1:])]
        res = CliRunner().invoke(app, argv)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2, (argv, res.output)
        assert len(lines) == 1, (argv, res.stderr)
        assert says in lines[0], lines[0]
        assert lines[0].endswith("supported releases: " + ", ".join(SUPPORTED_RELEASES)), lines[0]
        assert "Traceback" not in res.output
        assert res.stdout == "", (argv, res.stdout)
        assert snapshot(tree) == before, argv
        assert not prefix.exists(), argv
