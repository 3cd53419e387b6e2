"""Time `render --check`, a first and a second `apply` and a `revert` per release, each on a fresh
copy of a real AOTriton tree; prints wall and CPU (user+sys of the command) seconds.

    PYTHONPATH=$PWD python scripts/bench_apply.py [--trees /work/trees] [--runs 3] 0.11b 0.12b ...

Each release is copied from TREES/aotriton-<tag> (an extracted release); with --runs N the
median of N runs is printed."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEPS = ("render", "apply1", "apply2", "revert")


def _run(args: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "codegen.cli", *args], cwd=REPO, capture_output=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.returncode


def bench(tree_src: Path) -> dict[str, tuple[float, float, int]]:
    with tempfile.TemporaryDirectory(prefix="bench-apply-") as td:
        tree = Path(td) / "t"
        shutil.copytree(tree_src, tree, symlinks=True)
        args = {"render": ["render", "--check"], "apply1": ["apply", str(tree)], "apply2": ["apply", str(tree)],
                "revert": ["revert", str(tree)]}
        return {step: _run(args[step]) for step in STEPS}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("releases", nargs="+")
    ap.add_argument("--trees", type=Path, default=Path("/work/trees"))
    ap.add_argument("--runs", type=int, default=1)
    opts = ap.parse_args()
    print("release | " + " | ".join(f"{s} wall / cpu" for s in STEPS))
    for rel in opts.releases:
        runs = [bench(opts.trees / f"aotriton-{rel}") for _ in range(opts.runs)]
        cells = []
        for s in STEPS:
            wall = statistics.median(r[s][0] for r in runs)
            cpu = statistics.median(r[s][1] for r in runs)
            rc = max(r[s][2] for r in runs)
            cells.append(f"{wall:.2f} / {cpu:.2f}" + (f" (exit {rc})" if rc else ""))
        print(f"{rel} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
