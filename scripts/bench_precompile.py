#!/usr/bin/env python3
"""Throughput of precompile's warm workers against the tree's own compiler, one `compile.py`
process per kernel as its build runs it (ninja -jJ), on one stratified sample of an applied tree.

    python scripts/bench_precompile.py TREE [--spec FILE] [--sample 12] [--jobs J] [--json]
        [--python PY | --triton-version X] [--timeout S]

Each side compiles the same sample J at a time, cold (a fresh Triton cache, no kernel cache),
with the same interpreter and Triton; prints kernels/min (wall) and kernels per CPU-minute
(user+sys of every process of the side: the robust figure on a shared machine) and both ratios,
as a Markdown table (or JSON). The tree is not written to: the compiler driver and the kernel
sources run from a temporary copy. Exit 3 when a side compiled no kernel. Figures:
docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codegen.core import preflight, processes, ui  # noqa: E402
from codegen.core.errors import EXIT_UPSTREAM, CodegenError, UpstreamError  # noqa: E402
from codegen.compile import engine  # noqa: E402
from codegen.compile.precompile import compiler_for  # noqa: E402
from codegen.compile.sample import stratified_sample  # noqa: E402
from codegen.plan.run import PlanOptions, run_plan  # noqa: E402
from codegen.plan.tree import release_of  # noqa: E402

KILL_GRACE_S = 60.0  # past --timeout, an upstream compile (its driver enforces the limit itself) is killed


@dataclass(frozen=True)
class Side:
    name: str
    kernels: int
    ok: int
    wall_s: float
    kernels_per_min: float
    cpu_s: float              # user+sys CPU of all the side's processes
    kernels_per_cpu_min: float


def _side(name: str, n: int, ok: int, wall: float, cpu: float) -> Side:
    return Side(name, n, ok, round(wall, 2), round(n / wall * 60, 1) if wall > 0 else 0.0,
                round(cpu, 2), round(n / cpu * 60, 1) if cpu > 0 else 0.0)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_upstream(info, entries: list, jobs: int, python: str, timeout_s: float, on_done) -> tuple[float, int, list[str]]:
    """One compiler process per kernel, `jobs` at a time, as the tree's CMake rule runs them."""
    work = Path(tempfile.mkdtemp(prefix="mi100-codegen-bench-upstream-"))
    running: list[tuple[subprocess.Popen, object, float]] = []
    try:
        driver = work / "compile.py"
        shutil.copy2(info.compiler, driver)
        copied: dict[str, Path] = {}
        for e in entries:
            src_dir = (info.root / e.source).parent
            if str(src_dir) not in copied:
                dest = work / f"src{len(copied)}"
                shutil.copytree(src_dir, dest, ignore=shutil.ignore_patterns("__pycache__"))
                copied[str(src_dir)] = dest
        env = dict(os.environ, TRITON_CACHE_DIR=str(work / "triton-cache"), TRITON_F32_DEFAULT="ieee",
                   TRITON_STORE_BINARY_ONLY="1")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        out_dir = work / "out"
        out_dir.mkdir()
        queue = list(entries)
        ok, failures = 0, []
        t0 = time.perf_counter()
        while queue or running:
            while queue and len(running) < jobs:
                e = queue.pop(0)
                src = copied[str((info.root / e.source).parent)] / Path(e.source).name
                cmd = [python, str(driver), str(src), "--kernel_name", e.kernel_name,
                       "-o", str(out_dir / f"{e.id}.hsaco"), "-g", "1,1,1",
                       "--num_warps", str(e.config.num_warps), "--num_stages", str(e.config.num_stages),
                       "--waves_per_eu", str(e.config.waves_per_eu), "--target", e.config.arch,
                       "--signature", e.signature, "--timeout", f"{timeout_s / 60:g}"]
                proc = processes.start(cmd, env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                       text=True)
                running.append((proc, e, time.perf_counter()))
            time.sleep(0.02)
            for item in list(running):
                proc, e, started = item
                if proc.poll() is None:
                    if time.perf_counter() - started > timeout_s + KILL_GRACE_S:  # compile.py's own limit did not hold
                        processes.kill_group(proc)
                        proc.wait()
                    continue
                running.remove(item)
                err = proc.stderr.read() if proc.stderr else ""
                image = out_dir / f"{e.id}.hsaco"
                good = proc.returncode == 0 and image.is_file() and image.stat().st_size > 0
                ok += good
                if not good:
                    last = [ln for ln in err.strip().splitlines() if ln.strip()]
                    failures.append(f"upstream {e.id}: rc {proc.returncode}: {last[-1] if last else 'empty image'}")
                on_done("upstream")
        return time.perf_counter() - t0, ok, failures
    finally:
        for proc, _e, _t in running:  # Ctrl-C or an error: no compile outlives the bench
            processes.kill_group(proc)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def run_bench(tree: Path, entries: list, spec, jobs: int, compiler, timeout_s: float, on_done) -> dict:
    """Both compilers with the same Triton: the tree's compile.py run by `compiler.python`, our
    workers in that interpreter too."""
    info = release_of(tree)
    if not info.compiler.is_file():
        raise UpstreamError(f"{info.compiler}: the tree's compiler driver is missing")
    cpu0 = _children_cpu()
    up_wall, up_ok, failures = run_upstream(info, entries, jobs, compiler.python, timeout_s, on_done)
    cpu1 = _children_cpu()
    ours = engine.compile_entries(info.root, entries, spec, jobs=jobs, timeout_s=timeout_s, cache=None,
                                  on_progress=lambda r: on_done("precompile"), compiler=compiler)
    cpu2 = _children_cpu()
    failures += [f"precompile {r.id}: {r.error}" for r in ours.results if r.status != "ok"]
    up = _side("upstream compile.py (one process per kernel)", len(entries), up_ok, up_wall, cpu1 - cpu0)
    me = _side("mi100-codegen precompile (warm workers)", len(entries),
               sum(r.status == "ok" for r in ours.results), ours.wall_s, cpu2 - cpu1)
    return {"release": info.release, "triton": engine.triton_version(compiler), "jobs": jobs,
            "sample": len(entries), "upstream": asdict(up), "precompile": asdict(me),
            "ratio": round(me.kernels_per_min / up.kernels_per_min, 2) if up.kernels_per_min else 0.0,
            "cpu_ratio": round(me.kernels_per_cpu_min / up.kernels_per_cpu_min, 2) if up.kernels_per_cpu_min else 0.0,
            "failures": sorted(failures)}


def table(res: dict) -> str:
    lines = [f"AOTriton {res['release']}, Triton {res['triton']}, {res['sample']} kernels, jobs {res['jobs']}", "",
             "| compiler | ok | wall s | kernels/min | CPU s | kernels/CPU-min |", "|---|---|---|---|---|---|"]
    for s in (res["upstream"], res["precompile"]):
        lines.append(f"| {s['name']} | {s['ok']}/{s['kernels']} | {s['wall_s']:.1f} | {s['kernels_per_min']:.1f} "
                     f"| {s['cpu_s']:.1f} | {s['kernels_per_cpu_min']:.1f} |")
    lines += ["", f"ratio precompile/upstream: {res['ratio']:.2f}x wall clock, {res['cpu_ratio']:.2f}x per CPU-second"]
    return "\n".join(lines) + "\n"


def bench(a: argparse.Namespace) -> dict:
    if a.python is not None:
        preflight.interpreter(a.python)
    else:
        preflight.cache_folder("toolchain")  # the build venv
    err = ui.console()
    loaded, compiler = compiler_for(a.tree, a.spec, a.python, a.triton_version, "precompile bench", err)
    run = run_plan(PlanOptions(a.tree, a.spec, compiler.python, False), loaded=loaded)
    chosen = stratified_sample(run.entries, a.sample)
    jobs = a.jobs or engine.default_jobs()
    err.print(f"bench: {len(chosen)} of {run.summary.total} kernels, {jobs} at a time, each side cold")
    with ui.progress(err) as progress:
        bars = {"upstream": progress.add_task("upstream compile.py", total=len(chosen)),
                "precompile": progress.add_task("precompile", total=len(chosen), start=False)}

        def done(side: str) -> None:
            if not progress.tasks[bars[side]].started:
                progress.start_task(bars[side])
            progress.update(bars[side], advance=1)

        return run_bench(a.tree, chosen, loaded.spec, jobs, compiler, a.timeout, done)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tree", type=Path, help="AOTriton tree with the overlay applied")
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--sample", type=int, default=12, help="stratified sample size")
    ap.add_argument("--jobs", "-j", type=int, default=0, help="parallel compiles on each side (0: one per usable CPU)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-kernel timeout in seconds")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--python", default=None, help="interpreter with the spec's Triton (default: the build venv)")
    ap.add_argument("--triton-version", default=None)
    a = ap.parse_args(argv)
    if a.sample < 1 or a.jobs < 0 or not a.timeout > 0:
        ap.error("--sample >= 1, --jobs >= 0, --timeout > 0")
    try:
        res = bench(a)
    except CodegenError as exc:
        ui.say((f"error: {exc}", "red"), f" ({exc.hint})" if exc.hint else "")
        return exc.exit_code
    sys.stdout.write(json.dumps(res, indent=2, sort_keys=True) + "\n" if a.json else table(res))
    for f in res["failures"]:
        ui.say(("failed: ", "red"), f)
    upstream_ok, precompile_ok = res["upstream"]["ok"], res["precompile"]["ok"]
    return EXIT_UPSTREAM if res["failures"] and (upstream_ok == 0 or precompile_ok == 0) else 0


if __name__ == "__main__":
    sys.exit(main())
