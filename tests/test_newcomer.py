"""A newcomer's path, as the README tells it (issue 22): a fresh venv, the README's own install
command (`pip install .`, nothing else installed), then apply and plan on a real release tree.

`plan` must find the tree's generator requirements in the build venv that precompile and build
use (created here under a fresh cache folder, so the run is what a new machine sees; pip's own
cache and index configuration are used as they are: PyPI only). The spec applied is a copy of
`rules/mi50.yaml` that is deleted before `plan` runs: plan works on the spec the tree recorded.
precompile then compiles a 2-kernel sample with the same spec in the same build venv. Minutes
(pip installs Triton into the build venv): `slow`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.aotriton]


def test_readme_install_then_apply_and_plan(tmp_path, fresh_tree):
    tree = fresh_tree("0.11b")
    venv = tmp_path / "venv"
    # README command 1, minus the render (tested elsewhere): python3 -m venv .venv && .venv/bin/pip install .
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(REPO)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-2000:]
    exe = str(venv / "bin" / "mi100-codegen")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "AOTRITON_FLASH_BLOCK_DMODEL")}
    env["MI100_CODEGEN_CACHE"] = str(tmp_path / "cache")  # no build venv yet, as on a new machine
    mine = tmp_path / "mine" / "mi50.yaml"
    mine.parent.mkdir()
    shutil.copy(REPO / "rules" / "mi50.yaml", mine)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1800)

    applied = cli("apply", str(tree), "--spec", str(mine))
    assert applied.returncode == 0, applied.stderr[-2000:]
    mine.unlink()  # the user's file goes away: the tree recorded it
    plan = cli("plan", str(tree), "--json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    doc = json.loads(plan.stdout)
    assert doc["gpu"] == "gfx906_mod0"
    assert {k for k in doc["by_head_dim"] if k != "none"} == {"32", "64"}
    assert ".mi100-codegen/spec.yaml (the spec applied to this tree)" in plan.stderr
    assert "build venv" in plan.stderr  # created once, here; the generator ran in it
    venvs = [p for p in (tmp_path / "cache" / "toolchain").iterdir() if p.name.startswith("triton-")]
    assert len(venvs) == 1 and f"generator: {venvs[0]}" in plan.stderr
    # precompile: the same spec (recorded), the same build venv (no second one)
    pre = cli("precompile", str(tree), "--sample", "2", "--no-cache", "--jobs", "1")
    assert pre.returncode == 0, pre.stderr[-3000:]
    assert "creating a build venv" not in pre.stderr and str(venvs[0]) in pre.stderr
    assert [p for p in (tmp_path / "cache" / "toolchain").iterdir() if p.name.startswith("triton-")] == venvs
