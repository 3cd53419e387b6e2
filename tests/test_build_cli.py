"""`mi100-codegen build` refusals that need no compiler time (real 0.11b tree)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from conftest import REPO

SMOKE = REPO / "rules" / "examples" / "smoke.yaml"
pytestmark = pytest.mark.aotriton


def _run(*args):
    return CliRunner().invoke(app, list(map(str, args)))


def test_smoke_spec_passes_check():
    r = _run("spec", "check", SMOKE)
    assert r.exit_code == 0, r.output


def test_pristine_tree_refused(pristine_tree, tmp_path):
    tree = pristine_tree("0.11b")
    r = _run("build", tree, "--prefix", tmp_path / "p", "--build-dir", tmp_path / "b")
    assert r.exit_code == 2
    assert "overlay is not applied" in r.output and "mi100-codegen apply" in r.output
    assert not (tmp_path / "b").exists()


def test_missing_prerequisites_listed(fresh_tree, tmp_path, monkeypatch):
    """The interpreter's missing packages are listed (the system's tools and HIP stood in as
    present: the Python check runs only once they are, and this machine need not have HIP)."""
    from codegen.imagebuild import prereq

    monkeypatch.setattr(prereq, "_check_tools", lambda *_a, **_k: {
        "cmake": "cmake", "cmake_version": "3.25", "ninja": "ninja", "ninja_version": "1.11",
        "cxx": "c++", "cc": "cc"})
    monkeypatch.setattr(prereq, "_check_hip", lambda *_a, **_k: (None, None))
    tree = fresh_tree("0.11b")
    r = _run("apply", tree, "--spec", SMOKE)
    assert r.exit_code == 0, r.output
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    r = _run("build", tree, "--prefix", tmp_path / "p", "--build-dir", tmp_path / "b",
             "--python", venv / "bin" / "python")
    assert r.exit_code == 3, r.output  # a missing environment: exit 3, in every stage
    assert "missing build prerequisites" in r.output
    assert "'triton>=3.5.1,<3.9'" in r.output and "pandas" in r.output
    assert not (tmp_path / "b").exists()
    # One head dim crashes upstream tuning builds: refused before anything is written.
    r = _run("build", tree, "--prefix", tmp_path / "p", "--build-dir", tmp_path / "b", "--for-tuning")
    assert r.exit_code == 2 and "at least two head dims" in r.output
    assert not (tmp_path / "b").exists()
    # The spec is the copy apply recorded in the tree; another spec is refused, naming both.
    r = _run("build", tree, "--prefix", tmp_path / "p", "--spec", REPO / "rules" / "mi100.yaml")
    assert r.exit_code == 2 and "is not the spec this tree was applied from" in r.output


def test_compile_route_options_refused(pristine_tree, tmp_path):
    tree = pristine_tree("0.11b")
    base = ["build", tree, "--spec", SMOKE, "--prefix", tmp_path / "p", "--build-dir", tmp_path / "b"]
    r = _run(*base, "--compile-via", "ninja")
    assert r.exit_code == 2 and "--compile-via 'ninja': one of workers, upstream" in r.output
    r = _run(*base, "--compile-via", "upstream", "--dask", "local")
    assert r.exit_code == 2 and "--dask" in r.output and "--compile-via workers" in r.output
    assert not (tmp_path / "b").exists()
