"""The build-cost table of docs/build.md from its inputs (issue 24, items 4 and 6): the reuse matrix of
scripts/bench_build_compile.py (`--reuse-matrix`), scripts/build_cost_table.py over precompile
--json reports and `time` logs, and scripts/op_table_reach.py's reading of a generated backward op
table. Synthetic inputs, no tree, no compile (fast)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_reuse_matrix_counts_shared_keys_and_names_every_best_other():
    bench = _script("bench_build_compile")
    keys = {"0.11b": {"a", "b", "c", "d"}, "0.11.1b": {"a", "b", "c", "d"}, "0.12b": {"a", "x"}}
    m = bench.reuse_matrix(keys)
    assert m["0.11b"] == {"kernels": 4, "served_by": {"0.11.1b": 4, "0.12b": 1}, "best": ["0.11.1b"]}
    assert m["0.12b"]["best"] == ["0.11b", "0.11.1b"]  # a tie: both, in the given order
    assert bench.reuse_matrix({"a": {"1"}, "b": {"2"}})["a"]["best"] == []  # nothing shared: no best
    rows = bench.matrix_table(m)
    assert rows[0] == "| release (kernels) | 0.11b's cache | 0.11.1b's cache | 0.12b's cache | best other |"
    assert rows[2] == "| 0.11b (4) | – | 4 (100 %) | 1 (25 %) | 0.11.1b: 100 % |"
    assert rows[4] == "| 0.12b (2) | 1 (50 %) | 1 (50 %) | – | 0.11b, 0.11.1b: 50 % |"
    assert bench._pct(27, 2731) == "1.0 %" and bench._pct(0, 5) == "0 %"


def _kernel(family: str, status: str = "ok", dispatched: bool = True, code: int = 1000, cs: float = 1.0) -> dict:
    return {"family": family, "status": status, "dispatched": dispatched, "compile_s": cs if status == "ok" else 0.0,
            "cached": False, "resources": {"code_bytes": code if status == "ok" else 0}}


def _report(path: Path, release: str, compiled: int, cached: int, kernels: list[dict]) -> Path:
    run = {"release": release, "gpu": "gfx1030_mod0", "arch": "gfx1030", "planned": len(kernels),
           "compiled_now": compiled, "from_cache": cached, "wall_s": 100.0, "triton": "3.6.0", "jobs": 16}
    path.write_text(json.dumps({"run": run, "kernels": kernels}), encoding="utf-8")
    return path


LOG = """\
AOTriton 0.11b: 4 kernels planned for gfx1030_mod0; compiling 4 with 16 warm worker(s), cache /tmp/mc/kernels
precompile ━━━━━━━ 4/4 ok 3 failed 1 spilling 0 cached 0 0:02:… 0:00:00
error: a compile error line
real	2m9.948s
user	31m31.136s
sys	0m33.493s
AOTriton 0.11b: 4 kernels planned for gfx1030_mod0; compiling 4 with 16 warm worker(s), cache /tmp/mc/kernels
precompile ━━━━━━ 4/… ok 3 failed 1 spilling 0 cached 3 0:00:… 0:00:…
real	0m12.070s
user	1m37.633s
sys	0m6.235s
AOTriton 0.14.0-dev: 4 kernels planned for gfx1030_mod0; compiling 4 with 16 warm worker(s), cache /tmp/mc/kernels
"""


def test_table_rows_from_reports_logs_and_reuse(tmp_path):
    table = _script("build_cost_table")
    ks = [_kernel("attn_fwd", "failed"), _kernel("attn_fwd"), _kernel("bwd_kernel_fuse", dispatched=False, code=500_000),
          _kernel("bwd_kernel_fuse", code=1_500_000)]
    cold = _report(tmp_path / "cold.json", "0.11b", 4, 0, ks)
    warm = _report(tmp_path / "warm.json", "0.11b", 1, 3, ks)
    (tmp_path / "log.txt").write_text(LOG, encoding="utf-8")
    reuse = {"spec": "rdna2 (gfx1030)", "triton": "3.8.0", "releases": {
        "0.11b": {"kernels": 4, "served_by": {"0.11.1b": 4, "0.10b": 0}, "best": ["0.11.1b"]},
        "0.11.1b": {"kernels": 4, "served_by": {"0.11b": 4, "0.10b": 0}, "best": ["0.11b"]},
        "0.10b": {"kernels": 5, "served_by": {"0.11b": 0, "0.11.1b": 0}, "best": []}}}
    logs = table.read_logs([tmp_path / "log.txt"])
    assert set(logs) == {("0.11b", "gfx1030_mod0", 4, 0), ("0.11b", "gfx1030_mod0", 4, 3)}  # main's block had no time
    rows = table.gather([warm, cold], logs, [reuse])
    assert [r.release for r in rows] == ["0.10b", "0.11b", "0.11.1b"]
    counts = {"0.11b": {"rdna2": 4}}
    out = table.table(rows, counts)
    assert out[0].startswith("| release | target (spec) | kernels | failed | Triton, jobs | CPU-s cold |")
    assert out[2] == ("| 0.10b | gfx1030 (`rdna2`) | 5 | – | – | not measured | not measured | not measured | none | – |")
    assert out[3] == ("| 0.11b | gfx1030 (`rdna2`) | 4<!-- kernels 0.11b rdna2 --> | 1 | 3.6.0, -j 16 | 1,925 | "
                      "129.9 s | 12.1 s (1 failed ones again) | 0.11.1b: 100 % | 1 (flag): 0.5 MB of 2.0 MB (25 %) |")
    assert out[4] == ("| 0.11.1b | gfx1030 (`rdna2`) | 4 | – | – | = 0.11b (same kernels) | = 0.11b | = 0.11b | "
                      "0.11b: 100 % | – |")
    reach = {("gfx1030", "0.11b"): {"never": 2, "never_bytes": 1_500_000}}  # op_table_reach.py's reading
    assert table.table(rows, counts, reach)[3].endswith("| 2: 1.5 MB of 2.0 MB (75 %) |")
    runs = table.runs_table([cold, warm], logs)
    assert runs[2] == ("| `cold.json` | 0.11b | gfx1030_mod0 | 3.6.0, -j 16 | 4 | 4 | 0 | 1 | cold | 100.0 s | "
                       "129.9 / 1891.1 / 33.5 s | 3 s |")
    assert "| 1 | 3 | 1 | warm |" in runs[3]


def test_a_resumed_run_is_neither_cold_nor_warm_and_cpu_falls_back_to_compile_s(tmp_path):
    table = _script("build_cost_table")
    ks = [_kernel("attn_fwd", cs=2.0) for _ in range(200)]
    resumed = _report(tmp_path / "resumed.json", "0.14.0-dev", 20, 180, ks)
    row, = table.gather([resumed], {}, [])
    assert row.cold is None and row.warm is None and len(row.other) == 1
    cells = table.cells(row, {}, {row.release: row})
    assert cells[5] == "≈ 400 (Σ compile_s)"
    assert cells[6] == "not measured; resumed here: 20 compiled, 180 cached"
    assert table.kind(json.loads(_report(tmp_path / "c.json", "0.13b", 198, 2, ks).read_text())) == "cold"  # ≤ 1 % cached
