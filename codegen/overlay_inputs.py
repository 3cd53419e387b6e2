"""Load what render needs besides the spec from `tuning/<arch>/`: the measured winners
(`winners.csv`, written by `mi100-codegen tune`) and the compile report's waves_per_eu limits
(`compile_report.json`, written by `precompile --tuning-report`). The stages that render
(render, apply, build) call this, then pass the result to the pure `codegen.render.plan_overlay`."""

from __future__ import annotations

import json

from .errors import UserError
from .models import TargetSpec
from .models.limits import waves_per_eu_limits
from .models.rows import OverlayInputs, Winner
from .render import Overlay, plan_overlay
from .resources import data_dir
from .spec import LoadedSpec
from .tuning_results import load_winner_rows
from .upstream.layouts import DEFAULT_LAYOUT


def committed_report(arch: str) -> dict | None:
    """tuning/<arch>/compile_report.json as committed (None when there is none)."""
    path = data_dir("tuning") / arch / "compile_report.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"tuning/{arch}/compile_report.json: not valid JSON: {exc}") from None


def load_limits(spec: TargetSpec) -> dict | None:
    """The limits table of tuning/<arch>/compile_report.json; None when there is no report."""
    report = committed_report(spec.arch)
    if report is None:
        return None
    return waves_per_eu_limits(report, spec.arch, set(spec.dtypes), set(spec.head_dims))


def load_measured(spec: TargetSpec) -> list[Winner]:
    """The committed winners of the spec's GPUs, dtypes and head dims (proxies only on opt-in)."""
    return [Winner(**rec) for rec in load_winner_rows(data_dir("tuning") / spec.arch, spec)]


def load_inputs(spec: TargetSpec) -> OverlayInputs:
    return OverlayInputs(tuple(load_measured(spec)), load_limits(spec))


def render_overlay(loaded: LoadedSpec, layout: str = DEFAULT_LAYOUT) -> Overlay:
    """`plan_overlay` with the inputs committed under tuning/<arch>/."""
    return plan_overlay(loaded, layout, load_inputs(loaded.spec))


__all__ = ["load_inputs", "load_limits", "load_measured", "render_overlay"]
