#!/usr/bin/env python3
"""The kernel-compile phase of an image build, side by side in one run on the same applied tree:
upstream's compile.py per kernel vs build's compile service (warm workers), both through real
ninja edges written as upstream's CMake writes them (`write_kernel_ninja`, below), the same
interpreter and Triton; then the service with a cold and a warm kernel cache; and, from the planned kernel
lists alone, what share of one release's kernels another release's cache entries serve.

    python scripts/bench_build_compile.py TREE --spec rules/examples/smoke.yaml --sample 16 --jobs 2 \\
        [--reuse TREE_A TREE_B ...]

    python scripts/bench_build_compile.py --reuse-matrix TREE_A TREE_B ... [--triton-version X] [--json OUT]

Prints a Markdown table (wall, CPU of all child processes, kernels/min, ratio) and whether the
images and sidecars of both routes are byte-identical. `--reuse-matrix` compiles nothing: every
tree (applied from one spec) is planned by its own generator and each release's kernel cache keys
are compared with every other's (the matrix of item 4 of issue 24; docs/measurements.md). The tree is not written to (bytecode of
upstream's route goes to a copy of the driver's sources, as in scripts/bench_precompile.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codegen.compile.service import CompileService  # noqa: E402
from codegen.imagebuild.configure import prepare_venv  # noqa: E402
from codegen.imagebuild.prereq import Toolchain  # noqa: E402
from codegen.apply.applied_spec import resolve_spec  # noqa: E402
from codegen.compile.cache import CompileCache  # noqa: E402
from codegen.plan.run import PlanOptions, run_plan  # noqa: E402
from codegen.plan.tree import release_of  # noqa: E402
from codegen.compile.engine import entry_ident, triton_version  # noqa: E402
from codegen.plan.kernel_list import KernelEntry  # noqa: E402
from codegen.compile.sample import stratified_sample  # noqa: E402


# Upstream's per-kernel build edge, reproduced in a `build.ninja` of its own: the trees'
# v3src/CMakeLists.txt turns each line of the generator's compile list into one ninja edge,
# `cmake -E env VIRTUAL_ENV=VENV TRITON_CACHE_DIR=BUILD/triton-cache TRITON_F32_DEFAULT=ieee
# TRITON_STORE_BINARY_ONLY=1 VENV/bin/python TREE/v3python/compile.py SRC --kernel_name K -o OUT -g 1,1,1
# --num_warps W --num_stages S --waves_per_eu E --target ARCH --signature SIG --timeout 0`, so the
# kernel-compile phase runs through real ninja, both routes, where no HIP toolchain is installed
# (here and in tests/test_build_compile_service.py); `build` itself always runs the tree's own
# CMake-generated build.ninja.
def _esc(text: str) -> str:
    return text.replace("$", "$$")


def kernel_command(tree: Path, compiler: Path, build_dir: Path, venv: Path, e: KernelEntry, cmake: str) -> list[str]:
    return [cmake, "-E", "env", f"VIRTUAL_ENV={venv}", f"TRITON_CACHE_DIR={build_dir / 'triton-cache'}",
            "TRITON_F32_DEFAULT=ieee", "TRITON_STORE_BINARY_ONLY=1", str(venv / "bin" / "python"), str(compiler),
            str(tree / e.source), "--kernel_name", e.kernel_name, "-o", str(build_dir / e.hsaco), "-g", "1,1,1",
            "--num_warps", str(e.config.num_warps), "--num_stages", str(e.config.num_stages),
            "--waves_per_eu", str(e.config.waves_per_eu), "--target", e.config.arch, "--signature", e.signature,
            "--timeout", "0"]


def write_kernel_ninja(build_dir: Path, tree: Path, compiler: Path, venv: Path, entries: list[KernelEntry],
                       cmake: str = "cmake") -> Path:
    """BUILD/build.ninja with one edge per kernel (output: its .hsaco), as upstream's CMake writes them,
    and `install` (the default) over all of them."""
    build_dir = Path(build_dir)
    lines = ["ninja_required_version = 1.5", "rule kernel", "  command = $cmd", "  description = Generating $out", ""]
    outs = []
    for e in entries:
        out = build_dir / e.hsaco
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = " ".join(shlex.quote(a) for a in kernel_command(Path(tree), Path(compiler), build_dir, Path(venv), e,
                                                               cmake))
        outs.append(_esc(str(out)).replace(" ", "$ ").replace(":", "$:"))
        lines += [f"build {outs[-1]}: kernel", f"  cmd = {_esc(cmd)}", ""]
    lines += [f"build install: phony {' '.join(outs)}", "default install", ""]
    path = build_dir / "build.ninja"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


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


def reuse_keys(trees: list[Path], spec: Path | None, version: str) -> dict[str, set[str]]:
    """Each tree's planned kernels (its own generator, the spec applied to it or `spec`) as the
    kernel cache keys precompile and build look them up (codegen.compile.engine.entry_ident),
    by release name. No compile."""
    keys: dict[str, set[str]] = {}
    for t in trees:
        run = run_plan(PlanOptions(tree=t, spec=spec, python=sys.executable))
        keys[release_of(t).release] = {entry_ident(t, e, run.loaded.spec.warp_size, version).key
                                       for e in run.entries}
    return keys


def reuse(keys: dict[str, set[str]]) -> list[str]:
    """One row per ordered pair: release A's kernels, how many release B's cache entries serve."""
    rows = ["| release | kernels | served by the cache of | share |", "|---|---|---|---|"]
    for a in keys:
        for b in keys:
            if a != b:
                common = len(keys[a] & keys[b])
                rows.append(f"| {a} | {len(keys[a])} | {b} | {common} ({_pct(common, len(keys[a]))}) |")
    return rows


def _pct(n: int, total: int) -> str:
    share = 100 * n / max(1, total)
    return f"{share:.0f} %" if share >= 10 or n in (0, total) else f"{share:.1f} %"


def reuse_matrix(keys: dict[str, set[str]]) -> dict:
    """For every release A and every other release B: how many of A's kernels B's cache entries
    serve, and the best others (every B that serves the most, in the given order; none when no B
    serves any)."""
    out = {}
    for a, ka in keys.items():
        served = {b: len(ka & kb) for b, kb in keys.items() if b != a}
        top = max(served.values(), default=0)
        out[a] = {"kernels": len(ka), "served_by": served, "best": [b for b, n in served.items() if n == top and n]}
    return out


def matrix_table(matrix: dict) -> list[str]:
    names = list(matrix)
    rows = ["| release (kernels) | " + " | ".join(f"{b}'s cache" for b in names) + " | best other |",
            "|---|" + "---|" * (len(names) + 1)]
    for a, m in matrix.items():
        cells = [("–" if b == a else f"{m['served_by'][b]} ({_pct(m['served_by'][b], m['kernels'])})")
                 for b in names]
        best = m["best"]
        tail = f"{', '.join(best)}: {_pct(m['served_by'][best[0]], m['kernels'])}" if best else "–"
        rows.append(f"| {a} ({m['kernels']}) | " + " | ".join(cells) + f" | {tail} |")
    return rows


def reuse_matrix_main(a: argparse.Namespace) -> None:
    """--reuse-matrix: plan every tree, print the matrix (and write it as JSON with --json)."""
    version = a.triton_version or triton_version()
    trees = [t.resolve() for t in a.reuse_matrix]
    specs = sorted({f"{s.name} ({s.arch})" for s in (resolve_spec(t, a.spec).spec for t in trees)})
    if len(specs) != 1:
        sys.exit(f"--reuse-matrix: the trees are applied from different specs ({', '.join(specs)}): "
                 "cache keys include the target, so compare one spec's trees")
    matrix = reuse_matrix(reuse_keys(trees, a.spec, version))
    print(f"spec {specs[0]}, kernel cache keys with Triton {version} (the shares do not depend on the version)\n")
    print("\n".join(matrix_table(matrix)))
    if a.json:
        doc = {"spec": specs[0], "triton": version, "releases": matrix}
        a.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path, nargs="?")
    ap.add_argument("--spec", type=Path, default=None)
    ap.add_argument("--sample", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--reuse", type=Path, nargs="*", default=[])
    ap.add_argument("--reuse-matrix", type=Path, nargs="+", metavar="TREE",
                    help="no compile: plan each applied tree and print which release's cache serves which")
    ap.add_argument("--triton-version", help="the Triton version in the keys (--reuse-matrix; default: this Python's)")
    ap.add_argument("--json", type=Path, help="--reuse-matrix: also write the matrix here")
    a = ap.parse_args()
    if a.reuse_matrix:
        return reuse_matrix_main(a)
    if a.tree is None:
        ap.error("give a TREE to bench, or --reuse-matrix TREE...")
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
            print("\n".join(reuse(reuse_keys([t.resolve() for t in a.reuse], a.spec, version))))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
