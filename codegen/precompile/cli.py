"""`mi100-codegen precompile` and `mi100-codegen bench`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from ..errors import EXIT_UPSTREAM


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, transient=False,
    )


def _write(path: Path, text: str) -> None:
    import os
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600
    os.replace(tmp, path)


def _summary_table(report: dict, axis: str, title: str, limit: int = -1) -> Table:
    t = Table(title=title, title_justify="left")
    # maxima over the group's kernels, except waves/SIMD and MFMA count (minima)
    for col, just in (("", "left"), ("n", "right"), ("fail", "right"), ("spill", "right"),
                      ("VGPR", "right"), ("AGPR", "right"), ("SGPR", "right"),
                      ("LDS", "right"), ("scratch", "right"), ("waves", "right"),
                      ("MFMA", "right"), ("verdict", "left")):
        t.add_column(col or axis.replace("by_", "").replace("_", " "), justify=just, no_wrap=True)
    style = {"ok": "green", "failed": "bold red", "spills": "red", "low occupancy": "yellow",
             "no matrix cores": "magenta"}
    items = list(report[axis].items())
    shown = items if limit < 0 else items[:limit]

    def c(v):
        return "–" if v is None else str(v)

    for k, s in shown:
        t.add_row(k, c(s["kernels"]), c(s["failed"]), c(s["spilling"]), c(s["max_vgprs"]), c(s["max_agprs"]),
                  c(s["max_sgprs"]), c(s["max_lds_bytes"]), c(s["max_scratch_bytes"]), c(s["min_occupancy"]),
                  c(s["min_mfma"]), f"[{style.get(s['verdict'], '')}]{s['verdict']}[/]")
    if len(shown) < len(items):
        t.add_row(f"... {len(items) - len(shown)} more (see --json/--md)", *[""] * 11)
    return t


class DescendInterrupted(KeyboardInterrupt):
    def __init__(self, results: list):
        super().__init__()
        self.results = results


def _descend(tree, spec, entries, results, info, triton, previous, jobs, timeout, cache, err) -> list:
    """Rounds of `codegen.precompile.descend`: spilling configs recompiled at lower waves_per_eu."""
    from .descend import plan_round
    from .engine import compile_entries
    from .prune import compile_report
    from .report import worst

    entries, results = list(entries), list(results)
    for rnd in range(1, 11):
        merged = compile_report(results, arch=info.arch, gpu=info.gpu, release=info.release, triton=triton,
                                previous=previous)
        plan = plan_round(entries, results, spec.hardware, merged, info.arch)
        if not plan.entries:
            break
        done: list = []

        def tick(r, progress=None, bar=None):
            done.append(r)
            progress.update(bar, advance=1)

        try:
            with _progress(err) as progress:
                bar = progress.add_task(f"descend {rnd}", total=len(plan.entries), status="")
                sub = compile_entries(tree, plan.entries, spec, jobs=jobs, timeout_s=timeout, cache=cache,
                                      on_progress=lambda r: tick(r, progress, bar))
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


def register(app: typer.Typer, guarded) -> None:
    @app.command()
    @guarded
    def precompile(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton tree with the overlay applied."),
        spec: Optional[Path] = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded one)."),
        sample: int = typer.Option(0, "--sample", help="Compile a deterministic stratified sample of N kernels (0: all)."),
        jobs: int = typer.Option(0, "--jobs", "-j", help="Warm compile workers (0: one per usable CPU)."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Write the full report (JSON) here."),
        md_out: Optional[Path] = typer.Option(None, "--md", help="Write the report (Markdown) here."),
        keep: Optional[Path] = typer.Option(None, "--keep", help="Keep the code objects (.hsaco) under this dir."),
        prune_to: Optional[Path] = typer.Option(None, "--prune-to", help="Write the spec with exclude rules for configs that fail or spill."),
        tuning_report: Optional[Path] = typer.Option(None, "--tuning-report", help="Write/merge the compile report (config -> resources), e.g. tuning/gfx908/compile_report.json."),
        tuning: bool = typer.Option(False, "--tuning", help="Compile a tuning build's kernel list (the spec's tuning space)."),
        descend: bool = typer.Option(False, "--descend", help="Also compile every spilling config's kernels at lower waves_per_eu until they are spill-free (for --tuning-report: what apply caps seeded rows to)."),
        timeout: float = typer.Option(600.0, "--timeout", help="Per-kernel timeout in seconds."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the persistent cache."),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Persistent cache (default: $MI100_CODEGEN_CACHE/precompile or ~/.cache/mi100-codegen/precompile)."),
        python: str = typer.Option(sys.executable, "--python", help="Python with the tree's generator requirements."),
        rows: int = typer.Option(30, "--rows", help="Rows of the per-config table (-1: all)."),
    ) -> None:
        """Cross-compile the plan's kernels for the target with Triton and report each kernel's
        resources (registers, LDS, scratch, spills, occupancy, MFMA use) and a verdict per config."""
        from ..plan.cli import run_plan
        from .cache import CompileCache, default_cache_dir
        from .engine import compile_entries, default_jobs, triton_version
        from .prune import compile_report, prune_rules, prune_spec, write_compile_report
        from .report import RunInfo, report_dict, report_json, report_markdown
        from .sample import stratified_sample

        err = Console(stderr=True, highlight=False, soft_wrap=True)
        triton_version()  # fail early without Triton
        loaded, entries, summary = run_plan(aotriton_dir, spec, python, tuning)
        chosen = stratified_sample(entries, sample)
        jobs = jobs or default_jobs()
        cache = None if no_cache else CompileCache(cache_dir or default_cache_dir())
        err.print(f"AOTriton {summary.release}: {summary.total} kernels planned for {summary.gpu}; "
                  f"compiling {len(chosen)} with {jobs} warm worker(s)"
                  + ("" if cache is None else f", cache {cache.root}"))
        counts = {"ok": 0, "failed": 0, "cached": 0, "spills": 0}

        with _progress(err) as progress:
            bar = progress.add_task("precompile", total=len(chosen), status="")

            def tick(r):
                counts["ok" if r.status == "ok" else "failed"] += 1
                counts["cached"] += r.cached
                counts["spills"] += "spills" in r.verdicts
                progress.update(bar, advance=1, status=f"ok {counts['ok']} failed {counts['failed']} "
                                f"spilling {counts['spills']} cached {counts['cached']}")

            run = compile_entries(aotriton_dir, chosen, loaded.spec, jobs=jobs, timeout_s=timeout,
                                  cache=cache, keep=keep, on_progress=tick)
        info = RunInfo(gpu=summary.gpu, arch=summary.arch, release=summary.release, triton=run.triton,
                       build=summary.build, planned=summary.total, sampled=len(chosen), sample=sample,
                       jobs=jobs, wall_s=round(run.wall_s, 2), compiled_now=run.compiled_now,
                       from_cache=run.from_cache)
        report = report_dict(info, run.results)
        if json_out:
            _write(json_out, report_json(report))
        if md_out:
            _write(md_out, report_markdown(report))
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:
            out = Console(highlight=False, soft_wrap=True, width=160)  # logs: no truncated columns
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
        previous = json.loads(tuning_report.read_text()) if tuning_report and tuning_report.is_file() else None
        all_results = list(run.results)
        interrupted = None
        if descend:
            try:
                all_results = _descend(aotriton_dir, loaded.spec, chosen, all_results, info, run.triton, previous,
                                       jobs, timeout, cache, err)
            except DescendInterrupted as exc:
                all_results, interrupted = exc.results, exc
        if tuning_report:
            write_compile_report(tuning_report, compile_report(
                all_results, arch=info.arch, gpu=info.gpu, release=info.release, triton=run.triton,
                previous=previous))
            err.print(f"wrote {tuning_report}")
        if interrupted is not None:
            raise KeyboardInterrupt
        if prune_to:
            rules, outside = prune_rules(loaded, chosen, run.results, run.triton, info.arch, info.release)
            added = prune_spec(loaded, rules, prune_to)
            err.print(f"wrote {prune_to}: {added} exclude rule(s) added"
                      + (f"; {len(outside)} failing/spilling config(s) are not in the spec's tuning space"
                         " (use --tuning to compile the space)" if outside else ""))

    @app.command()
    @guarded
    def bench(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton tree with the overlay applied."),
        spec: Optional[Path] = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded one)."),
        sample: int = typer.Option(12, "--sample", help="Stratified sample size."),
        jobs: int = typer.Option(0, "--jobs", "-j", help="Parallel compiles on each side (0: one per usable CPU)."),
        timeout: float = typer.Option(600.0, "--timeout", help="Per-kernel timeout in seconds."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
        python: str = typer.Option(sys.executable, "--python", help="Python with Triton (and the generator's requirements)."),
    ) -> None:
        """Throughput of precompile vs. the tree's own compiler (one process per kernel, as its
        build runs it) on the same stratified sample; prints kernels/min and the ratio."""
        from ..plan.cli import run_plan
        from ..plan.tree import release_of
        from .bench import run_bench
        from .engine import default_jobs, triton_version
        from .sample import stratified_sample

        err = Console(stderr=True, highlight=False, soft_wrap=True)
        triton_version()
        loaded, entries, summary = run_plan(aotriton_dir, spec, python, False)
        chosen = stratified_sample(entries, sample)
        jobs = jobs or default_jobs()
        err.print(f"bench: {len(chosen)} of {summary.total} kernels, {jobs} at a time, each side cold")
        with _progress(err) as progress:
            bars = {"upstream": progress.add_task("upstream compile.py", total=len(chosen), status=""),
                    "precompile": progress.add_task("precompile", total=len(chosen), status="", start=False)}

            def done(side: str, _id: str, ok: bool) -> None:
                if side == "precompile" and not progress.tasks[bars[side]].started:
                    progress.start_task(bars[side])
                progress.update(bars[side], advance=1)

            res = run_bench(release_of(aotriton_dir), chosen, loaded.spec, jobs, python, timeout, on_done=done)
        if as_json:
            sys.stdout.write(json.dumps(res.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        else:
            t = Table(title=f"AOTriton {res.release}, Triton {res.triton}, {res.sample} kernels, jobs {res.jobs}",
                      title_justify="left")
            for col in ("compiler", "ok", "wall s", "kernels/min", "CPU s", "kernels/CPU-min"):
                t.add_column(col, justify="left" if col == "compiler" else "right")
            for side in (res.upstream, res.precompile):
                t.add_row(side.name, f"{side.ok}/{side.kernels}", f"{side.wall_s:.1f}", f"{side.kernels_per_min:.1f}",
                          f"{side.cpu_s:.1f}", f"{side.kernels_per_cpu_min:.1f}")
            Console(highlight=False, soft_wrap=True).print(t)
            err.print(f"ratio precompile/upstream: [bold]{res.ratio:.2f}x[/] wall clock, "
                      f"[bold]{res.cpu_ratio:.2f}x[/] per CPU-second")
        for f in res.failures:
            err.print(f"[red]failed:[/] {f}")
        if res.failures and (res.upstream.ok == 0 or res.precompile.ok == 0):
            raise typer.Exit(EXIT_UPSTREAM)
