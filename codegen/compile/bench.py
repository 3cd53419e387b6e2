"""Throughput: our warm-worker precompile vs. the tree's own per-kernel compiler invocation.

Upstream's build runs one `python v3python/compile.py SRC --kernel_name ... --signature ...`
process per kernel (ninja -jJ). The bench runs exactly that for a sample, J at a time, then our
pool of J warm workers on the same sample, each side with a fresh Triton cache and no
persistent cache, and reports kernels/min for both (wall clock), and kernels per CPU-minute
(user+sys of every process of the side): on a shared machine the CPU figure is the robust one. The tree is not touched: the compiler driver
and the Triton sources are run from a temporary copy (so bytecode is written there, as a real
build would write it into its tree).
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict

from codegen.core import processes
from codegen.core.errors import UpstreamError
from codegen.models import TargetSpec
from codegen.plan.kernel_list import KernelEntry
from codegen.plan.tree import TreeInfo
from codegen.toolchain.interpreter import CompilerPython
from codegen.compile.engine import compile_entries, triton_version

KILL_GRACE_S = 60.0  # past --timeout, an upstream compile (its driver enforces the limit itself) is killed


class BenchSide(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    kernels: int
    ok: int
    wall_s: float
    kernels_per_min: float
    cpu_s: float              # user+sys CPU of all the side's processes (robust on a shared host)
    kernels_per_cpu_min: float


class BenchResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    release: str
    triton: str
    jobs: int
    sample: int
    upstream: BenchSide
    precompile: BenchSide
    ratio: float              # wall-clock kernels/min, precompile / upstream
    cpu_ratio: float          # kernels per CPU-minute, precompile / upstream
    failures: list[str]


def _side(name: str, n: int, ok: int, wall: float, cpu: float) -> BenchSide:
    return BenchSide(name=name, kernels=n, ok=ok, wall_s=round(wall, 2),
                     kernels_per_min=round(n / wall * 60, 1) if wall > 0 else 0.0,
                     cpu_s=round(cpu, 2), kernels_per_cpu_min=round(n / cpu * 60, 1) if cpu > 0 else 0.0)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_upstream(info: TreeInfo, entries: list[KernelEntry], jobs: int, python: str, timeout_s: float,
                 on_done: Callable[[KernelEntry, bool], None] | None = None) -> tuple[float, int, list[str]]:
    """One compiler process per kernel, `jobs` at a time, as the tree's CMake rule runs them."""
    work = Path(tempfile.mkdtemp(prefix="mi100-codegen-bench-upstream-"))
    running: list[tuple[subprocess.Popen, KernelEntry, float]] = []
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
        env = dict(os.environ)
        env.update({"TRITON_CACHE_DIR": str(work / "triton-cache"), "TRITON_F32_DEFAULT": "ieee",
                    "TRITON_STORE_BINARY_ONLY": "1"})
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
                if on_done:
                    on_done(e, good)
        return time.perf_counter() - t0, ok, failures
    finally:
        for proc, _e, _t in running:  # Ctrl-C or an error: no compile outlives the bench
            processes.kill_group(proc)
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def run_bench(info: TreeInfo, entries: list[KernelEntry], spec: TargetSpec, jobs: int, compiler: CompilerPython,
              timeout_s: float, on_done: Callable[[str, str, bool], None] | None = None) -> BenchResult:
    """Both compilers with the same Triton: the tree's compile.py run by `compiler.python`, our
    workers in that interpreter too."""
    if not info.compiler.is_file():
        raise UpstreamError(f"{info.compiler}: the tree's compiler driver is missing")
    version = triton_version(compiler)
    python = compiler.python
    cpu0 = _children_cpu()
    up_wall, up_ok, failures = run_upstream(
        info, entries, jobs, python, timeout_s,
        (lambda e, good: on_done("upstream", e.id, good)) if on_done else None)
    cpu1 = _children_cpu()
    ours = compile_entries(
        info.root, entries, spec, jobs=jobs, timeout_s=timeout_s, cache=None,
        on_progress=(lambda r: on_done("precompile", r.id, r.status == "ok")) if on_done else None,
        compiler=compiler)
    cpu2 = _children_cpu()
    failures += [f"precompile {r.id}: {r.error}" for r in ours.results if r.status != "ok"]
    up = _side("upstream compile.py (one process per kernel)", len(entries), up_ok, up_wall, cpu1 - cpu0)
    me = _side("mi100-codegen precompile (warm workers)", len(entries),
               sum(r.status == "ok" for r in ours.results), ours.wall_s, cpu2 - cpu1)
    return BenchResult(release=info.release, triton=version, jobs=jobs, sample=len(entries),
                       upstream=up, precompile=me,
                       ratio=round(me.kernels_per_min / up.kernels_per_min, 2) if up.kernels_per_min else 0.0,
                       cpu_ratio=round(me.kernels_per_cpu_min / up.kernels_per_cpu_min, 2)
                       if up.kernels_per_cpu_min else 0.0,
                       failures=sorted(failures))


__all__ = ["BenchResult", "BenchSide", "run_bench", "run_upstream"]
