"""`mi100-codegen plan AOTRITON_DIR`: the kernels `ninja install` would compile for the target."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from .summary import NO_HEAD_DIM, PlanSummary

HEAD_DIM_ENV = "AOTRITON_FLASH_BLOCK_DMODEL"


def run_plan(tree: Path, spec_path: Optional[Path], python: str, tuning: bool):
    """(loaded spec, entries, summary) — shared by plan and precompile."""
    from ..spec import load_spec
    from .kernel_list import generate_kernel_list
    from .summary import summarize
    from .tree import release_of

    loaded = load_spec(spec_path)
    spec = loaded.spec
    info = release_of(tree)
    # as `mi100-codegen build` configures it: fp32 kernels only when the spec lists fp32
    fp32 = {"AOTRITON_ENABLE_FP32": "1" if "fp32" in spec.dtypes else "0"}
    entries = generate_kernel_list(tree, list(spec.gpus), python, tuning=tuning, env=fp32)
    return loaded, entries, summarize(entries, list(spec.gpus), info.release, "tuning" if tuning else "normal")


def family_table(entries, title: str) -> Table:
    cfgs = [e.config for e in entries]
    head_dims = sorted({c.head_dim for c in cfgs if c.head_dim is not None})
    has_none = any(c.head_dim is None for c in cfgs)
    cols = [str(h) for h in head_dims] + ([NO_HEAD_DIM] if has_none else [])
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


def config_table(summary: PlanSummary, limit: int) -> Table:
    t = Table(title=f"kernels per config ({len(summary.by_config)} configs)", title_justify="left")
    t.add_column("config")
    t.add_column("kernels", justify="right")
    items = list(summary.by_config.items())
    for name, n in items[:limit] if limit >= 0 else items:
        t.add_row(name, str(n))
    if 0 <= limit < len(items):
        t.add_row(f"... {len(items) - limit} more (--configs -1 lists all)", "")
    return t


def register(app: typer.Typer, guarded) -> None:
    @app.command()
    @guarded
    def plan(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton tree with the overlay applied."),
        spec: Optional[Path] = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded rules/mi100.yaml)."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        python: str = typer.Option(sys.executable, "--python", help="Python with the tree's generator requirements (pandas, ...)."),
        tuning: bool = typer.Option(False, "--tuning", help="List a tuning build (AOTRITON_BUILD_FOR_TUNING=ON) instead."),
        configs: int = typer.Option(40, "--configs", help="Rows of the per-config table (-1: all)."),
    ) -> None:
        """List the kernels the tree's own generator selects for the target GPUs: total and counts
        by family, head dim, dtype and config. Writes nothing into the tree."""
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        if os.environ.get(HEAD_DIM_ENV):
            err.print(f"[yellow]note:[/] {HEAD_DIM_ENV}={os.environ[HEAD_DIM_ENV]!r} is set: it overrides the "
                      "tree's head dims, as it would for cmake")
        loaded, entries, summary = run_plan(aotriton_dir, spec, python, tuning)
        if as_json:
            sys.stdout.write(json.dumps(summary.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
            return
        out = Console(highlight=False, soft_wrap=True)
        if not out.is_terminal:
            out = Console(highlight=False, soft_wrap=True, width=160)  # logs: no truncated columns
        title = (f"AOTriton {summary.release}, {summary.build} build for {', '.join(summary.gpus)}: "
                 f"{summary.total} kernels, head dims {summary.head_dims}")
        out.print(family_table(entries, title))
        dt = Table(title="kernels per dtype", title_justify="left")
        dt.add_column("dtype")
        dt.add_column("kernels", justify="right")
        for k, v in summary.by_dtype.items():
            dt.add_row(k, str(v))
        out.print(dt)
        out.print(config_table(summary, configs))
        err.print(f"spec {loaded.display}; generator: {python}")
