"""`mi100-codegen tune AOTRITON_DIR [...]` and `mi100-codegen tune import FILE`.

`tune` is a command group whose default command is `run`: `tune AOTRITON_DIR …` is
`tune run AOTRITON_DIR …`, so both spellings work and `import` stays a subcommand."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from ..errors import EXIT_UPSTREAM, UserError

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


class _DefaultRunGroup(TyperGroup):
    """Dispatch `tune ARGS` to `tune run ARGS` unless ARGS starts with a subcommand."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:  # ctx: click.Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


tune_app = typer.Typer(
    cls=_DefaultRunGroup,
    help="Tune the spec's kernel configs on a GPU (tune AOTRITON_DIR …) or import upstream's "
    "tuning logs (tune import FILE). Results: tuning/<arch>/{measurements,winners}.csv.",
    no_args_is_help=True,
    add_completion=False,
)


def _spec(spec: Optional[Path]):
    from ..spec import load_spec

    loaded = load_spec(spec)
    for w in loaded.warnings:
        stderr.print(w, markup=False, style="yellow")
    return loaded


def _out_dir(out: Optional[Path], arch: str) -> Path:
    return out if out is not None else Path("tuning") / arch


def _check_tree(aotriton_dir: Path) -> None:
    if not (aotriton_dir / "tritonsrc" / "flash.py").is_file():
        raise UserError(
            f"{aotriton_dir} has no tritonsrc/flash.py: not an AOTriton source tree (0.10b-0.12b)",
            hint="pass the root of an extracted AOTriton release, e.g. /work/scratch/aotriton-0.11b",
        )


def _today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def _run_impl(aotriton_dir, device, family, head_dim, dtype, seqlen, square, causal, dropout, bias,
              budget_min,
              resume, out, dry_run, as_json, spec, batch, heads, warmup_ms, rep_ms, compile_jobs):
    from .grid import GridFilter, plan_tuning, validate_filter
    from .store import ResultStore

    loaded = _spec(spec)
    sp = loaded.spec
    _check_tree(aotriton_dir)
    flt = GridFilter(tuple(family), tuple(dtype), tuple(head_dim), tuple(seqlen), square, causal,
                     dropout, bias)
    errs = validate_filter(sp, flt)
    if errs:
        raise UserError("\n".join(errs))
    plan = plan_tuning(sp, flt)
    for w in plan.warnings:
        stderr.print(w, markup=False, style="yellow")
    folder = _out_dir(out, sp.arch)
    done = ResultStore(folder).done_entries() if (resume and folder.exists()) else set()
    todo = [e for e in plan.entries if e.name not in done]

    if dry_run:
        if as_json:
            doc = plan.to_json()
            for item in doc["entries"]:
                item["done"] = item["name"] in done
            doc["counts"]["todo"] = len(todo)
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
        return

    if not todo:
        stderr.print(f"[green]nothing to do:[/] all {len(plan.entries)} entries are in {folder}")
        return
    if device:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
        os.environ["HIP_VISIBLE_DEVICES"] = device
    from . import runner

    missing = runner.missing_gpu_stack()
    if missing:
        err = UserError(f"tune measures on a GPU and needs {' and '.join(missing)} "
                        "(--dry-run lists the plan without them)",
                        hint="run it where torch and triton see a GPU")
        err.exit_code = EXIT_UPSTREAM
        raise err
    n_gpus = runner.visible_gpus()
    if n_gpus == 0:
        err = UserError("no GPU visible to torch: tune measures on a GPU (--dry-run lists the plan)")
        err.exit_code = EXIT_UPSTREAM
        raise err
    settings = runner.Settings(batch=batch, heads=heads, warmup_ms=warmup_ms, rep_ms=rep_ms)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + budget_min * 60 if budget_min else None
    with ResultStore(folder) as store:
        if resume and done:
            stderr.print(f"resume: {len(done)} entries already in {folder}, {len(todo)} to measure")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=stderr, transient=False) as prog:
            be = runner.backend_name()
            if compile_jobs > 0:
                jobs = runner.warm_jobs(todo, plan.configs_for, be)
                tw = prog.add_task("compiling", total=len(jobs))
                failures = []

                def warmed(name, err):
                    prog.advance(tw)
                    if err:
                        failures.append((name, err))

                runner.warm_compile(aotriton_dir, jobs, settings, compile_jobs, warmed)
                for name, err in failures:
                    stderr.print(f"compile warm-up: {name}: {err}", markup=False, style="yellow")
            tm = prog.add_task(f"measuring on {n_gpus} GPU(s)", total=len(todo))
            stats = {"winners": 0, "failed": 0}
            budget_hit = False

            def work_items():
                nonlocal budget_hit
                for e in todo:
                    if deadline is not None and time.monotonic() > deadline:
                        budget_hit = True
                        return
                    yield e, plan.configs_for(e)

            def on_result(entry, rows, err):
                if err or not rows:
                    stats["failed"] += 1
                    stderr.print(f"{entry.name}: failed: {err}", markup=False, style="red")
                else:
                    w = store.record(entry, rows, len(rows))
                    stats["winners"] += w is not None
                    if w is None:
                        stats["failed"] += 1
                    best = f"{w['config']} {w['time_ms']:.4f} ms" if w else "no config passed"
                    prog.console.print(f"{entry.name}: {best}", markup=False)
                prog.advance(tm)

            def described():
                for item in work_items():
                    prog.update(tm, description=item[0].name)
                    yield item

            # the budget is checked each time an entry is handed out
            runner.run_entries(aotriton_dir, sp.arch, sp.primary_gpu, described(), settings,
                               n_gpus, on_result)
    left = len(todo) - stats["winners"] - stats["failed"]
    stderr.print(f"wrote {folder}/measurements.csv and winners.csv: {stats['winners']} winners, "
                 f"{stats['failed']} entries without a passing config")
    if budget_hit or left > 0:
        stderr.print(f"[yellow]budget reached:[/] {left} entries left; continue with --resume")


@tune_app.command("run")
def run_cmd(
    aotriton_dir: Path = typer.Argument(..., help="AOTriton source tree (its tritonsrc/ kernels run via Triton)."),
    device: Optional[str] = typer.Option(None, "--device", help="GPU index(es) to use, e.g. 0 or 0,1 (default: all visible; one worker per GPU)."),
    family: List[str] = typer.Option([], "--family", help="Kernel family (repeatable): attn_fwd, bwd_kernel_dk_dv, bwd_kernel_dq, bwd_kernel_fuse."),
    head_dim: List[int] = typer.Option([], "--head-dim", help="Head dim (repeatable; default: the spec's)."),
    dtype: List[str] = typer.Option([], "--dtype", help="fp16, bf16, fp32 (repeatable; default: the spec's)."),
    seqlen: List[int] = typer.Option([], "--seqlen", help="Restrict seqlen_q and seqlen_k to these bins (repeatable)."),
    square: bool = typer.Option(False, "--square", help="Only entries with seqlen_q == seqlen_k."),
    causal: Optional[bool] = typer.Option(None, "--causal/--no-causal", help="Only causal / only non-causal entries (default: both)."),
    dropout: Optional[bool] = typer.Option(None, "--dropout/--no-dropout", help="Only entries with / without dropout (default: the spec's features)."),
    bias: Optional[bool] = typer.Option(None, "--bias/--no-bias", help="Only entries with / without bias (default: the spec's features)."),
    budget_min: Optional[float] = typer.Option(None, "--budget-min", help="Start no new entry after M minutes (finished entries are kept; --resume continues)."),
    resume: bool = typer.Option(False, "--resume", help="Skip entries already measured in OUT."),
    out: Optional[Path] = typer.Option(None, "--out", help="Results folder (default: tuning/<arch>)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List grid entries and candidate configs; touch no GPU."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON on stdout."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded rules/mi100.yaml)."),
    batch: int = typer.Option(4, "--batch", help="Batch of the timed problem."),
    heads: int = typer.Option(16, "--heads", help="Heads of the timed problem."),
    warmup_ms: int = typer.Option(10, "--warmup-ms", help="do_bench warm-up (excluded from the timing)."),
    rep_ms: int = typer.Option(50, "--rep-ms", help="do_bench measuring time per candidate."),
    compile_jobs: int = typer.Option(-1, "--compile-jobs", help="Processes that warm Triton's compile cache first (0: off; default: cores-1, at most 8)."),
) -> None:
    """Measure every candidate config of the spec's space for each tuning-grid entry."""
    if compile_jobs < 0:
        compile_jobs = max(1, min(8, (os.cpu_count() or 2) - 1))
    _run_impl(aotriton_dir, device, family, head_dim, dtype, seqlen, square, causal, dropout, bias,
              budget_min,
              resume, out, dry_run, as_json, spec, batch, heads, warmup_ms, rep_ms, compile_jobs)


def _import_impl(file: Path, out: Optional[Path], spec: Optional[Path], proxy: bool,
                 date: Optional[str]) -> None:
    from .grid import plan_tuning
    from .importer import parse_records
    from .store import ResultStore

    loaded = _spec(spec)
    sp = loaded.spec
    plan = plan_tuning(sp, measurable_only=False)
    space = {k: {c.name for c in v} for k, v in plan.candidates.items()}
    res = parse_records(file, sp, proxy, date or _today(), space)
    for why, n in sorted(res.skipped.items()):
        stderr.print(f"skipped {n} line(s): {why}", markup=False, style="yellow")
    if not res.entries:
        raise UserError(f"{file}: no usable tuning records for {sp.arch}")
    if res.outside_space:
        stderr.print(f"{res.outside_space} measured config(s) are outside the spec's space "
                     "(kept: they are measurements)", style="yellow")
    folder = _out_dir(out, sp.arch)
    winners = 0
    with ResultStore(folder) as store:
        for name in sorted(res.entries):
            entry, rows = res.entries[name]
            winners += store.record(entry, rows, len(rows)) is not None
    stderr.print(f"imported {sum(len(r) for _, r in res.entries.values())} measurements of "
                 f"{len(res.entries)} entries into {folder} ({winners} winners)")


@tune_app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., help="JSON lines from upstream's test/tune_flash.py --json_file."),
    out: Optional[Path] = typer.Option(None, "--out", help="Results folder (default: tuning/<arch>)."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded one)."),
    proxy: bool = typer.Option(False, "--proxy", help="Also import records of other archs, labelled as proxies."),
    date: Optional[str] = typer.Option(None, "--date", help="Date to record (YYYY-MM-DD; default: today, UTC)."),
) -> None:
    """Ingest upstream tuning logs (JSON lines) as measurements and winners."""
    _import_impl(file, out, spec, proxy, date)


def register(app: typer.Typer, guarded) -> None:
    # guard the command bodies (the group itself has no body)
    for cmd in tune_app.registered_commands:
        cmd.callback = guarded(cmd.callback)
    app.add_typer(tune_app, name="tune")
