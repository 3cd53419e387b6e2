"""`mi100-codegen precompile`: parses options, calls `codegen.compile.precompile` and prints its
typed report: the tables on stdout, the totals and failures on stderr."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from codegen.cli import SpecOpt
from codegen.core import ui
from codegen.core.preflight import finite, path_option

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from codegen.compile.report import PrecompileReport

# one wording for every compiling stage (build's options say the same; docs/toolchain.md)
PYTHON_HELP = ("Interpreter with the spec's Triton and the tree's generator requirements, used read-only "
               "after a version check (default: a build venv of the spec's Triton, created and cached on "
               "first use).")
TRITON_HELP = ("Triton version of the build venv (default: the one the arch's shipped compile report was "
               "measured with, else the newest pip finds that the spec allows).")


STYLES = {"ok": "green", "not dispatched": "dim", "failed": "bold red", "spills": "red", "low occupancy": "yellow",
          "no matrix cores": "magenta"}


def summary_table(report: "PrecompileReport", axis: str, title: str, limit: int = -1) -> "Table":
    """One group axis of the report (by_family, by_head_dim, by_dtype, by_config): maxima over the
    group's kernels, except waves/SIMD and MFMA count (minima)."""
    from rich.table import Table  # CLI start-up: rich loads only when the report is printed

    t = Table(title=title, title_justify="left")
    for col, just in (("", "left"), ("n", "right"), ("fail", "right"), ("spill", "right"),
                      ("VGPR", "right"), ("AGPR", "right"), ("SGPR", "right"),
                      ("LDS", "right"), ("scratch", "right"), ("waves", "right"),
                      ("MFMA", "right"), ("dot", "left"), ("verdict", "left")):
        t.add_column(col or axis.replace("by_", "").replace("_", " "), justify=just, no_wrap=True)
    items = list(getattr(report, axis).items())
    shown = items if limit < 0 else items[:limit]

    def c(v):
        return "–" if v is None else str(v)

    for k, s in shown:
        t.add_row(k, c(s.kernels), c(s.failed), c(s.spilling), c(s.max_vgprs), c(s.max_agprs), c(s.max_sgprs),
                  c(s.max_lds_bytes), c(s.max_scratch_bytes), c(s.min_occupancy), c(s.min_mfma),
                  c(s.dot_instructions), f"[{STYLES.get(s.verdict, 'default')}]{s.verdict}[/]")
    if len(shown) < len(items):
        t.add_row(f"... {len(items) - len(shown)} more (see --json/--md)", *[""] * 12)
    return t


def print_report(report: "PrecompileReport", rows: int, err: "Console") -> None:
    out = ui.console(stderr=False, log_width=160)  # logs: no truncated columns
    for axis, title in (("by_family", "by family"), ("by_head_dim", "by head dim"), ("by_dtype", "by dtype")):
        out.print(summary_table(report, axis, title))
    out.print(summary_table(report, "by_config", f"by config ({len(report.by_config)})", rows))
    run, tot = report.run, report.totals
    err.print(f"{run.sampled} kernels in {run.wall_s:.1f} s ({run.compiled_now} compiled, {run.from_cache} cached"
              + (f", {run.kernels_per_min} kernels/min" if run.kernels_per_min else "")
              + f"); failed {tot.failed}, spilling {tot.spilling}; config verdicts: "
              + ", ".join(f"{k} {v}" for k, v in tot.config_verdicts.items()))
    for k in report.kernels:
        if k.status != "ok":
            err.print(f"[red]{k.status}:[/] {k.id}: {k.error}", markup=True)


def register(app: typer.Typer, guarded) -> None:
    @app.command()
    @guarded
    def precompile(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton tree with the overlay applied."),
        spec: Optional[Path] = SpecOpt,
        sample: int = typer.Option(0, "--sample", min=0, help="Compile a deterministic stratified sample of N kernels (0: all)."),
        jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Warm compile workers (0: one per usable CPU)."),
        json_out: Optional[Path] = typer.Option(None, "--json", parser=path_option, metavar="PATH", help="Write the full report (JSON) here."),
        md_out: Optional[Path] = typer.Option(None, "--md", parser=path_option, metavar="PATH", help="Write the report (Markdown) here."),
        keep: Optional[Path] = typer.Option(None, "--keep", parser=path_option, metavar="PATH", help="Keep the code objects (.hsaco) under this dir."),
        prune_to: Optional[Path] = typer.Option(None, "--prune-to", parser=path_option, metavar="PATH", help="Write the spec with exclude rules for configs that fail or spill."),
        tuning_report: Optional[Path] = typer.Option(None, "--tuning-report", parser=path_option, metavar="PATH", help="Write or merge the compile report (config -> resources) into this file (e.g. compile_report.json of tuning/gfx908/)."),
        tuning: bool = typer.Option(False, "--tuning", help="Compile a tuning build's kernel list (the spec's tuning space)."),
        descend: bool = typer.Option(False, "--descend", help="Also compile every spilling config's kernels at lower waves_per_eu until they are spill-free (for --tuning-report: what apply caps seeded rows to)."),
        timeout: float = typer.Option(600.0, "--timeout", min=0.001, callback=finite,
                                     help="Per-kernel timeout in seconds."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the persistent cache."),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", parser=path_option, metavar="PATH", help="Kernel cache (default: kernels/ under $MI100_CODEGEN_CACHE, else under ~/.cache/mi100-codegen)."),
        python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
        triton_version: Optional[str] = typer.Option(None, "--triton-version", help=TRITON_HELP),
        rows: int = typer.Option(30, "--rows", min=-1, help="Rows of the per-config table (-1: all)."),
        kernels: str = typer.Option("all", "--kernels", help="'all' (default): every kernel upstream's build "
                                    "compiles; 'dispatched': only those build compiles with --kernels dispatched."),
    ) -> None:
        """Cross-compile the plan's kernels for the target with Triton and report each kernel's
        resources (registers, LDS, scratch, spills, occupancy, MFMA use) and a verdict per config."""
        # CLI start-up: the stage loads when it runs
        from codegen.compile.precompile import PrecompileOptions, compile_plan, follow_up

        opts = PrecompileOptions(aotriton_dir, spec, sample, jobs, json_out, md_out, keep, prune_to, tuning_report,
                                 tuning, descend, timeout, no_cache, cache_dir, python, triton_version, kernels)
        err = ui.console()
        compiled = compile_plan(opts, err)
        print_report(compiled.report, rows, err)
        follow_up(opts, compiled, err)
