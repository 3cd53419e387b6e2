"""`bundle verify --rebuild 3` on a real smoke bundle (AOTriton 0.11b, the smoke spec): three
kernels recompiled from the release, spec and Triton it records are what it packs; then the
same bundle with one sampled kernel's code object replaced by another config's (hashes
recomputed, so `bundle check`'s integrity holds) reports that kernel `differs`, exit 3.

    MI100_TEST_BUNDLE=path/to/aotriton-0.11b-gfx908-hip6.mi100-bundle.zip pytest -m slow -s tests/test_bundle_verify_real.py

Without MI100_TEST_BUNDLE the bundle is built first (tests/test_bundle_real.py's fixture: 15-60
min on 2 cores). The rebuild needs the release tree (AOTRITON_SRC, AOTRITON_GIT or the shared
archive) and the build venv of the bundle's Triton (made on first use; PyPI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from codegen.formats.aks2 import package_images, packed_kernels
from codegen.formats.bundle_zip import MANIFEST, extract, manifest_of, open_bundle, write_bundle
from codegen.core.fsutil import sha256
from codegen.upstream.releases import IMAGES_DIR
from test_bundle_real import applied_tree, bundle  # noqa: F401  (the built bundle, when none is given)
from test_bundle_units import aks2

pytestmark = [pytest.mark.slow, pytest.mark.build, pytest.mark.aotriton, pytest.mark.triton]


@pytest.fixture(scope="module")
def smoke_bundle(request) -> Path:
    cached = os.environ.get("MI100_TEST_BUNDLE")
    return Path(cached) if cached else request.getfixturevalue("bundle")


def _verify(path: Path, n: int = 3) -> tuple[subprocess.CompletedProcess, dict, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "codegen.cli", "bundle", "verify", str(path), "--rebuild", str(n),
                        "--json"], capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    print(f"\nbundle verify --rebuild {n} {path.name}: {wall:.1f} s, exit {r.returncode}\n{r.stderr[-1500:]}")
    return r, (json.loads(r.stdout) if r.stdout.strip() else {}), wall


@pytest.fixture(scope="module")
def verified(smoke_bundle) -> dict:
    r, rep, _wall = _verify(smoke_bundle)
    assert r.returncode == 0 and rep.get("ok"), r.stderr[-4000:]
    return rep


def test_a_real_bundle_is_what_its_recorded_inputs_compile_to(verified):
    assert verified["summary"] == {"same": 3, "differs": 0, "missing": 0, "failed": 0}
    assert verified["planned"] == verified["packed"] > 3
    assert verified["not_packed"]["count"] == verified["not_planned"]["count"] == 0
    kinds = {k["config"].split(".")[0] for k in verified["kernels"]}
    dtypes = {k["config"].split(".")[2] for k in verified["kernels"]}
    assert len(kinds) == 3 and {"fp16", "bf16"} <= dtypes, verified["kernels"]   # stratified
    assert all(k["sections"] == [] for k in verified["kernels"])


def _swapped(src: Path, dest: Path, work: Path, victim: dict) -> str:
    """`src` rewritten to `dest` with `victim`'s code object replaced by one of another config of
    the same family (another package), every hash in the manifest recomputed; returns its kernel."""
    b = open_bundle(src)
    root = extract(b, work)
    images = root / "lib" / IMAGES_DIR
    family = victim["package"].split("/")[2]
    donor = next(r for r in sorted(packed_kernels(images), key=lambda r: (r.file, r.name))
                 if r.file.split("/")[2] == family and r.file != victim["package"])
    donor_image = package_images(images, donor.file)[donor]
    found = package_images(images, victim["package"])
    target = next(r for r in found if r.name == victim["entry"])
    found[target] = donor_image
    if victim["package"].endswith(".zip"):
        with zipfile.ZipFile(images / victim["package"], "w", zipfile.ZIP_STORED) as z:
            for member in sorted({r.member for r in found}):
                z.writestr(member, aks2({r.name: img for r, img in found.items() if r.member == member}))
    else:
        (images / victim["package"]).write_bytes(aks2({r.name: img for r, img in found.items()}))
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    data = dict(b.manifest.to_json(), files={n: {"sha256": sha256(d), "size": len(d)} for n, d in files.items()})
    write_bundle(dest, manifest_of(data, f"{dest}: {MANIFEST}"), files)
    assert open_bundle(dest).members.keys() == files.keys()          # integrity holds: only a rebuild tells
    return target.name


def test_a_swapped_code_object_is_reported_as_differing(smoke_bundle, verified, tmp_path):
    victim = verified["kernels"][0]
    tampered = tmp_path / smoke_bundle.name
    _swapped(smoke_bundle, tampered, tmp_path / "unpacked", victim)
    r, rep, _wall = _verify(tampered)
    assert r.returncode == 3 and not rep["ok"] and "Traceback" not in r.stderr, r.stderr[-4000:]
    by_kernel = {k["kernel"]: k for k in rep["kernels"]}
    assert by_kernel[victim["kernel"]]["verdict"] == "differs" and ".text" in by_kernel[victim["kernel"]]["sections"]
    assert rep["summary"] == {"same": 2, "differs": 1, "missing": 0, "failed": 0}
    assert f"differs  {victim['kernel']}" in r.stderr and "not what its recorded release" in r.stderr
