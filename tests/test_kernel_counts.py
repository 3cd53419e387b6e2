"""docs/kernel-counts.json is what the tool computes: `scripts/kernel_counts.py` (apply + plan on
fresh real trees) recomputes every row and must print the committed counts. Real trees, minutes
per row: `slow`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.aotriton, pytest.mark.slow]


def test_committed_counts_are_recomputed():
    spec = importlib.util.spec_from_file_location("kernel_counts", REPO / "scripts" / "kernel_counts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    committed = json.loads((REPO / "docs" / "kernel-counts.json").read_text(encoding="utf-8"))["kernels"]
    assert mod.compute() == committed
