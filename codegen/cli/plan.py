"""`mi100-codegen plan AOTRITON_DIR`: the kernels `ninja install` would compile for the target.
Parses options, calls `codegen.plan.run.plan_tree` and prints its result: tables (or JSON) on
stdout, the time split on stderr."""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from codegen.cli import SpecOpt
from codegen.core import ui

if TYPE_CHECKING:
    from rich.table import Table

    from codegen.plan.summary import PlanSummary

SEEDED, MEASURED = "*", "†"   # the marks of configs outside the spec's tuning space


def family_table(entries, title: str) -> "Table":
    from rich.table import Table  # CLI start-up: rich loads only when the tables are drawn

    from codegen.plan.summary import NO_HEAD_DIM

    cfgs = [e.config for e in entries]
    head_dims = sorted({c.head_dim for c in cfgs if c.head_dim is not None})
    cols = [str(h) for h in head_dims] + ([NO_HEAD_DIM] if any(c.head_dim is None for c in cfgs) else [])
    counts: dict[str, Counter] = defaultdict(Counter)
    dtypes: dict[str, set] = defaultdict(set)
    configs: dict[str, set] = defaultdict(set)
    for c in cfgs:
        counts[c.family][str(c.head_dim) if c.head_dim is not None else NO_HEAD_DIM] += 1
        dtypes[c.family].add(c.dtype)
        configs[c.family].add(c.config_key)
    t = Table(title=title, title_justify="left")
    t.add_column("family", no_wrap=True)
    for c in cols:
        t.add_column(f"d{c}" if c != NO_HEAD_DIM else "no hd", justify="right")
    t.add_column("dtypes")
    t.add_column("configs", justify="right")
    t.add_column("kernels", justify="right", style="bold")
    for fam in sorted(counts):
        t.add_row(fam, *[str(counts[fam].get(c, 0)) for c in cols], ",".join(sorted(dtypes[fam])),
                  str(len(configs[fam])), str(sum(counts[fam].values())))
    t.add_row("total", *[str(sum(counts[f].get(c, 0) for f in counts)) for c in cols], "", "",
              str(len(entries)), style="bold")
    return t


def config_table(summary: "PlanSummary", limit: int) -> "Table":
    """Kernels per config; a config outside the spec's tuning space is marked and its parts outside
    it named (`legend` says what the marks mean)."""
    from rich.table import Table  # CLI start-up: rich loads only when the tables are drawn

    t = Table(title=f"kernels per config ({len(summary.by_config)} configs)", title_justify="left")
    t.add_column("config")
    t.add_column("kernels", justify="right")
    if summary.outside_space:
        t.add_column("outside the spec's space")
    items = list(summary.by_config.items())
    for name, n in items[:limit] if limit >= 0 else items:
        parts = summary.outside_space.get(name)
        mark = "" if parts is None else f" {MEASURED if name in summary.measured_outside else SEEDED}"
        t.add_row(name + mark, str(n), *([", ".join(parts or [])] if summary.outside_space else []))
    if 0 <= limit < len(items):
        t.add_row(f"... {len(items) - limit} more (--configs -1 lists all)", "", *([""] if summary.outside_space else []))
    return t


def legend(summary: "PlanSummary") -> list[str]:
    """What the marks of `config_table` mean, with their counts; [] when no config is marked."""
    seeded = len(summary.outside_space) - len(summary.measured_outside)
    lines = []
    if seeded:
        lines.append(f"{SEEDED} {seeded} of {len(summary.by_config)} configs: from the tuning rows seeded from "
                     f"{summary.seeded_from} (rows.donor_gpu), outside the spec's tuning space")
    if summary.measured_outside:
        lines.append(f"{MEASURED} {len(summary.measured_outside)} configs: measured winners (winners.csv) "
                     "outside the spec's tuning space as it is now")
    return lines


def _print_tables(report, configs: int) -> None:
    from rich.table import Table  # CLI start-up: rich loads only when the tables are drawn

    summary = report.summary
    out = ui.console(stderr=False, log_width=160)  # logs: no truncated columns
    title = (f"AOTriton {summary.release}, {summary.build} build for {', '.join(summary.gpus)}: "
             f"{summary.total} kernels, head dims {summary.head_dims}")
    out.print(family_table(report.entries, title))
    dt = Table(title="kernels per dtype", title_justify="left")
    dt.add_column("dtype")
    dt.add_column("kernels", justify="right")
    for k, v in summary.by_dtype.items():
        dt.add_row(k, str(v))
    out.print(dt)
    out.print(config_table(summary, configs))
    for line in legend(summary):
        out.print(line, markup=False)


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
        from codegen.plan.run import PlanOptions, plan_tree  # CLI start-up: the stage loads when the command runs, not for --help

        err = ui.console()
        report = plan_tree(PlanOptions(aotriton_dir, spec, python, tuning), err)
        for note in report.notes:
            err.print(f"[yellow]note:[/] {note}")
        if as_json:
            doc = {**report.summary.model_dump(mode="json"), "timing": report.timing.as_json()}
            sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        else:
            _print_tables(report, configs)
        t = report.timing
        err.print(f"spec {report.loaded.display}; generator: {report.python}", markup=False)
        err.print(f"time: {t.total_s:.2f} s: upstream's generator {t.upstream_s:.2f} s, mi100-codegen {t.ours_s:.2f} s")
