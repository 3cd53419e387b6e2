"""`mi100-codegen validate` for real on a GPU (ROCm: AOTriton; CUDA: the harness self-test), and
`validate --kernels` on a real AOTriton tree. Skipped without a GPU."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from codegen.cli import app

runner = CliRunner()


@pytest.mark.gpu
@pytest.mark.usefixtures("gpu")
def test_validate_sdpa_on_this_gpu(tmp_path):
    r = runner.invoke(app, ["validate", "--no-perf", "--json", str(tmp_path / "r.json"), "--md", str(tmp_path / "r.md")])
    report = json.loads((tmp_path / "r.json").read_text())
    assert r.exit_code == 0, r.output
    s = report["summary"]
    assert s["ok"] and s["passed"] > 0 and s["failed"] == 0
    assert all(c["ok"] for c in report["proof"]["checks"])
    if report["platform"]["platform"] == "cuda":
        assert report["self_test"] and "self-test" in report["label"]
    else:
        assert report["proof"]["aotriton"]["mapped_files"]
    md = (tmp_path / "r.md").read_text()
    assert "**Result: PASS**" in md


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.aotriton
@pytest.mark.usefixtures("gpu")
def test_validate_tree_kernels_on_this_gpu(pristine_tree, tmp_path):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    tree = pristine_tree("0.11b")
    r = runner.invoke(app, ["validate", "--kernels", str(tree), "--family", "attn_fwd",
                            "--json", str(tmp_path / "k.json")])
    report = json.loads((tmp_path / "k.json").read_text())
    assert r.exit_code == 0, r.output
    assert report["summary"]["ok"] and report["summary"]["failed"] == 0
    assert report["tree"]["release"] == "0.11b"
    assert {c["family"] for c in report["cases"]} == {"attn_fwd"}
