"""Real tree: after `apply` (default spec, committed compile report) and `plan`, every planned
kernel of a tuning-row family references a config the compile report measured clean, or apply
listed it (`compile_unclean` / `compile_unmeasured` in its rows stats).

Marked aotriton: needs AOTRITON_GIT (or AOTRITON_SRC) and the generator's requirements (pandas,
numpy) in this Python."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from codegen.models import FAMILIES
from codegen.models.limits import CLEAN_VERDICTS
from codegen.render.inputs import render_overlay
from codegen.core.resources import data_dir
from codegen.formats.spec import load_spec

pytestmark = pytest.mark.aotriton


def test_planned_configs_are_clean_or_listed(fresh_tree):
    missing = [m for m in ("pandas", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the AOTriton generator needs {', '.join(missing)} in this Python")
    loaded = load_spec(None)
    report_path = data_dir("tuning") / loaded.spec.arch / "compile_report.json"
    if not report_path.is_file():
        pytest.skip(f"no compile report committed for {loaded.spec.arch}")
    import json

    from codegen.apply.engine import apply_overlay
    from codegen.plan.kernel_list import generate_kernel_list

    report = json.loads(report_path.read_text())
    assert render_overlay(loaded).rows.waves_per_eu_limits["configs"]

    tree = fresh_tree("0.11b")
    result = apply_overlay(tree, loaded)
    listed: set[str] = set()
    checked = False
    for tables in result.rows.values():
        for st in tables.values():
            if st.compile_unclean is not None:
                checked = True
                listed.update(st.compile_unclean)
                listed.update(st.compile_unmeasured)
    assert checked, "apply did not check the rows against the compile report"

    entries = generate_kernel_list(tree, list(loaded.spec.gpus), sys.executable, arch=loaded.spec.arch, tuning=False)
    row_kernels = [e.config.name for e in entries if e.config.family in FAMILIES]
    assert row_kernels
    uncovered = sorted({name for name in row_kernels
                        if name not in listed
                        and report["configs"].get(name, {}).get("verdict") not in CLEAN_VERDICTS})
    assert not uncovered, f"{len(uncovered)} planned configs neither clean in the report nor listed: {uncovered[:10]}"
    # and what apply listed is really what the plan holds (no stale names)
    planned = set(row_kernels)
    assert listed <= planned, sorted(listed - planned)[:10]
