"""What `mi100-codegen plan` does, given its options: `plan_tree` returns the typed result
(`PlanReport`) that `codegen.cli.plan` renders; `run_plan` is shared with precompile and bundle
verify."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from codegen.core import preflight
from codegen.apply.applied_spec import resolve_spec
from codegen.formats.spec import LoadedSpec
from codegen.upstream.knobs import ENABLE_FP32_ENV, HEAD_DIMS_ENV
from codegen.plan.reach import dispatched_entries
from codegen.plan.kernel_list import generate_kernel_list
from codegen.plan.summary import PlanSummary, summarize
from codegen.plan.tree import check_registered, release_of
from codegen.render.inputs import load_winners

if TYPE_CHECKING:
    from rich.console import Console


@dataclass(frozen=True)
class PlanOptions:
    tree: Path
    spec: Path | None = None
    python: str | None = None  # None: the build venv precompile and build use (codegen.toolchain)
    tuning: bool = False
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


def generator_python(tree: Path, spec, python: str | None, console: "Console | None" = None) -> str:
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


def run_plan(opts: PlanOptions, timing: dict | None = None, console: "Console | None" = None,
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
    measured = frozenset(w.config for w in load_winners(loaded))  # the target's rows that were not seeded
    return PlanRun(loaded, entries, summarize(entries, list(spec.gpus), info.release, "tuning" if opts.tuning
                                              else "normal", spec, measured), info.adapter, python)


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


def _dispatched(tree: Path, spec, python: str, env: dict, timing: dict | None, console: "Console | None",
                keep: Path | None) -> list:
    entries, kept, reach = generate_dispatched(tree, spec, python, env, timing, keep)
    if console is not None:
        console.print(f"--kernels dispatched: {len(entries) - len(kept)} of {len(entries)} kernels left out "
                      f"({reach.reason or 'the backward op table never selects them'})", markup=False)
    return kept


@dataclass(frozen=True)
class PlanReport:
    """What `plan` found (`codegen.cli.plan` prints it): the spec, the kernels and their summary,
    the interpreter that ran the generator, where the time went, and notes for the user."""

    loaded: LoadedSpec
    entries: list
    summary: PlanSummary
    python: str
    timing: PlanTiming
    notes: tuple[str, ...] = ()


def plan_tree(opts: PlanOptions, console: "Console | None" = None) -> PlanReport:
    """`plan`: the tree's kernels for the spec, timed (`console`: where the build venv's creation
    and --kernels dispatched report progress)."""
    notes = ()
    if os.environ.get(HEAD_DIMS_ENV):
        notes = (f"{HEAD_DIMS_ENV}={os.environ[HEAD_DIMS_ENV]!r} is set: it overrides the tree's head dims, "
                 "as it would for cmake",)
    start, clock = time.perf_counter(), {}
    run = run_plan(opts, clock, console)
    timing = PlanTiming(time.perf_counter() - start, clock.get("upstream_s", 0.0))
    return PlanReport(run.loaded, run.entries, run.summary, run.python, timing, notes)
