"""A real smoke bundle: AOTriton 0.11b, the smoke spec (gfx908), HIP 6 (Debian sid's headers in
the private sysroot), built with `bundle build` and checked with `bundle check`: link identity,
the library's own dispatch on the stub HIP runtime for every case, the three negative controls;
then a tampered copy refused.

    pytest -m "build and slow" -s tests/test_bundle_real.py

The build (runtime + 328 kernels) takes 15-60 min on 2 shared cores. A bundle made before can
stand in: MI100_TEST_BUNDLE=path/to/aotriton-0.11b-gfx908-hip6.mi100-bundle.zip (then only the
check runs, ~2-5 min). Needs the HIP packages and cmake/ninja for the build (as
tests/test_build_real.py), gcc/g++ and network access to the Debian mirror on first use."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

SMOKE = REPO / "rules" / "examples" / "smoke.yaml"
pytestmark = [pytest.mark.build, pytest.mark.slow, pytest.mark.aotriton]


def _cli(*args: str, timeout: int = 7200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codegen.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, pristine_tree) -> Path:
    cached = os.environ.get("MI100_TEST_BUNDLE")
    if cached:
        return Path(cached)
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("needs cmake and ninja (see tests/test_build_real.py)")
    work = tmp_path_factory.mktemp("bundle")
    tree = work / "s011"
    shutil.copytree(pristine_tree("0.11b"), tree, symlinks=True)
    r = _cli("apply", str(tree), "--spec", str(SMOKE))
    assert r.returncode == 0, r.stderr
    r = _cli("bundle", "build", str(tree), "--hip", "6", "--spec", str(SMOKE), "--out", str(work), "--json")
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)
    print(f"\nbundle build: {out['seconds']}")
    return Path(out["bundle"])


def test_bundle_check_passes_with_named_controls(bundle):
    r = _cli("bundle", "check", str(bundle), "--json", timeout=3600)
    rep = json.loads(r.stdout)
    assert r.returncode == 0 and rep["ok"], r.stderr[-4000:]
    assert rep["hip_major"] == 6 and rep["arch"] == "gfx908"
    claims = {c["claim"]: c["ok"] for c in rep["link_identity"]}
    assert all(claims.values()) and "hipDeviceProp_t of HIP >= 6 (hipGetDevicePropertiesR0600)" in claims
    d = rep["dispatch"]
    assert d["check_gpu"] == 0 and d["cases"] == d["cases_ok"] >= 10 and d["launches"] > 0
    assert all(c["kernels"]["fwd"] and c["kernels"]["bwd"] for c in d["cases"])
    assert any(c["case"].endswith(".bias") for c in d["cases"]) and any(c["case"].endswith(".dropout") for c in d["cases"])
    kernels = {k for c in d["cases"] for k in c["kernels"]["fwd"]}
    assert all(k.startswith("amd-gfx908/flash/attn_fwd") for k in kernels), kernels
    controls = {c["claim"]: c["ok"] for c in rep["negative_controls"]}
    assert controls == {"negative control: a missing image": True,
                        "negative control: a code object of another arch": True,
                        "negative control: a library linked against another HIP major": True}
    assert "never run on a card" in r.stderr


def test_a_tampered_bundle_is_one_message(bundle, tmp_path):
    t = tmp_path / bundle.name
    with zipfile.ZipFile(bundle) as zin, zipfile.ZipFile(t, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.startswith("lib/libaotriton_v2"):
                data = data.replace(b"attn_fwd", b"attn_fwe", 1)
            zout.writestr(info, data)
    r = _cli("bundle", "check", str(t))
    assert r.returncode == 2 and "does not match the manifest" in r.stderr and "Traceback" not in r.stderr
