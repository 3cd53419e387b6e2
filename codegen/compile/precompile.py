"""What `mi100-codegen precompile` and `bench` do, given their options (`codegen.cli.precompile`
only parses them): plan the tree's kernels, cross-compile them, print and write the reports."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from codegen.core import preflight, ui
from codegen.core.errors import EXIT_UPSTREAM, CodegenError, UserError
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
from codegen.compile.bench import run_bench
from codegen.compile.cache import CompileCache, check_cache_dir, default_cache_dir
from codegen.compile.descend import plan_round
from codegen.compile.prune import compile_report, prune_rules, prune_spec, write_compile_report
from codegen.compile.report import RunInfo, report_dict, report_json, report_markdown, worst
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
    rows: int = 30                  # -1: all
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


@dataclass(frozen=True)
class BenchOptions:
    tree: Path
    spec: Path | None = None
    sample: int = 12
    jobs: int = 0
    timeout: float = 600.0
    as_json: bool = False
    python: str | None = None       # None: the build venv of the spec's Triton
    triton_version: str | None = None


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


class BenchFailed(CodegenError):
    exit_code = EXIT_UPSTREAM


def _summary_table(report: dict, axis: str, title: str, limit: int = -1) -> Table:
    t = Table(title=title, title_justify="left")
    # maxima over the group's kernels, except waves/SIMD and MFMA count (minima)
    for col, just in (("", "left"), ("n", "right"), ("fail", "right"), ("spill", "right"),
                      ("VGPR", "right"), ("AGPR", "right"), ("SGPR", "right"),
                      ("LDS", "right"), ("scratch", "right"), ("waves", "right"),
                      ("MFMA", "right"), ("dot", "left"), ("verdict", "left")):
        t.add_column(col or axis.replace("by_", "").replace("_", " "), justify=just, no_wrap=True)
    style = {"ok": "green", "not dispatched": "dim", "failed": "bold red", "spills": "red",
             "low occupancy": "yellow", "no matrix cores": "magenta"}
    items = list(report[axis].items())
    shown = items if limit < 0 else items[:limit]

    def c(v):
        return "–" if v is None else str(v)

    for k, s in shown:
        t.add_row(k, c(s["kernels"]), c(s["failed"]), c(s["spilling"]), c(s["max_vgprs"]), c(s["max_agprs"]),
                  c(s["max_sgprs"]), c(s["max_lds_bytes"]), c(s["max_scratch_bytes"]), c(s["min_occupancy"]),
                  c(s["min_mfma"]), c(s.get("dot_instructions")), f"[{style.get(s['verdict'], 'default')}]{s['verdict']}[/]")
    if len(shown) < len(items):
        t.add_row(f"... {len(items) - len(shown)} more (see --json/--md)", *[""] * 12)
    return t


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
            want: dict[str, int] = {}
            for e in plan.entries:
                want[e.config.name] = want.get(e.config.name, 0) + 1
            got: dict[str, int] = {}
            for r in done:
                got[r.config] = got.get(r.config, 0) + 1
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


def run_precompile(opts: PrecompileOptions) -> None:
    """Cross-compile the plan's kernels (a sample of them) and report; see docs/precompile.md."""
    opts.check()
    cache = None if opts.no_cache else CompileCache(opts.cache_dir or default_cache_dir())  # opened before any work
    err = ui.console()
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
    report = report_dict(info, run.results)
    if opts.json_out:
        atomic_write(opts.json_out, report_json(report))
    if opts.md_out:
        atomic_write(opts.md_out, report_markdown(report))
    _print_report(report, info, run, opts.rows, err)
    _after_compile(opts, loaded, chosen, run, info, jobs, cache, err, compiler)


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


def _print_report(report: dict, info: RunInfo, run, rows: int, err: Console) -> None:
    out = ui.console(stderr=False, log_width=160)  # logs: no truncated columns
    for axis, title in (("by_family", "by family"), ("by_head_dim", "by head dim"), ("by_dtype", "by dtype")):
        out.print(_summary_table(report, axis, title))
    out.print(_summary_table(report, "by_config", f"by config ({len(report['by_config'])})", rows))
    tot = report["totals"]
    err.print(f"{info.sampled} kernels in {info.wall_s:.1f} s ({run.compiled_now} compiled, "
              f"{run.from_cache} cached"
              + (f", {report['run']['kernels_per_min']} kernels/min" if report["run"]["kernels_per_min"] else "")
              + f"); failed {tot['failed']}, spilling {tot['spilling']}; config verdicts: "
              + ", ".join(f"{k} {v}" for k, v in tot["config_verdicts"].items()))
    for k in report["kernels"]:
        if k["status"] != "ok":
            err.print(f"[red]{k['status']}:[/] {k['id']}: {k['error']}", markup=True)


def _after_compile(opts: PrecompileOptions, loaded, chosen: list, run, info: RunInfo, jobs: int, cache,
                   err: Console, compiler: CompilerPython | None = None) -> None:
    """--descend, --tuning-report and --prune-to: what the compile results feed."""
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


def run_bench_command(opts: BenchOptions) -> None:
    """precompile vs. the tree's own compiler on one stratified sample; exit 3 when a side failed."""
    if opts.python is not None:
        preflight.interpreter(opts.python)
    else:
        preflight.cache_folder("toolchain")  # the build venv
    err = ui.console()
    loaded, compiler = compiler_for(opts.tree, opts.spec, opts.python, opts.triton_version, "precompile bench", err)
    loaded, entries, summary, _release, _ = run_plan(PlanOptions(opts.tree, opts.spec, compiler.python, False),
                                                     loaded=loaded)
    chosen = stratified_sample(entries, opts.sample)
    jobs = opts.jobs or engine.default_jobs()
    err.print(f"bench: {len(chosen)} of {summary.total} kernels, {jobs} at a time, each side cold")
    with ui.progress(err, detail="{task.fields[status]}") as progress:
        bars = {"upstream": progress.add_task("upstream compile.py", total=len(chosen), status=""),
                "precompile": progress.add_task("precompile", total=len(chosen), status="", start=False)}

        def done(side: str, _id: str, ok: bool) -> None:
            if side == "precompile" and not progress.tasks[bars[side]].started:
                progress.start_task(bars[side])
            progress.update(bars[side], advance=1)

        res = run_bench(release_of(opts.tree), chosen, loaded.spec, jobs, compiler, opts.timeout, on_done=done)
    if opts.as_json:
        sys.stdout.write(json.dumps(res.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    else:
        _print_bench(res, err)
    for f in res.failures:
        err.print(f"[red]failed:[/] {f}")
    if res.failures and (res.upstream.ok == 0 or res.precompile.ok == 0):
        raise BenchFailed(f"bench: {'upstream' if res.upstream.ok == 0 else 'precompile'} compiled no kernel")


def _print_bench(res, err: Console) -> None:
    t = Table(title=f"AOTriton {res.release}, Triton {res.triton}, {res.sample} kernels, jobs {res.jobs}",
              title_justify="left")
    for col in ("compiler", "ok", "wall s", "kernels/min", "CPU s", "kernels/CPU-min"):
        t.add_column(col, justify="left" if col == "compiler" else "right")
    for side in (res.upstream, res.precompile):
        t.add_row(side.name, f"{side.ok}/{side.kernels}", f"{side.wall_s:.1f}", f"{side.kernels_per_min:.1f}",
                  f"{side.cpu_s:.1f}", f"{side.kernels_per_cpu_min:.1f}")
    ui.console(stderr=False).print(t)
    err.print(f"ratio precompile/upstream: [bold]{res.ratio:.2f}x[/] wall clock, "
              f"[bold]{res.cpu_ratio:.2f}x[/] per CPU-second")
