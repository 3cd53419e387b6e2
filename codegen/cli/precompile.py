"""`mi100-codegen precompile`: options only; the work is in `codegen.compile.precompile`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from codegen.cli import SpecOpt

from codegen.core.preflight import finite, path_option

# one wording for every compiling stage (build's options say the same; docs/toolchain.md)
PYTHON_HELP = ("Interpreter with the spec's Triton and the tree's generator requirements, used read-only "
               "after a version check (default: a build venv of the spec's Triton, created and cached on "
               "first use).")
TRITON_HELP = ("Triton version of the build venv (default: the one the arch's shipped compile report was "
               "measured with, else the newest pip finds that the spec allows).")


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
                                    "compiles; 'dispatched': only those `build --kernels dispatched` compiles."),
    ) -> None:
        """Cross-compile the plan's kernels for the target with Triton and report each kernel's
        resources (registers, LDS, scratch, spills, occupancy, MFMA use) and a verdict per config."""
        from codegen.compile.precompile import PrecompileOptions, run_precompile  # CLI start-up: the stage loads when it runs

        run_precompile(PrecompileOptions(
            aotriton_dir, spec, sample, jobs, json_out, md_out, keep, prune_to, tuning_report, tuning, descend,
            timeout, no_cache, cache_dir, python, rows, triton_version, kernels))
