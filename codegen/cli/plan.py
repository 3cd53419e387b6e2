"""`mi100-codegen plan AOTRITON_DIR`: the kernels `ninja install` would compile for the target.
Parses options only; `codegen.plan.run.show_plan` does the work."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from codegen.cli import SpecOpt


def register(app: typer.Typer, guarded) -> None:
    @app.command()
    @guarded
    def plan(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton tree with the overlay applied."),
        spec: Optional[Path] = SpecOpt,
        as_json: bool = typer.Option(False, "--json", help="Print the summary (and the time split) as JSON on stdout."),
        python: Optional[str] = typer.Option(None, "--python", help="Python with the tree's generator requirements (default: the build venv precompile uses, created and cached on first use)."),
        tuning: bool = typer.Option(False, "--tuning", help="List a tuning build (AOTRITON_BUILD_FOR_TUNING=ON) instead."),
        configs: int = typer.Option(40, "--configs", min=-1, help="Rows of the per-config table (-1: all)."),
    ) -> None:
        """List the kernels the tree's own generator selects for the target GPUs: total and counts
        by family, head dim, dtype and config. Writes nothing into the tree."""
        from codegen.plan.run import PlanOptions, show_plan  # CLI start-up: the stage loads when the command runs, not for --help

        show_plan(PlanOptions(aotriton_dir, spec, python, tuning, as_json, configs))
