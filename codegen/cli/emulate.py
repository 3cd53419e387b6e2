"""`mi100-codegen emulate BUNDLE`: the library's flash attention executed on an emulated GPU
(codegen.ship.execute), and the rendering of what it found, which `bundle check --execute` prints
too."""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from codegen.core import ui

stderr = ui.console()
TENSORS = ("out", "lse", "dq", "dk", "dv", "db")


def _say(msg: str) -> None:
    stderr.print(ui.printable(msg), markup=False)


def short(stem: str) -> str:
    """A packed kernel's stem as the table shows it: `attn_fwd F <functional> P <perf> CO <options>`
    (the JSON report keeps the whole stem)."""
    last = stem.rsplit("/", 1)[-1].split("--Arch_", 1)[0]
    return last.replace("-Sig-F__", " F ").replace("__P__", " P ").replace("__CO__", " CO ")


def print_executed(rep) -> None:
    """The coverage table of an ExecuteReport (codegen.models.execute): each case's largest error
    of each tensor against its tolerance, the kernels that ran, the opcodes they executed out of
    those in their code objects."""
    _say(f"{'ok  ' if rep.ok else 'FAIL'} {rep.label}: {sum(c.ok for c in rep.cases)} of {len(rep.cases)} cases, "
         f"{rep.instructions:,} instructions in {rep.seconds:.0f} s")
    _say(f"     {'case':44} {'instructions':>12} {'s':>6}  " + "  ".join(f"{t:>17}" for t in TENSORS))
    for c in rep.cases:
        cells = {t.name: f"{t.error:.1e}{'<=' if t.ok else '> '}{t.tolerance:.1e}" for t in c.tensors}
        why = ""
        if c.fault is not None:
            why = f"  {c.fault.phase} {short(c.fault.kernel)}: {c.fault.message}"
        elif not c.tensors:
            why = f"  fwd {c.fwd} bwd {c.bwd}" + (f" mask {c.mask}" if c.mask is not None else "")
        _say(f"{'ok  ' if c.ok else 'FAIL'} {c.case:44} {c.instructions:>12,} {c.seconds:>6.1f}  "
             + "  ".join(f"{cells.get(t, '-'):>17}" for t in TENSORS) + why)
    runs: dict[str, list] = {}
    for c in rep.cases:
        for k in c.kernels:
            r = runs.setdefault(k.kernel, [0, 0, 0.0])
            r[0], r[1], r[2] = r[0] + k.launches, r[1] + k.instructions, r[2] + k.seconds
    ops = {o.kernel: o for o in rep.opcodes}
    _say(f"     {len(runs)} kernel(s) ran"
         + (f" of the {rep.packed_kernels} the library's images pack" if rep.packed_kernels else "") + ":")
    for name, (launches, instructions, seconds) in sorted(runs.items()):
        o = ops.get(name)
        cover = f"{len(o.executed)} of {len(o.present)} opcodes executed" if o and o.present else "opcodes not read"
        rate = f"{instructions / seconds:,.0f}/s" if seconds > 0 else "-"
        _say(f"     {short(name)}: {launches} launch(es), {instructions:,} instructions ({rate}), {cover}")
    for p in rep.problems:
        _say(f"FAIL {p}")
    if rep.stderr_tail and not rep.ok:
        _say(f"     driver: {rep.stderr_tail.splitlines()[-1]}")


def register(app: typer.Typer, guarded) -> None:
    @app.command("emulate")
    @guarded
    def emulate(
        bundle: Path = typer.Argument(..., help="A bundle file (.mi100-bundle.zip)."),
        case: list[str] = typer.Option([], "--case", metavar="GLOB", help="Only the cases whose name matches "
                                       "(e.g. 'fp16.d64.full.*'); repeatable. Default: the whole executed matrix."),
        budget: Optional[int] = typer.Option(None, "--budget", min=1, help="Instructions one launch may execute "
                                             "before it is cut as a hang (default: the emulator's)."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    ) -> None:
        """Execute the bundle's flash attention forward and backward on an emulated GPU and compare with fp64."""
        # CLI start-up: the stage (with the bundle module) loads when it runs
        from codegen.ship.bundle import BundleBuildError
        from codegen.ship.execute import execute_bundle

        def pick(cases):
            return [c for c in cases if any(fnmatch.fnmatchcase(c.name, g) for g in case)] if case else cases

        rep = execute_bundle(bundle, pick=pick, budget=budget, progress=_say)
        if as_json:
            sys.stdout.write(json.dumps(rep.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        print_executed(rep)
        if not rep.ok:
            raise BundleBuildError(f"{bundle}: the executed kernels fail (see above)")
        stderr.print(f"[green]ok:[/] {ui.printable(rep.label)}")
