"""What `mi100-codegen tune` and `tune import` do, given their options (`codegen.cli.tune` only
parses them): plan the tuning grid, measure on the GPU(s) or import logs, record results."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.progress import Progress

from codegen.core import preflight, ui
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.apply.applied_spec import resolve_spec
from codegen.core.resources import display_path
from codegen.formats.tuning_csv import MEASUREMENTS_FILE, read_csv
from codegen.render.workspace import shipped_dir, writable_results_dir
from codegen.toolchain import installed_triton_version, require_triton, tune_fix
from codegen.gpu.tune import runner
from codegen.gpu.tune.estimate import cost_model, schedule, summary_line
from codegen.gpu.tune.grid import GridFilter, group_effective, plan_tuning, validate_filter
from codegen.gpu.tune.importer import parse_records
from codegen.gpu.tune.store import ResultStore
from codegen.upstream import kernel_dirs_text, kernel_source_dir

stderr = ui.console()


@dataclass(frozen=True)
class TuneOptions:
    tree: Path
    device: str | None = None
    family: tuple[str, ...] = ()
    head_dim: tuple[int, ...] = ()
    dtype: tuple[str, ...] = ()
    seqlen: tuple[int, ...] = ()
    square: bool = False
    causal: bool | None = None
    dropout: bool | None = None
    bias: bool | None = None
    budget_min: float | None = None
    resume: bool = False
    out: Path | None = None
    dry_run: bool = False
    as_json: bool = False
    spec: Path | None = None
    batch: int = 4
    heads: int = 16
    warmup_ms: int = 10
    rep_ms: int = 50
    compile_jobs: int = -1          # -1: cores-1, at most 8; 0: off
    timeout_s: float = 120.0        # one candidate's deadline

    def grid_filter(self) -> GridFilter:
        return GridFilter(self.family, self.dtype, self.head_dim, self.seqlen, self.square, self.causal,
                          self.dropout, self.bias)

    def settings(self) -> runner.Settings:
        return runner.Settings(batch=self.batch, heads=self.heads, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms,
                               timeout_s=self.timeout_s)


@dataclass(frozen=True)
class ImportOptions:
    file: Path
    out: Path | None = None
    spec: Path | None = None
    proxy: bool = False
    date: str | None = None


def _spec(spec: Path | None, tree: Path | None = None):
    """The spec: for a tree mi100-codegen applied, the one it recorded (`--spec` must match it)."""
    loaded = resolve_spec(tree, spec)
    ui.warn(loaded.warnings)
    return loaded


def _out_dir(out: Path | None, loaded) -> Path:
    """--out, else the spec's results folder, the one render reads (codegen.render.workspace)."""
    return out if out is not None else writable_results_dir(loaded)


def _check_tree(aotriton_dir: Path) -> None:
    src = kernel_source_dir(aotriton_dir)
    if src is None or not (src / "flash.py").is_file():
        raise UserError(
            f"{aotriton_dir} has no {kernel_dirs_text()}: not an AOTriton source tree",
            hint="pass the root of an extracted AOTriton release, e.g. /work/scratch/aotriton-0.11b",
        )


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def _estimate(opts: TuneOptions, sp, plan, todo: list, folder: Path, devices: int, backend: str | None):
    """(the schedule: entries longest first and each device's share, the plan line) from the rows
    measured in `folder` so far, else the proxy's table shipped for the arch. backend None (a
    dry run, no torch): every candidate counted as measured, as on AMD."""
    measured = read_csv(folder / MEASUREMENTS_FILE) if (folder / MEASUREMENTS_FILE).is_file() else []
    shipped = shipped_dir(sp.arch)
    proxy_file = shipped / MEASUREMENTS_FILE if shipped is not None else None
    proxy = read_csv(proxy_file) if proxy_file is not None and proxy_file.is_file() else []
    label = f"the proxy's table {display_path(proxy_file)}" if proxy else ""
    model = cost_model(measured, proxy, label, warmup_ms=opts.warmup_ms, rep_ms=opts.rep_ms,
                       batch_heads=opts.batch * opts.heads)

    def n_measured(e) -> int:
        configs = plan.configs_for(e)
        return len(configs) if backend is None else len(group_effective(configs, backend))

    budget_s = opts.budget_min * 60 if opts.budget_min is not None else None
    sched = schedule(todo, lambda e: model.entry_s(e, n_measured(e)), devices, budget_s)
    n_cand = sum(len(plan.configs_for(e)) for e in todo)
    return sched, summary_line(len(todo), n_cand, sched, model, opts.budget_min)


def run_tuning(opts: TuneOptions) -> None:
    """Measure every candidate config of each grid entry still to do (or list them: --dry-run)."""
    preflight.output_dir(opts.out, "--out")
    loaded = _spec(opts.spec, opts.tree)
    sp = loaded.spec
    _check_tree(opts.tree)
    errs = validate_filter(sp, opts.grid_filter())
    if errs:
        raise UserError("\n".join(errs))
    plan = plan_tuning(sp, opts.grid_filter())
    folder = _out_dir(opts.out, loaded)
    done = ResultStore(folder).done_entries() if (opts.resume and folder.exists()) else set()
    todo = [e for e in plan.entries if e.name not in done]
    if opts.dry_run:
        n_dev = len(opts.device.split(",")) if opts.device else 1
        sched, line = _estimate(opts, sp, plan, todo, folder, n_dev, None)
        stderr.print(line, markup=False)
        stderr.print(f"spec {loaded.display}; results: {folder}", markup=False)
        _print_dry_run(plan, done, todo, folder, opts.as_json, sched)
        return
    if not todo:
        stderr.print(f"spec {loaded.display}; results: {folder}", markup=False)
        stderr.print(f"[green]nothing to do:[/] all {len(plan.entries)} entries are in {folder}")
        return
    if opts.device:
        os.environ["CUDA_VISIBLE_DEVICES"] = opts.device
        os.environ["HIP_VISIBLE_DEVICES"] = opts.device
    missing = runner.missing_gpu_stack()
    if missing:
        raise EnvironmentMissing(f"tune measures on a GPU and needs {' and '.join(missing)} "
                                 "(--dry-run lists the plan without them)",
                                 hint="run it where torch and triton see a GPU")
    require_triton(sp, installed_triton_version(), "tune", sys.executable, hint=tune_fix(sp))
    n_gpus = runner.visible_gpus()
    if n_gpus == 0:
        raise EnvironmentMissing("no GPU visible to torch: tune measures on a GPU (--dry-run lists the plan)")
    sched, line = _estimate(opts, sp, plan, todo, folder, n_gpus, runner.backend_name())
    stderr.print(line, markup=False)
    stderr.print(f"spec {loaded.display}; results: {folder}", markup=False)
    with ResultStore(folder) as store:
        if opts.resume and done:
            stderr.print(f"resume: {len(done)} entries already in {folder}, {len(todo)} to measure")
        stats = _measure(opts, sp, plan, sched, store, list(range(n_gpus)))
    _print_summary(stats, folder, len(todo))


def _print_summary(stats: dict, folder: Path, n_todo: int) -> None:
    left = n_todo - stats["winners"] - stats["failed"]
    stderr.print(f"wrote {folder}/measurements.csv and winners.csv: {stats['winners']} winners, "
                 f"{stats['failed']} entries without a passing config")
    slots = stats.get("slots") or []
    timeouts, crashes = sum(s.timeouts for s in slots), sum(s.crashes for s in slots)
    if timeouts or crashes:
        stderr.print(f"[yellow]{timeouts} candidate(s) timed out, {crashes} crashed their worker[/] "
                     "(recorded as timeout/crash, never winners; the worker was replaced each time)")
    for s in slots:
        name = s.info.get("device", "?") if isinstance(s.info, dict) else "?"
        stderr.print(f"device {s.slot} ({name}): {s.jobs} entries, {s.steps} kernels timed or checked "
                     f"in {s.busy_s:.1f} s", markup=False)
    if stats["budget_hit"] or left > 0:
        stderr.print(f"[yellow]budget reached:[/] {left} entries left; continue with --resume")


def _print_dry_run(plan, done: set, todo: list, folder: Path, as_json: bool, sched) -> None:
    if as_json:
        doc = plan.to_json()
        for item in doc["entries"]:
            item["done"] = item["name"] in done
        doc["counts"]["todo"] = len(todo)
        doc["estimate"] = {"seconds": round(sched.total_s, 1),
                           "per_device_s": [round(x, 1) for x in sched.loads_s]}
        doc["out"] = folder.as_posix()
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        for e in plan.entries:
            mark = "done " if e.name in done else "todo "
            sys.stdout.write(f"{mark}{e.name}\n")
            for c in plan.configs_for(e):
                sys.stdout.write(f"       {c.name}\n")
    stderr.print(f"{len(plan.entries)} grid entries ({len(todo)} to measure), "
                 f"{plan.total_measurements} candidate measurements; nothing run (--dry-run)")


def _compile_jobs(requested: int) -> int:
    return requested if requested >= 0 else runner.default_compile_workers()


def _warm(opts: TuneOptions, plan, todo: list, settings, prog: Progress) -> None:
    """Fill Triton's compile cache with every candidate first (parallel, on the CPU)."""
    jobs = runner.warm_jobs(todo, plan.configs_for, runner.backend_name())
    tw = prog.add_task("compiling", total=len(jobs))
    failures = []

    def warmed(name, err):
        prog.advance(tw)
        if err:
            failures.append((name, err))

    runner.warm_compile(opts.tree, jobs, settings, _compile_jobs(opts.compile_jobs), warmed)
    for name, err in failures:
        stderr.print(f"compile warm-up: {name}: {err}", markup=False, style="yellow")


def _measure(opts: TuneOptions, sp, plan, sched, store: ResultStore, devices: list[int]) -> dict:
    settings = opts.settings()
    deadline = time.monotonic() + opts.budget_min * 60 if opts.budget_min else None
    stats = {"winners": 0, "failed": 0, "budget_hit": False}

    def budget_hit() -> bool:  # checked each time an entry is handed out
        stats["budget_hit"] = stats["budget_hit"] or (deadline is not None and time.monotonic() > deadline)
        return stats["budget_hit"]

    with ui.progress(stderr, label="{task.description}", remaining=False) as prog:
        tm = []

        def meanwhile(_pool):  # while the measuring workers start
            if _compile_jobs(opts.compile_jobs) > 0:
                _warm(opts, plan, sched.order, settings, prog)
            tm.append(prog.add_task(f"measuring on {len(devices)} GPU(s)", total=len(sched.order)))

        def on_result(entry, rows, err, device):
            where = f" (device {device})" if len(devices) > 1 else ""
            if err or not rows:
                stats["failed"] += 1
                stderr.print(f"{entry.name}: failed{where}: {err}", markup=False, style="red")
            else:
                w = store.record(entry, rows, len(rows))
                stats["winners"] += w is not None
                if w is None:
                    stats["failed"] += 1
                best = f"{w['config']} {w['time_ms']:.4f} ms" if w else "no config passed"
                prog.console.print(f"{entry.name}: {best}{where}", markup=False)
            prog.update(tm[0], description=entry.name, advance=1)

        stats["slots"] = runner.run_entries(opts.tree, sp.arch, sp.primary_gpu,
                                            [(e, plan.configs_for(e)) for e in sched.order], settings, devices,
                                            on_result, cost=sched.costs.get, stop=budget_hit, meanwhile=meanwhile)
    return stats


def run_import(opts: ImportOptions) -> None:
    """Upstream tuning logs (JSON lines) -> measurements and winners of the spec's arch."""
    preflight.input_file(opts.file, "FILE")
    preflight.output_dir(opts.out, "--out")
    loaded = _spec(opts.spec)
    sp = loaded.spec
    plan = plan_tuning(sp)
    space = {k: {c.name for c in v} for k, v in plan.candidates.items()}
    res = parse_records(opts.file, sp, opts.proxy, opts.date or _today(), space)
    for why, n in sorted(res.skipped.items()):
        stderr.print(f"skipped {n} line(s): {why}", markup=False, style="yellow")
    if not res.entries:
        raise UserError(f"{opts.file}: no usable tuning records for {sp.arch}")
    if res.outside_space:
        stderr.print(f"{res.outside_space} measured config(s) are outside the spec's space "
                     "(kept: they are measurements)", style="yellow")
    folder = _out_dir(opts.out, loaded)
    winners = 0
    with ResultStore(folder) as store:
        for name in sorted(res.entries):
            entry, rows = res.entries[name]
            winners += store.record(entry, rows, len(rows)) is not None
    stderr.print(f"imported {sum(len(r) for _, r in res.entries.values())} measurements of "
                 f"{len(res.entries)} entries into {folder} ({winners} winners)")
