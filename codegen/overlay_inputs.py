"""Load what render needs besides the spec: the measured winners (`winners.csv`, written by
`mi100-codegen tune`) and the compile report's waves_per_eu limits (`compile_report.json`,
written by `precompile --tuning-report`), each from the spec's own results folder or else the
one shipped for its arch (`codegen.workspace`). The stages that render (render, apply, build)
call this, then pass the result to the pure `codegen.render.plan_overlay`."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError
from .fsutil import read_input
from .models import TargetSpec
from .models.limits import waves_per_eu_limits
from .models.rows import OverlayInputs, Winner
from .render import Overlay, plan_overlay
from .resources import data_dir, display_path
from .spec import LoadedSpec
from .tuning_results import load_winner_rows
from .upstream.layouts import DEFAULT_LAYOUT
from .workspace import COMPILE_REPORT, WINNERS, overlay_results


def read_report(path: Path | None) -> dict | None:
    """A compile_report.json (None when there is none)."""
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(read_input(path, what="compile report").decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{display_path(path)}: not valid JSON: {exc}") from None


def committed_report(arch: str) -> dict | None:
    """tuning/<arch>/compile_report.json as shipped (None when there is none)."""
    return read_report(data_dir("tuning") / arch / COMPILE_REPORT)


def load_limits(spec: TargetSpec, report_path: Path | None = None) -> dict | None:
    """The limits table of a compile report (default: the shipped one); None when there is none."""
    report = read_report(report_path) if report_path is not None else committed_report(spec.arch)
    if report is None:
        return None
    return waves_per_eu_limits(report, spec.arch, set(spec.dtypes), set(spec.head_dims))


def load_measured(spec: TargetSpec, folder: Path | None = None) -> list[Winner]:
    """The winners of the spec's GPUs, dtypes and head dims (proxies only on opt-in) in
    `folder`/winners.csv (default: the shipped tuning/<arch>/)."""
    return [Winner(**rec) for rec in load_winner_rows(folder or data_dir("tuning") / spec.arch, spec)]


def load_inputs(loaded: LoadedSpec) -> OverlayInputs:
    """The results of the spec's home (codegen.workspace), parsed."""
    files = overlay_results(loaded)
    winners = load_measured(loaded.spec, files[WINNERS].parent) if WINNERS in files else []
    limits = load_limits(loaded.spec, files[COMPILE_REPORT]) if COMPILE_REPORT in files else None
    return OverlayInputs(tuple(winners), limits)


def render_overlay(loaded: LoadedSpec, layout: str = DEFAULT_LAYOUT) -> Overlay:
    """`plan_overlay` with the spec's results (its own, else those shipped for its arch)."""
    return plan_overlay(loaded, layout, load_inputs(loaded))


__all__ = ["committed_report", "load_inputs", "load_limits", "load_measured", "read_report", "render_overlay"]
