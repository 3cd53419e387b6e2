"""`mi100-codegen build`: overlay check, prerequisites, configure, ninja, verify, summary."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from rich.console import Console

from codegen.core.errors import UpstreamError, UserError
from codegen.formats.compile_list import count_compiled
from codegen.formats.spec import LoadedSpec
from codegen.models.dtypes import UPSTREAM_BUILDS
from codegen.models.reach import Reach
from codegen.compile.cache import CompileCache, default_cache_dir
from codegen.render.inputs import render_overlay
from codegen.toolchain import generator_requirements
from codegen.toolchain.interpreter import compiler_python
from codegen.upstream import Adapter, detect
from codegen.imagebuild.aiter import place_stand_in, refuse_stand_in
from codegen.imagebuild.configure import (SUPPORT_DIR, BuildRequest, check_generator, configure_env, configure_inputs,
                        configured_fingerprint, plan_configure, prepare_venv, record_fingerprint, write_support_files)
from codegen.apply.applied_spec import resolve_spec
from codegen.apply.lock import read_lock
from codegen.imagebuild.overlay import OverlayState, check_overlay
from codegen.imagebuild.prereq import Toolchain, check_prerequisites
from codegen.plan.reach import check_mode
from codegen.imagebuild.reach import (REACH_FILE, forget, is_current, proven_reach, record_in_prefix,
                                      remove_from_prefix)
from codegen.imagebuild.run import run_cmake, run_ninja
from codegen.compile.client import REACH_ENV
from codegen.compile.service import CompileService, ServiceStats
from codegen.compile.dask import DaskExecutor
from codegen.imagebuild.gpu_check import GpuCheck, GpuCheckError, run_gpu_check
from codegen.imagebuild.verify import Verification, verify_install

LOG_NAME = f"{SUPPORT_DIR}/build.log"


@dataclass(frozen=True)
class ServiceRun:
    """What the compile service did for one ninja run, and the kernel cache it used."""

    stats: ServiceStats
    cache: str | None

    def as_json(self) -> dict:
        return {**asdict(self.stats), "cache": self.cache}


@dataclass
class BuildReport:
    """What `build_tree` did (`codegen.cli.build` prints it; `as_json` is `build --json`)."""

    tree: str
    release: str
    arch: str
    spec: str
    spec_sha256: str
    prefix: str
    build_dir: str
    log: str
    mode: str
    configured: bool = False
    configure_seconds: float = 0.0
    build_seconds: float = 0.0
    wall_seconds: float = 0.0
    kernels_total: int | None = None
    kernels_before: int | None = None
    kernels_compiled: int = 0
    kernels_cached: int = 0          # served from the kernel cache (codegen.compile.cache) by the compile service
    compile_via: str = "workers"
    compile_service: ServiceRun | None = None   # None: upstream's compile.py, or nothing to compile
    edges_total: int = 0
    toolchain: Toolchain | None = None
    hip_compat: bool = False
    verification: Verification | None = None    # the install check (its problems include the GPU check's)
    gpu_check: GpuCheck | None = None           # check_gpu on a stand-in device; None when it could not run
    warnings: list[str] = field(default_factory=list)
    aiter: str | None = None         # what --aiter-stand-in did (codegen.imagebuild.aiter), None without it
    kernels: str = "dispatched"      # --kernels: 'dispatched' (unreachable ones left out) or 'all'
    kernels_left_out: int = 0        # kernels no dispatch table selects, not built (codegen.imagebuild.reach)
    reach: Reach | None = None       # what this configure left out; None with --kernels all

    @property
    def kernels_per_minute(self) -> float | None:
        if self.kernels_compiled and self.build_seconds > 0:
            return round(self.kernels_compiled / (self.build_seconds / 60.0), 1)
        return None

    def as_json(self) -> dict:
        d = dict(self.__dict__)
        d["kernels_per_minute"] = self.kernels_per_minute
        for k in ("configure_seconds", "build_seconds", "wall_seconds"):
            d[k] = round(d[k], 1)
        d["compile_service"] = self.compile_service.as_json() if self.compile_service else {}
        d["toolchain"] = self.toolchain.summary() if self.toolchain else {}
        d["verification"] = self.verification.summary() if self.verification else {}
        if self.gpu_check is not None:
            d["verification"]["gpu_check"] = self.gpu_check.summary()
        d["reach"] = self.reach.summary() if self.reach else {}
        del d["gpu_check"]
        return d


@dataclass(frozen=True)
class BuildOptions:
    """What `mi100-codegen build` was asked for (codegen.cli.build parses it)."""

    tree: Path
    prefix: Path
    build_dir: Path | None = None
    jobs: int = 1
    noimage: bool = False
    for_tuning: bool = False
    python_binding: bool = False
    python: str | None = None       # None: the build venv of the spec's Triton (codegen.toolchain)
    spec_path: Path | None = None
    show_progress: bool = True
    reconfigure: bool = False
    triton_version: str | None = None  # the build venv's Triton (None: the compile report's, else the newest allowed)
    compile_via: str = "workers"    # "workers": the compile service (warm workers + kernel cache); "upstream": compile.py per kernel
    no_cache: bool = False          # the compile service neither reads nor writes the kernel cache
    cache_dir: Path | None = None   # the kernel cache (default codegen.compile.cache.default_cache_dir())
    dask: str | None = None         # a Dask scheduler address, or "local" (codegen.compile.dask)
    hip_prefix: Path | None = None  # HIP from this prefix alone (bundle build's sysroot; prereq._check_hip)
    aiter_stand_in: bool = False    # place an empty, tagged aiter repository (codegen.imagebuild.aiter; offline)
    kernels: str = "dispatched"     # 'dispatched': leave out what no dispatch table selects (codegen.imagebuild.reach); 'all'


COMPILE_ROUTES = ("workers", "upstream")


def build_python(opts: BuildOptions, tree: Path, spec, console: Console) -> str:
    """The interpreter the build configures with: --python as given (check_prerequisites checks its
    Triton), else the cached build venv of the spec's Triton, created on first use."""
    if opts.python is not None:
        if opts.triton_version is not None:
            raise UserError("--triton-version picks the build venv's Triton; with --python the interpreter's "
                            "own Triton is used: pass one of them")
        return opts.python
    compiler = compiler_python(spec, "build", triton=opts.triton_version, console=console,
                               requirements=generator_requirements(tree, opts.python_binding))
    console.print(f"compiler: {compiler.describe()}")
    return compiler.python


def _refuse_request(opts: BuildOptions, tree: Path, loaded, adapter) -> None:
    """Combinations the spec or the tree cannot build, before anything runs."""
    spec = loaded.spec
    if opts.compile_via not in COMPILE_ROUTES:
        raise UserError(f"--compile-via {opts.compile_via!r}: one of {', '.join(COMPILE_ROUTES)}")
    check_mode(opts.kernels)
    if opts.aiter_stand_in and not opts.noimage:
        refuse_stand_in(adapter, spec.arch)
    if opts.dask and opts.compile_via == "upstream":
        raise UserError("--dask runs the compile service's workers elsewhere: it needs --compile-via workers")
    if opts.for_tuning and opts.noimage:
        raise UserError("--for-tuning and --noimage exclude each other (a tuning build is all kernel images)")
    if opts.for_tuning:
        if len(spec.head_dims) < 2:
            raise UserError(f"{loaded.display}: a tuning build needs at least two head dims (upstream "
                            f"0.10b-0.12b drop a one-value axis and crash); this spec has {list(spec.head_dims)}")
        lacking = [d for d in UPSTREAM_BUILDS if d not in spec.dtypes]
        if lacking:
            raise UserError(f"{loaded.display}: a tuning build compiles every dtype upstream builds "
                            f"({', '.join(UPSTREAM_BUILDS)}), "
                            f"but the spec's tuning space has no {', '.join(lacking)} configs")
    triton_src = tree / "third_party" / "triton"
    if (adapter.builds_own_triton and not opts.noimage
            and not any(triton_src.iterdir() if triton_src.is_dir() else [])):
        raise UserError(
            f"{tree}: AOTriton {adapter.release} image builds compile Triton from the third_party/triton "
            f"submodule (there is no option to use an installed Triton before 0.11b), and it is empty",
            hint="check out the submodule (git submodule update --init third_party/triton), use --noimage, "
                 "or build a 0.11b+ tree")


class CheckedTree(NamedTuple):
    """What `check_tree` found: the tree's release record, the spec it builds, the overlay's state."""

    adapter: Adapter
    loaded: LoadedSpec
    state: OverlayState


def check_tree(opts: BuildOptions) -> CheckedTree:
    """The refusals before any work, in this order: the tree's release, the spec
    (`codegen.apply.applied_spec.resolve_spec`), the request's combinations, then the overlay,
    rendered once and compared with the tree."""
    tree = opts.tree.resolve()
    adapter = detect(tree)
    loaded = resolve_spec(tree, opts.spec_path)
    _refuse_request(opts, tree, loaded, adapter)
    manifest = render_overlay(loaded, adapter.layout).manifest_sha256 if read_lock(tree) else None
    state = check_overlay(tree, gpus=list(loaded.spec.gpus), layout=adapter.layout, spec_sha256=loaded.sha256,
                          manifest_sha256=manifest, spec_display=loaded.display)
    return CheckedTree(adapter, loaded, state)


def build_tree(opts: BuildOptions, console: Console, checked: CheckedTree | None = None) -> BuildReport:
    """The `build` command's whole job: checks (`check_tree`, unless the caller made them for
    these options), configure (when needed), ninja install, verify."""
    t_start = time.monotonic()
    tree, prefix = opts.tree.resolve(), opts.prefix.resolve()
    build_dir = (opts.build_dir or tree / "build").resolve()
    adapter, loaded, state = checked or check_tree(opts)
    spec = loaded.spec
    cache = open_cache(opts)  # before any work: a cache others could have written is refused now
    tc = check_prerequisites(tree, lambda: build_python(opts, tree, spec, console), need_triton=not opts.noimage,
                             python_binding=opts.python_binding, spec=spec, min_clang=adapter.min_clang,
                             hip_prefix=opts.hip_prefix)
    req = BuildRequest(tree=tree, prefix=prefix, build_dir=build_dir, jobs=opts.jobs, noimage=opts.noimage,
                       for_tuning=opts.for_tuning, python_binding=opts.python_binding,
                       reach_python=_reach_python(opts), arch=spec.arch,
                       gpus=tuple(spec.gpus), head_dims=tuple(spec.head_dims), fp32="fp32" in spec.dtypes)
    watched = [".mi100-codegen.lock.json", adapter.tuning_db] + ([adapter.op_db] if adapter.op_db else []) \
        + ([adapter.shard_root] if adapter.shard_root else [])
    plan = plan_configure(req, tc, adapter, state.upstream_commit,
                          inputs=configure_inputs(tree, watched))
    report = BuildReport(
        tree=str(tree), release=adapter.release, arch=spec.arch, spec=loaded.display, spec_sha256=loaded.sha256,
        prefix=str(prefix), build_dir=str(build_dir), log=str(build_dir / LOG_NAME),
        mode="noimage" if opts.noimage else ("tuning" if opts.for_tuning else "images"),
        toolchain=tc, hip_compat=tc.needs_hip_compat, warnings=list(loaded.warnings) + list(tc.warnings),
    )
    if opts.aiter_stand_in and not opts.noimage:
        report.aiter = place_stand_in(tree, build_dir, adapter, spec.arch)
        console.print(f"aiter: {report.aiter} ({build_dir / 'v3src' / 'aiter'}; {spec.arch} reads none of "
                      f"aiter's kernels)", markup=False)
    if adapter.clones_aiter and not opts.noimage and not (build_dir / "v3src" / "aiter").is_dir():
        report.warnings.append(f"AOTriton {adapter.release} clones https://github.com/ROCm/aiter.git at configure time "
                               "(network needed, or pre-place the clone in BUILD_DIR/v3src/aiter)")
    for w in report.warnings:
        console.print(w, style="yellow", markup=False)
    reach = _configure_and_build(opts, build_dir, plan, tc, report, console, spec, cache)
    report.kernels = "dispatched" if req.reach_python else "all"
    if reach is not None:
        report.reach = reach
        report.kernels_left_out = reach.kernels_left_out
        if not opts.noimage:
            remove_from_prefix(prefix, reach)
    if not opts.noimage:
        record_in_prefix(prefix, reach)
    ver = verify_install(prefix, build_dir, version=adapter.version, arch=spec.arch, v3_api=adapter.exports_v3_api,
                         v2_attn=adapter.exports_v2_attn, image_format=adapter.image_format, names=adapter.image_names,
                         images=not opts.noimage, reach=reach)
    report.verification = ver
    _gpu_check(report, ver, spec, tc, build_dir, console)
    report.wall_seconds = time.monotonic() - t_start
    return report


def _reach_python(opts: BuildOptions) -> str | None:
    """The interpreter the generator hook runs codegen.imagebuild.reach with (None: every kernel is
    built: --kernels all, or a tuning build, which compiles every config on purpose)."""
    if opts.kernels != "dispatched" or opts.for_tuning:
        return None
    if any(c in sys.executable for c in "\"'$`\\\n"):
        raise UserError(f"mi100-codegen runs from {sys.executable!r}, a path CMake's environment cannot carry",
                        hint="run it from a path without quotes, $, ` or backslashes, or pass --kernels all")
    return sys.executable


def _gpu_check(report: BuildReport, ver: Verification, spec, tc, build_dir: Path, console: Console) -> None:
    """check_gpu of the installed library on a stand-in device of the spec's arch (codegen.imagebuild.gpu_check).
    A wrong answer is a verification problem; a check that cannot run is a warning."""
    lib = Path(ver.library)
    if not lib.is_file():
        return
    try:
        check = run_gpu_check(lib, arch=spec.arch, like=spec.registration.like,
                              compute_units=spec.hardware.compute_units, warp_size=spec.warp_size, cxx=tc.cxx,
                              hip_dir=tc.hip_dir, work=build_dir / SUPPORT_DIR / "gpu_check")
    except GpuCheckError as exc:
        report.warnings.append(f"GPU check skipped: {exc}")
        console.print(report.warnings[-1], style="yellow", markup=False)
        return
    report.gpu_check = check
    ver.problems.extend(check.problems)


def open_cache(opts: BuildOptions) -> CompileCache | None:
    """The kernel cache the compile service reads and fills (None: upstream's route, or --no-cache)."""
    if opts.noimage or opts.compile_via == "upstream" or opts.no_cache:
        return None
    return CompileCache(opts.cache_dir or default_cache_dir())


def compile_service(opts: BuildOptions, tc, spec, cache: CompileCache | None):
    """The compile service for this build's ninja (codegen.compile.service), or None for
    upstream's per-kernel compile.py."""
    if opts.noimage or opts.compile_via == "upstream":
        return None
    executor = None
    if opts.dask:
        executor = DaskExecutor(opts.dask, jobs=opts.jobs, python=tc.python, triton=tc.triton_version)
    return CompileService(jobs=opts.jobs, python=tc.python, triton=tc.triton_version or "", arch=spec.arch,
                          warp_size=spec.warp_size, cache=cache, executor=executor)


def _configure_and_build(opts: BuildOptions, build_dir: Path, plan, tc, report: BuildReport,
                         console: Console, spec=None, cache: CompileCache | None = None):
    """Configure when needed, then ninja; returns what the configure left out (codegen.imagebuild.reach;
    None with --kernels all)."""
    build_dir.mkdir(parents=True, exist_ok=True)
    check_generator(build_dir)
    log_path = build_dir / LOG_NAME
    prepare_venv(build_dir, tc)
    write_support_files(plan, build_dir)
    env = configure_env(plan)
    leaves_out = REACH_ENV in dict(plan.knobs)
    if opts.reconfigure or (leaves_out and not is_current(build_dir)) \
            or configured_fingerprint(build_dir) != plan.fingerprint:
        forget(build_dir)  # the generator hook writes it again when this configure leaves kernels out
        report.configure_seconds = run_cmake(plan.cmake_args(opts.tree.resolve(), build_dir), env=env,
                                             log_path=log_path, console=console, cmake=tc.cmake)
        report.configured = True
    # the record is computed again from the generator's output, never believed (codegen.imagebuild.reach)
    reach = proven_reach(build_dir, opts.tree) if leaves_out else None
    if leaves_out and reach is None:   # only after a configure: a current record skips it
        raise UpstreamError(f"CMake configured {build_dir} but the generator's run left no "
                            f"{build_dir / REACH_FILE} (the build venv's hook did not run)",
                            hint=f"see {log_path}; --kernels all builds every kernel without it")
    if report.configured:
        record_fingerprint(plan, build_dir)
    if reach is not None and not opts.noimage:
        console.print(f"left out {reach.kernels_left_out} of {reach.fused_kernels} fused backward kernels: "
                      f"the backward op table never selects them (--kernels all builds them)"
                      if reach.kernels_left_out else f"every kernel is built: {reach.reason}", markup=False)
    if not opts.noimage:
        report.kernels_total, report.kernels_before = count_compiled(build_dir / "v3src")
    if report.kernels_total and report.kernels_before:
        console.print(f"resuming: {report.kernels_before} of {report.kernels_total} kernels already compiled")
    elif report.kernels_total:
        console.print(f"{report.kernels_total} kernels to compile")
    report.compile_via = "upstream" if opts.noimage else opts.compile_via
    remaining = (report.kernels_total or 0) - (report.kernels_before or 0)
    service = compile_service(opts, tc, spec, cache) if remaining > 0 else None
    if service is None:
        res = run_ninja(build_dir, jobs=opts.jobs, target="install", env=env, log_path=log_path, console=console,
                        ninja=tc.ninja, show_progress=opts.show_progress)
    else:
        with service:
            res = run_ninja(build_dir, jobs=opts.jobs, target="install", env={**env, **service.env()},
                            log_path=log_path, console=console, ninja=tc.ninja, show_progress=opts.show_progress,
                            kernel_counts=lambda: (service.stats.compiled, service.stats.cached, remaining))
        report.kernels_cached = service.stats.cached
        report.compile_service = ServiceRun(service.stats, None if service.cache is None else str(service.cache.root))
    report.build_seconds = res.seconds
    total_after, done_after = count_compiled(build_dir / "v3src") if not opts.noimage else (None, None)
    report.kernels_total = total_after if total_after is not None else report.kernels_total
    if done_after is not None:  # files on disk, not status lines: exact across interruptions
        report.kernels_compiled = max(0, done_after - (report.kernels_before or 0) - report.kernels_cached)
    else:
        report.kernels_compiled = res.kernels_compiled
    report.edges_total = res.edges_total
    return proven_reach(build_dir, opts.tree) if leaves_out else None   # again: ninja may have configured again
