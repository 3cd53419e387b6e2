#!/usr/bin/env python3
"""The kernel counts the docs quote, computed by the tool itself: for each (release, spec) of
FIGURES, a fresh copy of the release tree (the shared archive, or AOTRITON_ARCHIVE), `apply`,
then `plan --json`; the totals go to docs/kernel-counts.json.

    python scripts/kernel_counts.py            # print the table
    python scripts/kernel_counts.py --write    # and rewrite docs/kernel-counts.json

Pages quote a count as `2,381<!-- kernels 0.11b mi100 -->` (the comment is invisible on GitHub
and in the site); tests/test_docs.py checks every such number against the JSON, and
tests/test_kernel_counts.py (aotriton, slow) recomputes the JSON with this script.
Minutes: one apply and one generator run per row (CPU)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "kernel-counts.json"
HD128 = ("head_dims: [32, 64]\n", "head_dims: [32, 64, 128]\n")

# (release, label, spec file under rules/, head dim 128 added?): the specs the docs quote counts of
FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("0.10b", "mi100", "mi100.yaml", False),
    ("0.11b", "mi100", "mi100.yaml", False),
    ("0.11.1b", "mi100", "mi100.yaml", False),
    ("0.11.2b", "mi100", "mi100.yaml", False),
    ("0.12b", "mi100", "mi100.yaml", False),
    ("0.12.1b", "mi100", "mi100.yaml", False),
    ("0.13b", "mi100", "mi100.yaml", False),
    ("0.13b", "mi100-hd128", "mi100.yaml", True),
    # the gfx906 and gfx1030 specs on every release (the build-cost table of docs/build.md)
    *((r, label, f"{label}.yaml", False) for label in ("mi50", "rdna2")
      for r in ("0.10b", "0.11b", "0.11.1b", "0.11.2b", "0.12b", "0.12.1b", "0.13b")),
    ("0.11b", "smoke", "examples/smoke.yaml", False),
    ("0.12.1b", "smoke", "examples/smoke.yaml", False),
    ("0.13b", "smoke", "examples/smoke.yaml", False),
    ("0.11b", "smoke-mi50", "examples/smoke-mi50.yaml", False),
    ("0.11b", "smoke-rdna2", "examples/smoke-rdna2.yaml", False),
)


def archive() -> Path:
    env = os.environ.get("AOTRITON_ARCHIVE")
    if env:
        return Path(env)
    for parent in REPO.parents:
        cand = parent / "shared" / "upstream" / "aotriton-releases.tar.xz"
        if cand.is_file():
            return cand
    sys.exit("no release archive: set AOTRITON_ARCHIVE (see tests/conftest.py)")


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AOTRITON_FLASH_BLOCK_DMODEL"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", "from codegen.cli import main; main()", *args],
                          capture_output=True, text=True, env=env)


def count(trees: Path, work: Path, release: str, label: str, spec_name: str, hd128: bool) -> int:
    tree = work / f"{release}-{label}"
    shutil.copytree(trees / f"aotriton-{release}", tree, symlinks=True)
    spec = REPO / "rules" / spec_name
    if hd128:
        text = spec.read_text(encoding="utf-8")
        assert HD128[0] in text
        spec = work / f"{label}.yaml"
        spec.write_text(text.replace(*HD128), encoding="utf-8")
    for args in (("apply", str(tree), "--spec", str(spec)),):
        res = _cli(*args)
        if res.returncode != 0:
            sys.exit(f"{' '.join(args)}: exit {res.returncode}\n{res.stderr[-2000:]}")
    # this interpreter holds the generator's requirements ([upstream]): no build venv needed
    res = _cli("plan", str(tree), "--json", "--python", sys.executable)
    if res.returncode != 0:
        sys.exit(f"plan {tree}: exit {res.returncode}\n{res.stderr[-2000:]}")
    shutil.rmtree(tree)
    return int(json.loads(res.stdout)["total"])


def compute(only: set[str] | None = None) -> dict:
    out: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory(prefix="mi100-kernel-counts-") as tmp:
        trees = Path(tmp) / "trees"
        trees.mkdir()
        subprocess.run(["tar", "-xJf", str(archive()), "-C", str(trees)], check=True)
        for release, label, spec, hd128 in FIGURES:
            if only and f"{release}:{label}" not in only:
                continue
            n = count(trees, Path(tmp), release, label, spec, hd128)
            out.setdefault(release, {})[label] = n
            print(f"{release:8} {label:12} {n:6,}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite docs/kernel-counts.json")
    ap.add_argument("--only", action="append", help="RELEASE:LABEL (repeatable; --write keeps the other rows); "
                    "default: every row")
    args = ap.parse_args()
    got = compute(set(args.only) if args.only else None)
    kernels = json.loads(OUT.read_text(encoding="utf-8"))["kernels"] if args.only and OUT.is_file() else {}
    for release, rows in got.items():
        kernels.setdefault(release, {}).update(rows)
    doc = {"_how": "scripts/kernel_counts.py --write: apply + plan --json per (release, spec)", "kernels": kernels}
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    if args.write:
        OUT.write_text(text, encoding="utf-8")
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
