"""`mi100-codegen tune AOTRITON_DIR [...]` and `mi100-codegen tune import FILE`.

`tune` is a command group whose default command is `run`: `tune AOTRITON_DIR …` is
`tune run AOTRITON_DIR …`, so both spellings work and `import` stays a subcommand."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from codegen.cli import SpecOpt, add_group
from codegen.core.preflight import finite, iso_date, path_option


class _DefaultRunGroup(TyperGroup):
    """Dispatch `tune ARGS` to `tune run ARGS` unless ARGS starts with a subcommand."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:  # ctx: click.Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


tune_app = typer.Typer(
    cls=_DefaultRunGroup,
    help="Tune the spec's kernel configs on a GPU (tune AOTRITON_DIR ...) or import upstream's "
    "tuning logs (tune import FILE). Results: tuning/<arch>/ beside the spec, where render reads them.",
    no_args_is_help=True,
    add_completion=False,
)


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
    budget_min: Optional[float] = typer.Option(None, "--budget-min", min=0, callback=finite, help="Start no new entry after M minutes (finished entries are kept; --resume continues)."),
    resume: bool = typer.Option(False, "--resume", help="Skip entries already measured in OUT."),
    out: Optional[Path] = typer.Option(None, "--out", parser=path_option, metavar="PATH", help="Results folder (default: tuning/<arch>/ in the spec's home, docs/workspace.md)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List grid entries and candidate configs; touch no GPU."),
    as_json: bool = typer.Option(False, "--json", help="With --dry-run: the plan as JSON on stdout."),
    spec: Optional[Path] = SpecOpt,
    batch: int = typer.Option(4, "--batch", min=1, help="Batch of the timed problem."),
    heads: int = typer.Option(16, "--heads", min=1, help="Heads of the timed problem."),
    warmup_ms: int = typer.Option(10, "--warmup-ms", min=0, help="do_bench warm-up (excluded from the timing)."),
    rep_ms: int = typer.Option(50, "--rep-ms", min=1, help="do_bench measuring time per candidate."),
    compile_jobs: int = typer.Option(-1, "--compile-jobs", min=-1, help="Processes that warm Triton's compile cache first (0: off; default: cores-1, at most 8)."),
    timeout_s: float = typer.Option(120.0, "--timeout-s", min=1, callback=finite, help="Deadline of one candidate (launch, check, timing): past it, its worker is killed and replaced and the candidate recorded as timeout."),
) -> None:
    """Measure every candidate config of the spec's space for each tuning-grid entry."""
    from codegen.gpu.tune.run import TuneOptions, run_tuning  # CLI start-up: the stage loads when the command runs

    run_tuning(TuneOptions(aotriton_dir, device, tuple(family), tuple(head_dim), tuple(dtype), tuple(seqlen),
                           square, causal, dropout, bias, budget_min, resume, out, dry_run, as_json, spec,
                           batch, heads, warmup_ms, rep_ms, compile_jobs, timeout_s))


@tune_app.command("import")
def import_cmd(
    file: Path = typer.Argument(..., help="JSON lines from upstream's test/tune_flash.py --json_file."),
    out: Optional[Path] = typer.Option(None, "--out", parser=path_option, metavar="PATH", help="Results folder (default: tuning/<arch>/ in the spec's home, docs/workspace.md)."),
    spec: Optional[Path] = SpecOpt,
    proxy: bool = typer.Option(False, "--proxy", help="Also import records of other archs, labelled as proxies."),
    date: Optional[str] = typer.Option(None, "--date", callback=iso_date, help="Date to record (YYYY-MM-DD; default: today, UTC)."),
) -> None:
    """Ingest upstream tuning logs (JSON lines) as measurements and winners."""
    from codegen.gpu.tune.run import ImportOptions, run_import  # CLI start-up: the stage loads when the command runs

    run_import(ImportOptions(file, out, spec, proxy, date))


def register(app: typer.Typer, guarded) -> None:
    add_group(app, tune_app, "tune", guarded)   # the group itself has no body
