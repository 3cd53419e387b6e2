"""A sample compile per supported release, in the default run (marked aotriton, triton; not slow):
the overlay applied to a fresh tree of each release, then `precompile --sample 2`, a real Triton
cross-compile for gfx908 of two of the kernels the tree's own generator plans. The full default
set stays behind `slow` (tests/test_precompile_cli.py and the docs' measured runs)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.compile.cache import source_hash
from codegen.upstream import SUPPORTED_RELEASES, kernel_source_dir

pytestmark = [pytest.mark.aotriton, pytest.mark.triton]


@pytest.mark.parametrize("tag", SUPPORTED_RELEASES)
def test_sample_compile_per_release(fresh_tree, tmp_path, tag):
    for mod in ("pandas", "triton"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"needs {mod} in this Python")
    from codegen.apply.engine import apply_overlay
    from codegen.formats.spec import load_spec

    tree = fresh_tree(tag)
    apply_overlay(tree, load_spec(None))
    report = tmp_path / "r.json"
    # this Python's Triton (the test's subject is each release, not the build venv)
    result = CliRunner().invoke(app, ["precompile", str(tree), "--sample", "2", "--jobs", "2", "--no-cache",
                                      "--json", str(report), "--python", sys.executable])
    assert result.exit_code == 0, result.output
    rep = json.loads(report.read_text())
    run = rep["run"]
    assert (run["release"], run["arch"], run["gpu"]) == (tag, "gfx908", "gfx908_mod0")
    assert run["sampled"] == 2 and run["planned"] > 1000 and run["compiled_now"] == 2
    assert rep["totals"]["failed"] == 0
    for k in rep["kernels"]:
        assert k["status"] == "ok" and ".gfx908." in k["config"], k
        assert k["resources"]["vgprs"] > 0 and 1 <= k["occupancy"] <= 10


def test_point_and_layout_releases_share_compile_cache_entries(pristine_tree):
    """0.12b, 0.12.1b and 0.13b ship byte-identical kernel files (0.13b under a new folder, beside
    fewer tests and tools): the cache key hashes each kernel's import closure, so a kernel compiled
    for one of them is a cache hit for the others; the older 0.11.2b kernels differ."""
    kernels = {"attn_fwd": "fwd_kernel", "bwd_kernel_dk_dv": "bwd_kernel_dk_dv", "bwd_kernel_dq": "bwd_kernel_dq",
               "bwd_kernel_fuse": "bwd_kernel_fuse", "bwd_preprocess": "bwd_preprocess"}
    by_release = {}
    for tag in ("0.11.2b", "0.12b", "0.12.1b", "0.13b"):
        folder = kernel_source_dir(pristine_tree(tag))
        # 0.12b/0.12.1b plan every kernel from the re-exporting flash.py, 0.13b from its own file
        entry = {k: folder / ("flash.py" if (folder / "flash.py").is_file() and tag != "0.13b" else f"{m}.py")
                 for k, m in kernels.items()}
        by_release[tag] = [source_hash(str(entry[k]), k) for k in kernels]
    assert by_release["0.12b"] == by_release["0.12.1b"] == by_release["0.13b"]
    assert len(set(by_release["0.13b"])) == len(kernels)  # each kernel its own closure
    assert by_release["0.11.2b"] != by_release["0.12b"]
