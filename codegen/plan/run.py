"""What `mi100-codegen plan` does, given its options (`codegen.cli.plan` only parses them); `run_plan`
is shared with precompile and bench."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console
from rich.table import Table

from codegen.core import preflight, ui
from codegen.apply.applied_spec import resolve_spec
from codegen.formats.spec import LoadedSpec
from codegen.upstream.knobs import ENABLE_FP32_ENV
from codegen.plan.reach import dispatched_entries
from codegen.plan.kernel_list import generate_kernel_list
from codegen.plan.summary import NO_HEAD_DIM, PlanSummary, summarize
from codegen.plan.tree import check_registered, release_of

HEAD_DIM_ENV = "AOTRITON_FLASH_BLOCK_DMODEL"


@dataclass(frozen=True)
class PlanOptions:
    tree: Path
    spec: Path | None = None
    python: str | None = None  # None: the build venv precompile and build use (codegen.toolchain)
    tuning: bool = False
    as_json: bool = False
    configs: int = 40       # rows of the per-config table; -1: all
    kernels: str = "all"    # 'dispatched': only what build --kernels dispatched compiles (codegen.imagebuild.reach)
    build_dir: Path | None = None  # keep the generator's output (its v3src) in this new folder; None: thrown away


@dataclass(frozen=True)
class PlanTiming:
    """Where plan's time goes: upstream's generator (and its database composition) vs. ours."""

    total_s: float
    upstream_s: float

    @property
    def ours_s(self) -> float:
        return max(0.0, self.total_s - self.upstream_s)

    def as_json(self) -> dict:
        return {"total_s": round(self.total_s, 3), "upstream_s": round(self.upstream_s, 3),
                "ours_s": round(self.ours_s, 3)}


def generator_python(tree: Path, spec, python: str | None, console: Console | None = None) -> str:
    """The interpreter that runs the tree's generator: `python` as given, else the cached build venv
    of precompile and build (the spec's Triton and the tree's generator requirements, created on
    first use), so a plain `pip install mi100-codegen` is enough to plan."""
    if python is not None:
        return preflight.interpreter(python)
    # CLI start-up: the toolchain loads only when plan needs the build venv
    from codegen.toolchain import generator_requirements
    from codegen.toolchain.interpreter import compiler_python

    return compiler_python(spec, "plan", requirements=generator_requirements(tree), console=console).python


class PlanRun(NamedTuple):
    """What `run_plan` found: the spec it used, the kernel list, its summary, the tree's release
    record and the interpreter that ran the generator."""

    loaded: Any
    entries: list
    summary: Any
    release: Any
    python: str


def run_plan(opts: PlanOptions, timing: dict | None = None, console: Console | None = None,
             loaded: LoadedSpec | None = None) -> PlanRun:
    """The spec, kernels, summary, release record and generator python (`PlanRun`). Refusals (bad interpreter, bad spec,
    unknown release, a target the tree does not register) come before the build venv is made and
    upstream's generator runs. `timing` receives `upstream_s`; `loaded`: the spec, when the caller
    resolved it for `opts` already (precompile, bench)."""
    if opts.python is not None:
        preflight.interpreter(opts.python)
    loaded = loaded or resolve_spec(opts.tree, opts.spec)
    spec = loaded.spec
    info = release_of(opts.tree)
    check_registered(info, list(spec.gpus), spec.arch)
    python = generator_python(opts.tree, spec, opts.python, console)
    # as `mi100-codegen build` configures it: fp32 kernels only when the spec lists fp32
    fp32 = {ENABLE_FP32_ENV: "1" if "fp32" in spec.dtypes else "0"}
    if opts.kernels == "dispatched" and not opts.tuning:
        entries = _dispatched(opts.tree, spec, python, fp32, timing, console, opts.build_dir)
    else:
        entries = generate_kernel_list(opts.tree, list(spec.gpus), python, arch=spec.arch, tuning=opts.tuning,
                                       env=fp32, timing=timing, keep_build_dir=opts.build_dir)
    return PlanRun(loaded, entries, summarize(entries, list(spec.gpus), info.release,
                                              "tuning" if opts.tuning else "normal"), info.adapter, python)


def generate_dispatched(tree: Path, spec, python: str, env: dict, timing: dict | None = None,
                        keep: Path | None = None):
    """(every kernel the generator lists, those `build --kernels dispatched` compiles, the
    codegen.plan.reach record): the tables it wrote prove what no dispatch table selects. `keep`:
    the generator's output stays in that new folder (else a throwaway one)."""
    with tempfile.TemporaryDirectory(prefix="mi100-codegen-plan-") as tmp:
        v3src = keep or Path(tmp) / "build" / "v3src"
        entries = generate_kernel_list(tree, list(spec.gpus), python, arch=spec.arch, env=env, timing=timing,
                                       keep_build_dir=v3src)
        kept, reach = dispatched_entries(entries, v3src, tree)
    return entries, kept, reach


def _dispatched(tree: Path, spec, python: str, env: dict, timing: dict | None, console: Console | None,
                keep: Path | None) -> list:
    entries, kept, reach = generate_dispatched(tree, spec, python, env, timing, keep)
    if console is not None:
        console.print(f"--kernels dispatched: {len(entries) - len(kept)} of {len(entries)} kernels left out "
                      f"({reach.reason or 'the backward op table never selects them'})", markup=False)
    return kept


def show_plan(opts: PlanOptions) -> None:
    """`plan`: the counts as tables (or JSON) on stdout; the time split on stderr."""
    err = ui.console()
    if os.environ.get(HEAD_DIM_ENV):
        err.print(f"[yellow]note:[/] {HEAD_DIM_ENV}={os.environ[HEAD_DIM_ENV]!r} is set: it overrides the "
                  "tree's head dims, as it would for cmake")
    start, clock = time.perf_counter(), {}
    loaded, entries, summary, _release, python = run_plan(opts, clock, err)
    timing = PlanTiming(time.perf_counter() - start, clock.get("upstream_s", 0.0))
    if opts.as_json:
        doc = {**summary.model_dump(mode="json"), "timing": timing.as_json()}
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    else:
        _print_tables(entries, summary, opts.configs)
    err.print(f"spec {loaded.display}; generator: {python}", markup=False)
    err.print(f"time: {timing.total_s:.2f} s: upstream's generator {timing.upstream_s:.2f} s, "
              f"mi100-codegen {timing.ours_s:.2f} s")


def _print_tables(entries, summary: PlanSummary, configs: int) -> None:
    out = ui.console(stderr=False, log_width=160)  # logs: no truncated columns
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
