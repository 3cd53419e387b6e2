"""The release pipeline (issue 31 item 4): the matrix's one owner (codegen.ship.matrix) and the
workflow and script that read it; the workflow's checks (GitHub's schema, zizmor) where the tools
are installed (`pip install -e '.[release]'`; .ci/run runs them always); and, slow, the script
building, checking and indexing a smoke bundle from a real tree.

    pytest -m "build and slow" -s tests/test_release_pipeline.py"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from codegen.core.errors import UserError
from codegen.formats.bundle_zip import open_bundle
from codegen.formats.spec import load_spec
from codegen.models.hip import HIP_MAJORS
from codegen.ship.index import read_index_file
from codegen.ship.layout import TORCH_RELEASES
from codegen.core.resources import card_specs
from codegen.ship.matrix import kernel_groups, matrix_json, release_matrix
from codegen.upstream.releases import TORCH_LINES, by_release

from conftest import REPO
from test_torch_install import cli

WORKFLOW = REPO / ".github" / "workflows" / "bundles.yml"
SCRIPT = REPO / "scripts" / "release_bundles.py"
SMOKE = REPO / "rules" / "examples" / "smoke.yaml"
SMOKES = [SMOKE, REPO / "rules" / "examples" / "smoke-mi50.yaml", REPO / "rules" / "examples" / "smoke-rdna2.yaml"]


def test_the_matrix_is_each_linked_release_by_card_by_its_wheels_hip_majors():
    rows = release_matrix()
    specs = {load_spec(p).spec.arch: p.name for p in card_specs()}
    assert specs == {"gfx908": "mi100.yaml", "gfx906": "mi50.yaml", "gfx1030": "rdna2.yaml"}
    want = set()
    for t in TORCH_LINES:
        r = t.aotriton
        if r in TORCH_RELEASES and not by_release(r).builds_own_triton:
            want |= {(r, arch, hip) for arch in specs for hip in t.hip_majors if hip in HIP_MAJORS}
    assert {(r.release, r.arch, r.hip) for r in rows} == want and len(rows) == len(want)
    assert len({r.bundle for r in rows}) == len(rows) and all(r.spec.name == specs[r.arch] for r in rows)
    for r in rows:
        assert all(r.hip in t.hip_majors and t.aotriton == r.release for t in TORCH_LINES if t.torch in r.torch)
    assert "0.10b" not in {r.release for r in rows}   # its image build compiles its own Triton
    assert {g["id"] for g in kernel_groups(rows)} == {f"{r.release}-{r.arch}" for r in rows}


def test_bundle_matrix_prints_the_owners_table(tmp_path):
    r = cli("bundle", "matrix", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == matrix_json(release_matrix())
    r = cli("bundle", "matrix", *map(str, SMOKES), "--json")
    assert {b["spec_name"] for b in json.loads(r.stdout)["bundles"]} == {"mi100-smoke", "mi50-smoke", "rdna2-smoke"}
    r = cli("bundle", "matrix", str(SMOKE), str(REPO / "rules" / "mi100.yaml"))   # two specs for gfx908
    assert r.exit_code == 2 and "both specs for gfx908" in r.output
    with pytest.raises(UserError):
        release_matrix([SMOKE, REPO / "rules" / "mi100.yaml"])


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def test_the_workflow_holds_no_copy_of_the_table():
    text = WORKFLOW.read_text(encoding="utf-8")
    body = "\n".join(line.split("#", 1)[0] for line in text.splitlines())   # not the comments
    for word in ["gfx9", "gfx10", "hip6", "hip7", "rules/", *{r.release for r in release_matrix()}]:
        assert word not in body, word
    jobs = _workflow()["jobs"]
    assert "bundle matrix --json" in json.dumps(jobs["matrix"])
    assert jobs["kernels"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.matrix.outputs.kernels) }}"
    assert jobs["bundle"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.matrix.outputs.bundles) }}"
    steps = json.dumps(jobs["kernels"]) + json.dumps(jobs["bundle"])
    assert steps.count("scripts/release_bundles.py") == 2 and "bundle index" in json.dumps(jobs["index"])


def test_the_workflow_is_least_privilege_and_pinned():
    wf = _workflow()
    assert wf["permissions"] == {}
    for name, job in wf["jobs"].items():
        perms = job.get("permissions", {})
        assert ("id-token" in perms) == (name == "pypi"), name
        assert perms.get("contents") != "write" or name == "publish-bundles", name
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses:
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", uses), uses
            if uses and uses.startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
            assert "${{" not in step.get("run", ""), (name, step.get("name"))   # no template injection
    text = WORKFLOW.read_text(encoding="utf-8")
    assert all(re.search(r"@[0-9a-f]{40} # v\d", line) for line in text.splitlines() if "uses:" in line)
    assert "pypa/gh-action-pypi-publish@" in text and "twine check --strict" in text


@pytest.mark.parametrize("tool, args", [
    ("check-jsonschema", ["--builtin-schema", "vendor.github-workflows", str(WORKFLOW)]),
    ("zizmor", ["--offline", str(WORKFLOW.parent)]),
])
def test_the_workflow_passes_the_ci_checks(tool, args):
    exe = shutil.which(tool, path=str(Path(sys.executable).parent)) or shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed (pip install -e '.[release]'; .ci/run runs it)")
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def _script(*args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_script_runs_the_same_rows():
    r = _script(*map(str, SMOKES), "--list")
    assert r.returncode == 0, r.stderr
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == [row.id for row in release_matrix(SMOKES)]
    r = _script(str(SMOKE), "--only", "0.9b-gfx908-hip6", "--list")
    assert r.returncode == 2 and "not a row of the matrix" in r.stderr


@pytest.mark.slow
@pytest.mark.build
@pytest.mark.aotriton
def test_the_script_builds_checks_and_indexes_a_smoke_bundle(tmp_path, pristine_tree):
    """The 0.11b gfx908 HIP 6 row of the smoke spec, from the release archive's real tree: built,
    `bundle check`ed, indexed; run again, every step is skipped."""
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("needs cmake and ninja (see tests/test_build_real.py)")
    env = dict(os.environ, AOTRITON_SRC=str(pristine_tree("0.11b")))
    out = tmp_path / "dist"
    t0 = time.monotonic()
    r = _script(str(SMOKE), "--only", "0.11b-gfx908-hip6", "--out", str(out), env=env, timeout=7200)
    print(f"\nrelease_bundles.py, smoke 0.11b gfx908 HIP 6: {time.monotonic() - t0:.0f} s")
    assert r.returncode == 0, r.stderr[-4000:]
    idx = read_index_file(out / "index.json")
    (entry,) = idx.bundles
    b = open_bundle(out / entry.file)
    assert entry.key == ("0.11b", "gfx908", 6) and entry.sha256 == b.sha256
    assert (entry.spec.name, entry.spec.sha256) == (b.manifest.spec.name, b.manifest.spec.sha256)
    assert entry.provenance.triton and entry.provenance.project_version
    r = _script(str(SMOKE), "--only", "0.11b-gfx908-hip6", "--out", str(out), env=env, timeout=600)
    assert r.returncode == 0 and "bundle there, checked before" in r.stderr, r.stderr[-2000:]
