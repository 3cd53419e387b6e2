"""`mi100-codegen validate [--kernels TREE]`: options only; the work is in `codegen.gpu.validate.run`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from codegen.cli import SpecOpt

from codegen.core.preflight import path_option


def register(app: typer.Typer, guarded) -> None:
    @app.command("validate")
    @guarded
    def validate(
        spec: Optional[Path] = SpecOpt,
        json_out: Optional[Path] = typer.Option(None, "--json", parser=path_option, metavar="PATH", help="Write the JSON report here."),
        md_out: Optional[Path] = typer.Option(None, "--md", parser=path_option, metavar="PATH", help="Write the Markdown report here."),
        kernels: Optional[Path] = typer.Option(None, "--kernels", help="Run the Triton kernels of this AOTriton "
                                               "source tree (TREE/tritonsrc) with the spec's configs instead of SDPA."),
        backend: list[str] = typer.Option(["flash", "efficient"], "--backend", help="SDPA backends to force."),
        jobs: int = typer.Option(0, "--jobs", min=0, help="--kernels: parallel worker processes (0: one per CPU, max 16)."),
        family: list[str] = typer.Option([], "--family", help="--kernels: only these kernel families."),
        no_perf: bool = typer.Option(False, "--no-perf", help="Skip the speed / memory measurement."),
        seed: int = typer.Option(0, "--seed", help="Random seed of the inputs."),
    ) -> None:
        """On the current GPU: prove AOTriton's flash attention runs and is correct (exit 3 on failure)."""
        from codegen.gpu.validate.run import ValidateOptions, run_validate  # CLI start-up: the stage loads when it runs

        run_validate(ValidateOptions(spec, json_out, md_out, kernels, tuple(backend), jobs, tuple(family),
                                     no_perf, seed))
