#!/usr/bin/env python3
"""The kernel-compile phase of an image build, side by side in one run on the same applied tree:
upstream's compile.py per kernel vs build's compile service (warm workers), both through real
ninja edges written as upstream's CMake writes them (codegen.build.edges), the same interpreter
and Triton; then the service with a cold and a warm kernel cache; and, from the planned kernel
lists alone, what share of one release's kernels another release's cache entries serve.

    python scripts/bench_build_compile.py TREE --spec rules/examples/smoke.yaml --sample 16 --jobs 2 \\
        [--reuse TREE_A TREE_B ...]

Prints a Markdown table (wall, CPU of all child processes, kernels/min, ratio) and whether the
images and sidecars of both routes are byte-identical. The tree is not written to (bytecode of
upstream's route goes to a copy of the driver's sources, as in `mi100-codegen bench`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codegen.build.compile_pool import CompileService  # noqa: E402
from codegen.build.configure import prepare_venv  # noqa: E402
from codegen.build.edges import write_kernel_ninja  # noqa: E402
from codegen.build.prereq import Toolchain  # noqa: E402
from codegen.kcache import CompileCache, cache_key  # noqa: E402
from codegen.plan.run import PlanOptions, run_plan  # noqa: E402
from codegen.plan.tree import release_of  # noqa: E402
from codegen.precompile.engine import triton_version  # noqa: E402
from codegen.precompile.sample import stratified_sample  # noqa: E402


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _outputs(b: Path) -> dict[str, str]:
    return {p.relative_to(b).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(b.rglob("*")) if p.suffix in (".hsaco", ".json") and p.parent != b
            and not {"mi100-codegen", "venv", "triton-cache"} & set(p.relative_to(b).parts)}


def _copy_sources(tree: Path, work: Path, entries) -> Path:
    """The driver and the kernels' source folders, so upstream's route writes its bytecode there."""
    info = release_of(tree)
    dest = work / "tree"
    for d in sorted({(tree / e.source).parent for e in entries}):
        shutil.copytree(d, dest / d.relative_to(tree), ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    drv = dest / info.compiler.relative_to(tree)
    drv.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(info.compiler, drv)
    return dest


def _side(name, work, tree, driver, entries, tc, jobs, service=None):
    b = work / name
    b.mkdir()
    venv = prepare_venv(b, tc)
    write_kernel_ninja(b, tree, driver, venv, entries,
                       cmake=shutil.which("cmake") or "cmake")
    env = dict(os.environ)
    cpu0, t0 = _cpu(), time.perf_counter()
    if service is None:
        r = subprocess.run(["ninja", "-C", str(b), "-j", str(jobs)], env=env, capture_output=True, text=True)
        stats = None
    else:
        with service:
            r = subprocess.run(["ninja", "-C", str(b), "-j", str(jobs)], env={**env, **service.env()},
                               capture_output=True, text=True)
        stats = service.stats
    wall, cpu = time.perf_counter() - t0, _cpu() - cpu0
    if r.returncode:
        sys.exit(f"{name}: ninja failed:\n{r.stdout[-3000:]}")
    return {"name": name, "wall": wall, "cpu": cpu, "n": len(entries), "stats": stats, "out": _outputs(b)}


def _json_keys(work: Path, a: str, b: str, rel: str) -> str:
    """For two differing sidecars: which top-level keys differ (the only part of a sidecar the
    image packer reads is shared, num_warps and warp_size)."""
    if not rel.endswith(".json"):
        return ""
    try:
        da, db = (json.loads((work / side / rel).read_text()) for side in (a, b))
    except (OSError, ValueError):
        return ""
    keys = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    return f" (keys: {', '.join(keys)})"


def _row(s, base=None) -> str:
    kpm = s["n"] / s["wall"] * 60
    ratio = f"{base['wall'] / s['wall']:.2f}× wall, {base['cpu'] / s['cpu']:.2f}× CPU" if base else "1 (reference)"
    st = s["stats"]
    served = f"{st.compiled} compiled, {st.cached} cached" if st else f"{s['n']} compiled"
    return f"| {s['name']} | {s['n']} | {served} | {s['wall']:.1f} | {s['cpu']:.1f} | {kpm:.1f} | {ratio} |"


def reuse(trees: list[Path], spec: Path | None, version: str, warp: int) -> list[str]:
    keys = {}
    for t in trees:
        entries = run_plan(PlanOptions(tree=t, spec=spec, python=sys.executable)).entries
        keys[t] = {cache_key(source=str(t / e.source), kernel_name=e.kernel_name, signature=e.signature,
                             num_warps=e.config.num_warps, num_stages=e.config.num_stages,
                             waves_per_eu=e.config.waves_per_eu, arch=e.config.arch, warp_size=warp,
                             triton_version=version) for e in entries}
    rows = ["| release | kernels | served by the cache of | share |", "|---|---|---|---|"]
    for a in trees:
        for b in trees:
            if a != b:
                common = len(keys[a] & keys[b])
                rows.append(f"| {release_of(a).release} | {len(keys[a])} | {release_of(b).release} | "
                            f"{common} ({100 * common / max(1, len(keys[a])):.0f} %) |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reuse", type=Path, nargs="*", default=[])
    a = ap.parse_args()
    run = run_plan(PlanOptions(tree=a.tree, spec=a.spec, python=sys.executable))  # the interpreter both routes use
    loaded, entries = run.loaded, run.entries
    spec = loaded.spec
    sample = stratified_sample(entries, a.sample) if a.sample else entries
    version = triton_version()
    tc = Toolchain(cmake="cmake", cmake_version="", ninja="ninja", ninja_version="", cxx="", cc="", hip_dir=None,
                   hip_version=None, python=sys.executable, site_packages=(sysconfig.get_path("purelib"),))
    work = Path(tempfile.mkdtemp(prefix="mi100-bench-build-"))
    try:
        tree = _copy_sources(a.tree.resolve(), work, sample)
        driver = tree / release_of(a.tree).compiler.relative_to(a.tree.resolve())
        load0 = os.getloadavg()

        def svc(cache):
            return CompileService(jobs=a.jobs, python=sys.executable, triton=version, arch=spec.arch,
                                  warp_size=spec.warp_size, cache=cache)

        up = _side("upstream compile.py per kernel", work, tree, driver, sample, tc, a.jobs)
        warm = _side("warm workers, no cache", work, tree, driver, sample, tc, a.jobs, svc(None))
        cache = CompileCache(work / "kcache")
        cold = _side("warm workers, cold cache", work, tree, driver, sample, tc, a.jobs, svc(cache))
        hot = _side("warm workers, warm cache", work, tree, driver, sample, tc, a.jobs, svc(CompileCache(work / "kcache")))
        load1 = os.getloadavg()
        print(f"AOTriton {release_of(a.tree).release}, spec {loaded.display}, {len(sample)} of {len(entries)} "
              f"kernels (stratified sample), Triton {version}, -j {a.jobs}, {os.cpu_count()} CPUs; load average "
              f"{load0[0]:.1f} before, {load1[0]:.1f} after")
        print("\n| route | kernels | served | wall s | CPU s | kernels/min | vs upstream |")
        print("|---|---|---|---|---|---|---|")
        print(_row(up))
        for s in (warm, cold, hot):
            print(_row(s, up))
        same = up["out"] == warm["out"] == cold["out"] == hot["out"]
        print(f"\nimages and sidecars byte-identical across the four runs: {same} ({len(up['out'])} files)")
        for s in (warm, cold, hot):
            differ = [f for f in sorted(set(up["out"]) | set(s["out"])) if up["out"].get(f) != s["out"].get(f)]
            for f in differ:
                print(f"  differs ({s['name']}): {f}{_json_keys(work, up['name'], s['name'], f)}")
        if a.reuse:
            print()
            print("\n".join(reuse([t.resolve() for t in a.reuse], a.spec, version, spec.warp_size)))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
