"""scripts/mi100_recipe.sh end to end on CPU: a fake ROCm torch (real ELF fixtures), a real
AOTriton clone (from AOTRITON_GIT, or a local repository made from the release archive) with the
real overlay applied; only `build` (hours, ROCm) and `validate` (a GPU) are stand-ins. Checks the order of the steps, the real torch install, and that
a rerun resumes (every step skipped)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from codegen.ship.layout import build_release_for_line, parse_tag

from test_torch_install import build_torch, need_cc, snapshot

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "mi100_recipe.sh"

STUB = """#!/usr/bin/env bash
# mi100-codegen for the test: real except build and validate
echo "$*" >> "$STUB_LOG"
case "$1" in
  build)
    prefix=""; prev=""
    for a in "$@"; do [ "$prev" = "--prefix" ] && prefix="$a"; prev="$a"; done
    # the library version follows the release of the prefix-<tag> folder, as a real build's would
    exec {py} -c "import sys; sys.path.insert(0, sys.argv[2]); import test_torch_install as t; from pathlib import Path; from codegen.ship.layout import parse_tag; p = Path(sys.argv[1]); t.build_prefix(p, version='.'.join(map(str, parse_tag(p.name.split('-', 1)[1]))))" "$prefix" "$TESTS_DIR" ;;
  validate) echo "validate stand-in: ok" >&2; exit 0 ;;
  *) exec {py} -m codegen.cli "$@" ;;
esac
"""


@pytest.mark.aotriton
@pytest.mark.slow
def test_recipe_script_runs_and_resumes(tmp_path, aotriton_git_url):
    need_cc()
    site = tmp_path / "site"
    build_torch(site)  # torch 2.9 links AOTriton 0.11b; the newest supported release of that line is built
    tag = build_release_for_line("0.11")
    assert tag == "0.11.2b"
    version = ".".join(map(str, parse_tag(tag)))
    git_url = aotriton_git_url(tag)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "mi100-codegen"
    stub.write_text(STUB.replace("{py}", sys.executable))
    stub.chmod(0o755)
    log = tmp_path / "calls.log"
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        PYTHONPATH=f"{site}:{REPO}",
        STUB_LOG=str(log),
        TESTS_DIR=str(REPO / "tests"),
        WORKDIR=str(tmp_path / "work"),
        AOTRITON_GIT_URL=git_url,
        JOBS="2",
    )
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    calls = [line.split()[0] + (" " + line.split()[1] if line.startswith("torch") else "")
             for line in log.read_text().splitlines()]
    assert calls == ["torch status", "torch status", "apply", "build", "torch install", "validate", "validate"]
    work = tmp_path / "work"
    assert (work / f"aotriton-{tag}" / "v3python" / "gpu_targets.py").read_text().count("gfx908") >= 3
    lib = site / "torch" / "lib"
    assert (lib / "aotriton.images" / "amd-gfx908").is_dir()
    # the point release goes in under the file name torch links
    assert (lib / "libaotriton_v2.so.0.11.0").read_bytes() == \
        (work / f"prefix-{tag}" / "lib" / f"libaotriton_v2.so.{version}").read_bytes()

    # a rerun resumes: every step is skipped, torch untouched
    before = snapshot(site)
    log.write_text("")
    r = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2/6 clone: done" in r.stderr and "4/6 build: done" in r.stderr and "5/6 install: done" in r.stderr
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ["torch", "torch", "validate", "validate"]
    assert snapshot(site) == before

    # the install is undone by restore
    r = subprocess.run([sys.executable, "-m", "codegen.cli", "torch", "restore", "--torch-dir", str(site / "torch")],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not (lib / "aotriton.images" / "amd-gfx908").exists()


def _run_script(site, tmp_path):
    """The recipe script with this checkout's CLI on PATH and the fake torch site importable."""
    env = dict(os.environ, PYTHONPATH=f"{site}:{REPO}", WORKDIR=str(tmp_path / "work"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mi100-codegen").write_text(f"#!/bin/sh\nexec {sys.executable} -m codegen.cli \"$@\"\n")
    (bin_dir / "mi100-codegen").chmod(0o755)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_recipe_script_refuses_a_non_rocm_torch(tmp_path):
    need_cc()
    site = tmp_path / "site"
    build_torch(site, version="2.11.0+cu128", hip=None, hip_lib=False, images=False)
    r = _run_script(site, tmp_path)
    assert r.returncode == 2
    assert "not a ROCm build" in r.stderr
    assert not list((tmp_path / "work" / ".done").iterdir())



def test_recipe_script_refuses_a_release_line_not_supported_yet(tmp_path):
    """A ROCm torch linking AOTriton 0.9 (PyTorch 2.7): one message naming the supported
    releases, exit 2, no step run."""
    need_cc()
    site = tmp_path / "site"
    build_torch(site, version="2.7.0+rocm6.3", aot_version="0.9.2")
    r = _run_script(site, tmp_path)
    assert r.returncode == 2, r.stderr
    assert ("AOTriton 0.9.2b (PyTorch 2.7): mi100-codegen's torch integration does not support the 0.9 release "
            "line yet" in r.stderr)
    assert "releases it builds for PyTorch: 0.10b" in r.stderr
    assert not list((tmp_path / "work" / ".done").iterdir())
    assert not list((tmp_path / "work").glob("aotriton-*"))
