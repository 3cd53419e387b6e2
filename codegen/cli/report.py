"""`mi100-codegen report`: options only; the work is in `codegen.gpu.report.collect`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from codegen.cli import SpecOpt


def register(app: typer.Typer, guarded) -> None:
    @app.command("report")
    @guarded
    def report(
        out: Path = typer.Option(Path("mi100-codegen-report.md"), "--out", help="The report file to write."),
        spec: Optional[Path] = SpecOpt,
        no_perf: bool = typer.Option(False, "--no-perf", help="Skip validate's speed / memory table."),
        seed: int = typer.Option(0, "--seed", help="Random seed of validate's inputs."),
    ) -> None:
        """On a card: collect the environment, torch status and validate's results into one file to send back."""
        from codegen.gpu.report.collect import ReportOptions, run_report  # CLI start-up: the stage (validate included) loads when it runs

        run_report(ReportOptions(out, spec, no_perf, seed))
