"""`mi100-codegen precompile` and scripts/bench_precompile.py end to end on a real applied tree
(marked aotriton, triton, slow: a few minutes on 2 cores)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app

pytestmark = pytest.mark.aotriton
BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench_precompile.py"


def _applied(fresh_tree, tag: str):
    for mod in ("pandas", "triton"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"needs {mod} in this Python")
    try:
        from codegen.apply.engine import apply_overlay
    except ImportError as exc:
        pytest.skip(f"codegen.apply is not importable yet ({exc})")
    from codegen.formats.spec import load_spec

    tree = fresh_tree(tag)
    apply_overlay(tree, load_spec(None))
    return tree


def test_bench_refuses_like_the_cli(pristine_tree):
    """The developers' benchmark is a script now (issue 37 item 6): a tree without the overlay is
    one line, exit 2, as precompile says it."""
    r = subprocess.run([sys.executable, str(BENCH), str(pristine_tree("0.12b")), "--python", sys.executable],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "mi100-codegen apply" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_precompile_refuses_tree_without_overlay(pristine_tree, tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    result = CliRunner().invoke(app, ["precompile", str(pristine_tree("0.12b")), "--sample", "2",
                                      "--cache-dir", str(tmp_path)])
    assert result.exit_code == 2 and "mi100-codegen apply" in result.output


@pytest.mark.triton
@pytest.mark.slow
def test_precompile_sample_end_to_end(fresh_tree, tmp_path):
    tree = _applied(fresh_tree, "0.11b")
    out = tmp_path / "out"
    args = ["precompile", str(tree), "--sample", "9", "--jobs", "2", "--cache-dir", str(tmp_path / "cache"),
            "--json", str(out / "r.json"), "--md", str(out / "r.md"), "--keep", str(out / "keep"),
            "--tuning-report", str(out / "compile_report.json"), "--prune-to", str(out / "pruned.yaml"),
            "--python", sys.executable]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rep = json.loads((out / "r.json").read_text())
    assert rep["run"]["sampled"] == 9 and rep["run"]["planned"] > 1000 and rep["run"]["compiled_now"] == 9
    fams = {k["family"] for k in rep["kernels"]}
    assert {"attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_preprocess"} <= fams
    assert {k["dtype"] for k in rep["kernels"]} == {"fp16", "bf16", "fp32"}
    assert {k["head_dim"] for k in rep["kernels"]} >= {32, 64}
    for k in rep["kernels"]:
        assert k["status"] == "ok", k
        assert k["resources"]["vgprs"] > 0 and 1 <= k["occupancy"] <= 10
        if k["family"] in ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse"):
            assert k["resources"]["mfma"] > 0
    assert len(list((out / "keep").rglob("*.hsaco"))) == 9
    assert "## By config" in (out / "r.md").read_text()
    cr = json.loads((out / "compile_report.json").read_text())
    assert cr["arch"] == "gfx908" and len(cr["configs"]) == len(rep["by_config"])
    from codegen.formats.spec import load_spec

    load_spec(out / "pruned.yaml")  # still a valid spec
    again = CliRunner().invoke(app, args)  # all from the persistent cache
    assert again.exit_code == 0
    assert json.loads((out / "r.json").read_text())["run"]["from_cache"] == 9


@pytest.mark.triton
@pytest.mark.slow
def test_bench_compares_both_compilers(fresh_tree):
    tree = _applied(fresh_tree, "0.12b")
    result = subprocess.run([sys.executable, str(BENCH), str(tree), "--sample", "3", "--jobs", "2", "--json",
                             "--python", sys.executable], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    res = json.loads(result.stdout)
    assert res["sample"] == 3 and res["upstream"]["ok"] == 3 and res["precompile"]["ok"] == 3
    assert res["ratio"] > 0 and res["cpu_ratio"] > 0


@pytest.mark.triton
@pytest.mark.slow
def test_precompile_creates_and_uses_the_build_venv(fresh_tree, tmp_path, monkeypatch):
    """No --python: a real build venv (pip install of the spec's Triton, ~250 MB from PyPI or your
    pip configuration's wheels) is created under $MI100_CODEGEN_CACHE, compiles, and is reused."""
    from codegen.toolchain import installed_triton_version
    from codegen.toolchain.venv import cached_venvs

    tree = _applied(fresh_tree, "0.11b")
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    before = installed_triton_version()
    args = ["precompile", str(tree), "--sample", "2", "--jobs", "2", "--no-cache", "--json", str(tmp_path / "r.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (made,) = cached_venvs(tmp_path / "cache" / "toolchain")
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["run"]["triton"] == made.triton and rep["totals"]["failed"] == 0
    assert "from build venv" in result.stderr and installed_triton_version() == before
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "creating a build venv" not in again.stderr
