"""The owner's command end to end with a real bundle (slow): `torch install --bundle auto
--build-locally --spec rules/examples/smoke.yaml` on a fake MI100 machine with a torch 2.9 / ROCm
6.4 wheel (tests/owner_machine.py) builds AOTriton 0.11.2b's smoke bundle here, from the release
tree the shared archive holds (../shared/upstream; AOTRITON_SRC / AOTRITON_GIT honoured), in the
user cache, checked by its build; installs it, and torch restores byte for byte. A second run takes
the bundle built before. Then the same bundle, listed by `bundle index` and served from a loopback
HTTP server, is downloaded, passes the real `bundle check` and is installed through the index route.

    pytest -m "build and slow" -s tests/test_owner_build.py

Needs cmake and ninja, gcc/g++, the HIP 6 sysroot (made on first use from the Debian mirror), and
the time of a smoke bundle build (15-60 min on 2 shared cores, minutes once its kernels are cached)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, release_archive
from loopback import Site, serve
from owner_machine import sysfs, wheel
from test_torch_install import cli, snapshot

SMOKE = REPO / "rules" / "examples" / "smoke.yaml"
pytestmark = [pytest.mark.build, pytest.mark.slow, pytest.mark.aotriton]


def _auto(*args: str) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "codegen.cli", "torch", "install", "--bundle", "auto", *args],
                       capture_output=True, text=True, timeout=4 * 3600)
    print(f"\n$ torch install --bundle auto {' '.join(args)}: {time.monotonic() - t0:.0f} s, exit {r.returncode}")
    return r


def test_build_here_then_serve_it(tmp_path):
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("needs cmake and ninja (see tests/test_build_real.py)")
    if release_archive() is None and not (os.environ.get("AOTRITON_SRC") or os.environ.get("AOTRITON_GIT")):
        pytest.skip("needs the release archive ../shared/upstream (or AOTRITON_SRC / AOTRITON_GIT)")
    site = tmp_path / "site"
    root = wheel(site, "2.9-rocm6.4", uses=False)
    machine = sysfs(tmp_path / "sys", "gfx908")
    before = snapshot(site)
    common = ["--spec", str(SMOKE), "--torch-dir", str(root), "--sysfs", str(machine)]
    r = _auto("--build-locally", *common)
    assert r.returncode == 0, r.stderr[-6000:]
    name = "aotriton-0.11.2b-gfx908-hip6.mi100-bundle.zip"
    assert f"bundle:   {name}, built here: --build-locally" in r.stderr
    assert f"installed: {name} as lib/libaotriton_v2.so.0.11.0" in r.stderr
    s = json.loads(cli("torch", "status", "--torch-dir", str(root), "--json").stdout)
    assert s["ours"]["bundle"]["file"] == name and s["ours"]["bundle"]["release"] == "0.11.2b"
    assert cli("torch", "restore", "--torch-dir", str(root)).exit_code == 0
    assert snapshot(site) == before

    r = _auto("--build-locally", *common)          # the bundle built before is taken
    assert r.returncode == 0 and "using the bundle built here earlier" in r.stderr, r.stderr[-4000:]
    assert cli("torch", "restore", "--torch-dir", str(root)).exit_code == 0
    path = Path(r.stderr.split("using the bundle built here earlier: ")[1].splitlines()[0].strip())
    assert path.name == name and path.parent.name == "built"

    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy2(path, dist / name)
    assert cli("bundle", "index", str(dist)).exit_code == 0
    with serve(Site({f"/r/{p.name}": p.read_bytes() for p in dist.iterdir()})) as web:
        r = _auto("--index", web.url("/r/"), *common)
    assert r.returncode == 0, r.stderr[-6000:]
    assert f"bundle:   {name} from the index" in r.stderr
    assert "bundle check: every check passed" in r.stderr
    assert f"installed: {name}" in r.stderr
    assert cli("torch", "restore", "--torch-dir", str(root)).exit_code == 0
    assert snapshot(site) == before
