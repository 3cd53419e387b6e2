"""What `mi100-codegen precompile` does, given its options: plan the tree's kernels,
cross-compile them and write the reports (`compile_plan`, whose typed report `codegen.cli.precompile`
prints), then what the results feed (`follow_up`: --descend, --tuning-report, --prune-to)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from codegen.core import preflight, ui
from codegen.core.errors import UserError
from codegen.core.fsutil import atomic_write
from codegen.models.rows import splits_backward
from codegen.render.inputs import read_compile_report
from codegen.plan.reach import check_mode
from codegen.plan.run import PlanOptions, run_plan
from codegen.plan.tree import check_registered, release_of
from codegen.apply.applied_spec import resolve_spec
from codegen.formats.spec import LoadedSpec
from codegen.toolchain import generator_requirements
from codegen.toolchain.interpreter import CompilerPython, compiler_python
from codegen.upstream import Adapter
from codegen.upstream.releases import by_release
from codegen.compile import engine
from codegen.compile.cache import CompileCache, check_cache_dir, default_cache_dir
from codegen.compile.descend import plan_round
from codegen.compile.prune import compile_report, prune_rules, prune_spec, write_compile_report
from codegen.compile.report import (PrecompileReport, RunInfo, precompile_report, report_json, report_markdown,
                                   worst)
from codegen.compile.sample import stratified_sample


@dataclass(frozen=True)
class PrecompileOptions:
    tree: Path
    spec: Path | None = None
    sample: int = 0                 # 0: every kernel
    jobs: int = 0                   # 0: one per usable CPU
    json_out: Path | None = None
    md_out: Path | None = None
    keep: Path | None = None
    prune_to: Path | None = None
    tuning_report: Path | None = None
    tuning: bool = False
    descend: bool = False
    timeout: float = 600.0
    no_cache: bool = False
    cache_dir: Path | None = None
    python: str | None = None       # None: the build venv of the spec's Triton (codegen.toolchain)
    triton_version: str | None = None  # the build venv's Triton (None: the compile report's, else the newest allowed)
    kernels: str = "all"            # 'dispatched': only what build --kernels dispatched compiles

    def check(self) -> None:
        """Every path option, before the generator or a compile runs."""
        check_mode(self.kernels)
        if self.kernels == "dispatched" and (self.tuning or self.tuning_report is not None):
            raise UserError("--kernels dispatched compiles a build's kernels less those it leaves out: not a "
                            "tuning build's list, and a compile report needs every config (--tuning/--tuning-report)")
        if self.python is not None:
            preflight.interpreter(self.python)
        for path, option in ((self.json_out, "--json"), (self.md_out, "--md"), (self.prune_to, "--prune-to"),
                             (self.tuning_report, "--tuning-report")):
            preflight.output_file(path, option)
        preflight.output_dir(self.keep, "--keep")
        if not self.no_cache:
            preflight.output_dir(self.cache_dir, "--cache-dir")
            if self.cache_dir is None:
                preflight.cache_folder("kernels")  # codegen.compile.cache.default_cache_dir
            check_cache_dir(self.cache_dir or default_cache_dir())  # trusted storage
        if self.python is None:
            preflight.cache_folder("toolchain")  # the build venv
        if self.tuning_report is not None:
            read_compile_report(self.tuning_report)  # merged into after the compile: refused now, not then


def compiler_for(tree: Path, spec_path: Path | None, python: str | None, triton: str | None, stage: str,
                 err: Console) -> tuple[LoadedSpec, CompilerPython]:
    """Refusals of the tree and the spec first (cheap, nothing created), then the Python that compiles:
    the build venv (created on first use) or --python after its Triton check; with the spec."""
    loaded = resolve_spec(tree, spec_path)
    spec = loaded.spec
    check_registered(release_of(tree), list(spec.gpus), spec.arch)
    compiler = compiler_python(spec, stage, python=python, triton=triton,
                               requirements=generator_requirements(tree), console=err, same_python=True)
    err.print(f"compiler: {compiler.describe()}")
    return loaded, compiler


class DescendInterrupted(KeyboardInterrupt):
    def __init__(self, results: list):
        super().__init__()
        self.results = results


def _descend(tree, spec, entries, results, info, triton, previous, jobs, timeout, cache, err,
             compiler: CompilerPython | None = None) -> list:
    """Rounds of `codegen.compile.descend`: spilling configs recompiled at lower waves_per_eu."""
    entries, results = list(entries), list(results)
    for rnd in range(1, 11):
        merged = compile_report(results, arch=info.arch, gpu=info.gpu, release=info.release, triton=triton,
                                previous=previous)
        plan = plan_round(entries, results, spec.hardware, merged, info.arch, by_release(info.release).image_names)
        if not plan.entries:
            break
        done: list = []

        def tick(r, progress=None, bar=None):
            done.append(r)
            progress.update(bar, advance=1)

        try:
            with ui.progress(err, detail="{task.fields[status]}") as progress:
                bar = progress.add_task(f"descend {rnd}", total=len(plan.entries), status="")
                sub = engine.compile_entries(tree, plan.entries, spec, jobs=jobs, timeout_s=timeout, cache=cache,
                                             on_progress=lambda r: tick(r, progress, bar), compiler=compiler)
        except KeyboardInterrupt:
            # keep the variants whose kernels all finished (a partial variant's verdict would
            # speak for kernels never compiled); the caller writes the report, then exits 130
            want, got = Counter(e.config.name for e in plan.entries), Counter(r.config for r in done)
            complete = [r for r in done if got[r.config] == want[r.config]]
            err.print(f"descend round {rnd} interrupted: keeping {len(complete)} of {len(done)} finished kernel(s) "
                      f"(complete variants only)")
            raise DescendInterrupted(results + complete) from None
        entries += plan.entries
        results += sub.results
        verdict = {}
        for r in results:
            verdict.setdefault(r.config, []).extend(r.verdicts)
        targets = sorted(set(plan.moves.values()))
        still = [c for c in targets if worst(verdict.get(c, [])) in ("spills", "failed")]
        err.print(f"descend round {rnd}: {len(plan.moves)} spilling config(s) -> {len(targets)} lower variant(s), "
                  f"{len(plan.entries)} kernel(s) ({sub.compiled_now} compiled, {sub.from_cache} cached, "
                  f"{sub.wall_s:.1f} s); still spilling: {len(still)}")
    stuck = sorted({r.config for r in results if "spills" in r.verdicts and r.waves_per_eu <= 1})
    for c in stuck:
        err.print(f"[red]spills even at waves_per_eu=1:[/] {c}", markup=True)
    return results


@dataclass(frozen=True)
class Compiled:
    """What `compile_plan` did: the report (written to --json and --md already) and what its
    follow-ups (`follow_up`: --descend, --tuning-report, --prune-to) take from the run."""

    report: PrecompileReport
    loaded: LoadedSpec
    chosen: list
    run: engine.CompileRun
    jobs: int
    cache: CompileCache | None
    compiler: CompilerPython


def compile_plan(opts: PrecompileOptions, err: Console) -> Compiled:
    """Cross-compile the plan's kernels (a sample of them) and report; see docs/precompile.md.
    `err`: where the build venv, the plan and the compile report their progress."""
    opts.check()
    cache = None if opts.no_cache else CompileCache(opts.cache_dir or default_cache_dir())  # opened before any work
    loaded, compiler = compiler_for(opts.tree, opts.spec, opts.python, opts.triton_version, "precompile", err)
    loaded, entries, summary, release, _ = run_plan(PlanOptions(opts.tree, opts.spec, compiler.python, opts.tuning,
                                                                kernels=opts.kernels), console=err, loaded=loaded)
    chosen = stratified_sample(entries, opts.sample)
    jobs = opts.jobs or engine.default_jobs()
    err.print(f"AOTriton {summary.release}: {summary.total} kernels planned for {summary.gpu}; "
              f"compiling {len(chosen)} with {jobs} warm worker(s)"
              + ("" if cache is None else f", cache {cache.root}"))
    err.print(f"spec {loaded.display}", markup=False)
    run = _compile(opts, loaded.spec, chosen, jobs, cache, err, compiler)
    run.results = mark_not_dispatched(run.results, loaded.spec, release)
    info = RunInfo(gpu=summary.gpu, arch=summary.arch, release=summary.release, triton=run.triton,
                   build=summary.build, planned=summary.total, sampled=len(chosen), sample=opts.sample,
                   jobs=jobs, wall_s=round(run.wall_s, 2), compiled_now=run.compiled_now,
                   from_cache=run.from_cache)
    report = precompile_report(info, run.results)
    if opts.json_out:
        atomic_write(opts.json_out, report_json(report))
    if opts.md_out:
        atomic_write(opts.md_out, report_markdown(report))
    return Compiled(report, loaded, chosen, run, jobs, cache, compiler)


def mark_not_dispatched(results: list, spec, release: Adapter) -> list:
    """Fused-backward kernels of the passes rows.split_backward routes to the split backend are
    compiled (upstream compiles every backend) but never run: their verdict is 'not dispatched'.
    Only where the release has an op database to route with (0.11b and later)."""
    rules = spec.rows.split_backward
    if not rules or release.op_db is None:
        return results
    return [r.model_copy(update={"dispatched": False})
            if r.family == "bwd_kernel_fuse" and splits_backward(rules, r.dtype, r.head_dim) else r
            for r in results]


def _compile(opts: PrecompileOptions, spec, chosen: list, jobs: int, cache, err: Console,
             compiler: CompilerPython):
    counts = {"ok": 0, "failed": 0, "cached": 0, "spills": 0}
    with ui.progress(err, detail="{task.fields[status]}") as progress:
        bar = progress.add_task("precompile", total=len(chosen), status="")

        def tick(r):
            counts["ok" if r.status == "ok" else "failed"] += 1
            counts["cached"] += r.cached
            counts["spills"] += "spills" in r.verdicts
            progress.update(bar, advance=1, status=f"ok {counts['ok']} failed {counts['failed']} "
                            f"spilling {counts['spills']} cached {counts['cached']}")

        return engine.compile_entries(opts.tree, chosen, spec, jobs=jobs, timeout_s=opts.timeout,
                                      cache=cache, keep=opts.keep, on_progress=tick, compiler=compiler)


def follow_up(opts: PrecompileOptions, compiled: Compiled, err: Console) -> None:
    """--descend, --tuning-report and --prune-to: what the compile results feed."""
    loaded, chosen, run, info = compiled.loaded, compiled.chosen, compiled.run, compiled.report.run
    jobs, cache, compiler = compiled.jobs, compiled.cache, compiled.compiler
    report_path = opts.tuning_report
    previous = read_compile_report(report_path) if report_path else None
    all_results = list(run.results)
    interrupted = None
    if opts.descend:
        try:
            all_results = _descend(opts.tree, loaded.spec, chosen, all_results, info, run.triton, previous,
                                   jobs, opts.timeout, cache, err, compiler)
        except DescendInterrupted as exc:
            all_results, interrupted = exc.results, exc
    if report_path:
        write_compile_report(report_path, compile_report(
            all_results, arch=info.arch, gpu=info.gpu, release=info.release, triton=run.triton,
            previous=previous))
        err.print(f"wrote {report_path}")
    if interrupted is not None:
        raise KeyboardInterrupt
    if opts.prune_to:
        rules, outside = prune_rules(loaded, chosen, run.results, run.triton, info.arch, info.release)
        added = prune_spec(loaded, rules, opts.prune_to)
        err.print(f"wrote {opts.prune_to}: {added} exclude rule(s) added"
                  + (f"; {len(outside)} failing/spilling config(s) are not in the spec's tuning space"
                     " (use --tuning to compile the space)" if outside else ""))
