"""`mi100-codegen apply` and `mi100-codegen revert`."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from codegen.cli import SpecOpt
from codegen.core import ui
from codegen.core.errors import UserError


STYLES = {"create": "green", "edit": "yellow", "identical": "dim", "conflict": "bold red", "skip": "cyan",
          "restored": "yellow", "removed": "yellow"}


def _print_table(console: Console, table: Table) -> None:
    """A table; piped or redirected, without the padding that would end lines in spaces."""
    if console.is_terminal:
        console.print(table)
        return
    with console.capture() as cap:
        console.print(table)
    console.file.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))


def _print_result(console: Console, result, show_edits: bool = True, report: Path | None = None) -> None:
    title = f"{result.command} {result.tree}"  # verbatim (a path may hold [brackets]): Text, never markup
    if result.release:
        title += f" (AOTriton {result.release}, adapter {result.adapter})"
    if result.pretend:
        title += " [pretend: nothing written]"
    if result.recovered:
        console.print(f"[yellow]recovered an interrupted run:[/] {result.recovered}")
    table = Table(title=Text(title), title_justify="left", show_edge=False, box=None, pad_edge=False)
    table.add_column("verdict")
    table.add_column("file")
    table.add_column("detail", overflow="fold")
    for f in result.files:
        detail = f.detail
        if f.path in result.rows:
            detail = (detail + " " if detail else "") + ", ".join(
                f"{t} {s.rows_written} rows" + (f" ({s.split_routed} fused -> split)" if s.split_routed else "")
                for t, s in result.rows[f.path].items())
        elif f.edits and not detail:
            detail = ", ".join(f.edits)
        table.add_row(Text(f.verdict, style=STYLES.get(f.verdict, "")), Text(f.path), Text(detail))
    if show_edits:  # skipped edits; a conflicting edit is already in its file's row
        for e in result.edits:
            if e.verdict == "skip":
                table.add_row(Text(e.verdict, style=STYLES[e.verdict]), Text(f"{e.path} ({e.id})"), Text(e.detail))
    _print_table(console, table)
    _print_compile_check(console, result, report)
    counts = Counter(f.verdict for f in result.files)
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items())) or "nothing to do"
    console.print(f"{result.command}: {summary}")


def _print_compile_check(console: Console, result, report: Path | None) -> None:
    """The seeded rows against tuning/<arch>/compile_report.json (see codegen.apply.dbrows);
    `report`: the spec's own compile report, where precompile measures what is missing."""
    capped, unclean, unmeasured, checked = 0, set(), set(), False
    for tables in result.rows.values():
        for st in tables.values():
            if st.compile_unclean is not None:
                checked = True
                capped += st.compile_capped or 0
                unclean.update(st.compile_unclean)
                unmeasured.update(st.compile_unmeasured or ())
    if not checked:
        return
    console.print(f"compile report: {capped} seeded row(s) lowered to the largest spill-free waves_per_eu")
    for name in sorted(unclean):
        console.print(f"[bold red]spills or fails at every measured waves_per_eu (kept):[/] {name}")
    if unmeasured:
        console.print(Text.assemble((f"{len(unmeasured)} config(s) not in the compile report", "yellow"),
                                    f" (measure them: `mi100-codegen precompile {result.tree} --tuning-report "
                                    f"{report or 'FILE'} --descend`, then apply again), e.g. "
                                    f"{', '.join(sorted(unmeasured)[:3])}"))


def _printed(console: Console, exc, as_json: bool, command: str) -> UserError:
    """Print a refusal's verdicts (the conflicts once, in the table); the error says only that."""
    _print_result(console, exc.result, show_edits=command == "apply")
    if as_json:
        sys.stdout.write(json.dumps(exc.result.to_json(), indent=2, sort_keys=True) + "\n")
    n = len(exc.result.conflicts)
    return UserError(f"refusing to {command}, nothing was changed: {n} conflict{'s' * (n != 1)} (listed above)",
                     hint=exc.hint)


def register(app: typer.Typer, guarded) -> None:
    @app.command()
    @guarded
    def apply(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton source tree (a release checkout)."),
        spec: Optional[Path] = SpecOpt,
        pretend: bool = typer.Option(False, "--pretend", help="Plan only: compute and report the verdicts, "
                                     "write nothing (the same computation as a real apply)."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON on stdout."),
    ) -> None:
        """Apply the overlay to an AOTriton tree: new files, anchored edits, tuning-DB rows.

        Idempotent and atomic; writes .mi100-codegen.lock.json and backups (see `revert`).

        It renders the overlay from --spec itself: a render --out folder is a preview, never read."""
        from codegen.upstream import detect  # CLI start-up: the engine loads only when apply runs
        from codegen.apply.applied_spec import resolve_spec
        from codegen.apply.engine import ApplyConflict, apply_overlay
        from codegen.render.workspace import COMPILE_REPORT, results_dir

        console = ui.console(log_width=200)  # verdicts: piped, lines long rather than folded
        loaded = resolve_spec(None, spec)  # no tree: apply records the spec it is given
        ui.warn(loaded.warnings)
        release = detect(aotriton_dir.resolve())  # the tree's record; refuses unknown trees, writes nothing
        try:
            with console.status("applying…") as status:
                result = apply_overlay(aotriton_dir, loaded, pretend=pretend,
                                       progress=lambda msg: status.update(msg), release=release)
        except ApplyConflict as exc:
            raise _printed(console, exc, as_json, "apply") from None
        _print_result(console, result, report=results_dir(loaded) / COMPILE_REPORT)
        if loaded.spec.rows.split_backward and release.op_db is None:
            console.print(f"rows.split_backward: AOTriton {release.label} has no op database to route with; its "
                          "fused backward kernels stay selectable (PyTorch's v2 path calls attn_bwd_fused for "
                          "short sequences)", markup=False, style="yellow")
        if as_json:
            sys.stdout.write(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")

    @app.command()
    @guarded
    def revert(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton tree that `apply` changed."),
        force: bool = typer.Option(False, "--force", help="Restore files even if they were changed after apply."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdicts as JSON on stdout."),
    ) -> None:
        """Restore the tree byte-for-byte to its state before the first apply."""
        from codegen.apply.revert import ApplyConflict, revert_tree  # CLI start-up: revert loads only when run

        console = ui.console(log_width=200)  # verdicts: piped, lines long rather than folded
        try:
            result = revert_tree(aotriton_dir, force=force)
        except ApplyConflict as exc:
            raise _printed(console, exc, as_json, "revert") from None
        if not result.files and not result.release:
            console.print(f"revert: {aotriton_dir} has no mi100-codegen lock: nothing to revert", markup=False)
        else:
            _print_result(console, result, show_edits=False)
        if as_json:
            sys.stdout.write(json.dumps(result.to_json(), indent=2, sort_keys=True) + "\n")
