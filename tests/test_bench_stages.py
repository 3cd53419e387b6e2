"""scripts/bench_stages.py on its tree-free parts: the dry-run listing, a real run of the
`--help` and `spec check` rows, and its refusals."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from codegen.upstream import SUPPORTED_RELEASES

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "bench_stages.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_dry_run_lists_every_stage_and_release(tmp_path):
    archive = tmp_path / "aotriton-releases.tar.xz"
    archive.write_bytes(b"")  # never opened by --dry-run
    r = _run("--dry-run", "--archive", str(archive))
    assert r.returncode == 0, r.stderr
    assert f"releases: {', '.join(SUPPORTED_RELEASES)}; runs: 3" in r.stdout
    keys = [line.split()[0] for line in r.stdout.splitlines()[1:]]
    assert keys == ["help", "spec-check", "render", "apply", "apply-again", "revert", "plan", "precompile"]
    assert "precompile TREE --sample 8 --no-cache" in r.stdout
    assert "plan TREE --json" in r.stdout


def test_tree_free_rows_are_measured(tmp_path):
    out = tmp_path / "bench.md"
    rel = SUPPORTED_RELEASES[-1]
    r = _run("--stages", "help,spec-check", "--releases", rel, "--runs", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text() == r.stdout
    assert f"| stage | {rel} |" in r.stdout
    for label in ("CLI start (`--help`)", "`spec check`"):
        assert re.search(rf"^\| {re.escape(label)} \| \d+\.\d\d( ✗)? \| 0\.[35] \|$", r.stdout, re.M), r.stdout
    assert "apply" not in r.stdout.split("| stage |")[1]
    assert f"[{rel} run 1/1] help: " in r.stderr  # progress on stderr, not in the table


def test_baseline_is_measured_side_by_side(tmp_path):
    """--baseline REF: the same stage for both code bases in one run, cells `before → after (ratio)`."""
    rel = SUPPORTED_RELEASES[-1]
    r = _run("--stages", "spec-check", "--releases", rel, "--runs", "1", "--baseline", "HEAD")
    assert r.returncode == 0, r.stderr
    assert "before = commit " in r.stdout and "after = this checkout" in r.stdout
    assert re.search(r"^\| `spec check` \| \d+\.\d\d → \d+\.\d\d( ✗)? \(\d+\.\d\d×\) \| 0\.5 \|$", r.stdout, re.M), r.stdout
    assert f"[{rel} run 1/1] before spec-check: " in r.stderr and f"[{rel} run 1/1] after spec-check: " in r.stderr


def test_refusals():
    r = _run("--releases", "0.14b", "--dry-run")
    assert r.returncode == 2 and "not a supported release: 0.14b" in r.stderr
    r = _run("--stages", "compile", "--dry-run")
    assert r.returncode == 2 and "unknown stage: compile" in r.stderr
    r = _run("--stages", "help", "--baseline", "no-such-ref-xyz", "--runs", "1")
    assert r.returncode != 0 and "neither a checkout folder nor a commit" in r.stderr
    r = _run("--baseline", "HEAD", "--cli", "mi100-codegen", "--dry-run")
    assert r.returncode == 2 and "leave out --cli" in r.stderr
