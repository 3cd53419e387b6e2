"""Load what render needs besides the spec: the measured winners (`winners.csv`, written by
`mi100-codegen tune`) and the compile report's waves_per_eu limits (`compile_report.json`,
written by `precompile --tuning-report`), each from the spec's own results folder or else the
one shipped for its arch (`codegen.render.workspace`). The stages that render (render, apply, build)
call this, then pass the result to the pure `codegen.render.overlay.plan_overlay`."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from codegen.core.errors import DataFileError
from codegen.core.ui import printable
from codegen.models.records import RecordError, describe, parse_json
from codegen.core.fsutil import read_input
from codegen.models import TargetSpec
from codegen.models.limits import CompileReport, waves_per_eu_limits
from codegen.models.rows import OverlayInputs, Winner
from codegen.render.overlay import Overlay, plan_overlay
from codegen.core.resources import data_dir, display_path
from codegen.formats.spec import LoadedSpec
from codegen.formats.tuning_csv import load_winner_rows
from codegen.upstream.layouts import DEFAULT_LAYOUT
from codegen.render.workspace import COMPILE_REPORT, WINNERS, overlay_results


REPORT_LIMIT = 16 << 20  # bytes; the committed reports are well under 1 MB
_MAX_SHOWN = 12


def read_compile_report(path: Path, display: str | None = None) -> CompileReport | None:
    """A compile report (`precompile --tuning-report`), validated by its model
    (`codegen.models.limits.CompileReport`); None when the path does not exist.
    The one reader: render, apply, build and precompile's merge all come through here. Anything
    else (not a regular file, not UTF-8 JSON, nested past the parser, `[]`, a config without a
    verdict, a negative count) is one DataFileError, every problem as `file: location: message`."""
    path = Path(path)
    display = display or display_path(path)
    if not path.exists() and not path.is_symlink():
        return None
    raw = read_input(path, what="compile report", limit=REPORT_LIMIT)
    try:   # the records' one parser and error text (codegen.models.records), every line `file: ...`
        data = parse_json(raw, where=display, what="compile report")
    except RecordError as exc:
        raise DataFileError([str(exc)]) from None
    if not isinstance(data, dict):
        raise DataFileError([f"{display}: not a compile report: expected a JSON object with "
                             f"'configs', found {type(data).__name__}"])
    try:
        report = CompileReport.model_validate(data)
    except ValidationError as exc:
        lines = [f"{display}: {describe(e)}" for e in exc.errors(include_url=False)]
        more = len(lines) - _MAX_SHOWN
        raise DataFileError(lines[:_MAX_SHOWN] + ([f"{display}: ... and {more} more"] if more > 0 else [])) from None
    return report


def committed_report(arch: str) -> CompileReport | None:
    """tuning/<arch>/compile_report.json as shipped (None when there is none)."""
    return read_compile_report(data_dir("tuning") / arch / COMPILE_REPORT,
                               f"tuning/{printable(arch)}/{COMPILE_REPORT}")


def load_limits(spec: TargetSpec, report_path: Path | None = None) -> dict | None:
    """The limits table of a compile report (default: the shipped one); None when there is none."""
    report = read_compile_report(report_path) if report_path is not None else committed_report(spec.arch)
    if report is None:
        return None
    return waves_per_eu_limits(report, spec.arch, set(spec.dtypes), set(spec.head_dims))


def load_winners(loaded: LoadedSpec, files: dict[str, Path] | None = None) -> list[Winner]:
    """The measured winners of the spec's home (codegen.render.workspace) for the spec's GPUs,
    dtypes and head dims (proxies only on opt-in); none without them."""
    files = overlay_results(loaded) if files is None else files
    return [Winner(**rec) for rec in load_winner_rows(files[WINNERS].parent, loaded.spec)] if WINNERS in files else []


def load_inputs(loaded: LoadedSpec) -> OverlayInputs:
    """The results of the spec's home (codegen.render.workspace), parsed."""
    files = overlay_results(loaded)
    winners = load_winners(loaded, files)
    limits = load_limits(loaded.spec, files[COMPILE_REPORT]) if COMPILE_REPORT in files else None
    return OverlayInputs(tuple(winners), limits)


def render_overlay(loaded: LoadedSpec, layout: str = DEFAULT_LAYOUT) -> Overlay:
    """`plan_overlay` with the spec's results (its own, else those shipped for its arch)."""
    return plan_overlay(loaded, layout, load_inputs(loaded))
