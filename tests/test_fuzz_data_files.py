"""Fuzzing the other data files we read (hypothesis), issue 20:

- compile reports (`precompile --tuning-report`, tuning/<arch>/compile_report.json): JSON-level
  mutations of the committed tuning/gfx906 report (any JSON value anywhere, keys dropped or
  added, the document wrapped or replaced, deep nesting, huge numbers) and byte noise. Each case
  is read by `read_compile_report` — the one reader — and either gives the report or one
  DataFileError (exit 2) whose every line names the file; through the CLI, `precompile
  --tuning-report FILE` then exits 2 with no traceback.
- upstream tuning logs (`tune import FILE`): records with any JSON value in any field, lines
  that are not JSON, binary, deep nesting, numbers past float's range. Through the CLI: exit 0
  or 2, no traceback, every error line located `FILE:LINE:`, nothing written on error, and
  whatever was written reads back (`read_csv`): the next import accepts it.

Default run: 3 properties x 40 cases; `-m slow`: 3 x 400 (tests/fuzz_profiles.py)."""

from __future__ import annotations

import copy
import json
import math
import sys
import tempfile
from pathlib import Path

import pytest
from fuzz_profiles import fast, node_paths, slow
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from codegen.cli import app
from codegen.core.errors import EXIT_USER, DataFileError
from codegen.models.limits import CompileReport
from codegen.render.inputs import read_compile_report
from codegen.formats.tuning_csv import MEASUREMENTS_FILE, WINNERS_FILE, read_csv

REPO = Path(__file__).resolve().parents[1]
REPORT = json.loads((REPO / "tuning" / "gfx906" / "compile_report.json").read_text())
REPORT["configs"] = dict(list(REPORT["configs"].items())[:6])

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10),
    st.sampled_from([-1, 0, 1, 2 ** 63, 1e400, "ok", "spills", "failed", "maybe", "64", ""]),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)


def _mutate(draw, doc):
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        paths = list(node_paths(doc))
        loc = draw(st.sampled_from(paths))
        if not loc:
            doc = draw(st.sampled_from([[doc], [], "text", 1, None])) if draw(st.booleans()) else doc
            continue
        parent = doc
        for part in loc[:-1]:
            parent = parent[part]
        op = draw(st.sampled_from(["set", "set", "drop", "add"]))
        if op == "set":
            parent[loc[-1]] = draw(json_values)
        elif op == "drop":
            del parent[loc[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(json_values)
        else:
            parent.append(draw(json_values))
        if not isinstance(doc, (dict, list)):
            break
    return doc


def _encode(draw, doc) -> bytes:
    text = json.dumps(doc)  # NaN/Infinity spelled as Python's json writes them
    how = draw(st.sampled_from(["as is", "as is", "deep", "digits", "bytes", "truncate"]))
    if how == "deep":
        n = draw(st.sampled_from([500, 5_000, 100_000]))
        return ("[" * n + text + "]" * n).encode()
    if how == "digits":
        return text.replace("1", "1" + "7" * 5000, 1).encode()
    if how == "bytes":
        raw = bytearray(text.encode())
        for _ in range(draw(st.integers(1, 4))):
            raw.insert(draw(st.integers(0, len(raw))), draw(st.integers(0, 255)))
        return bytes(raw)
    if how == "truncate":
        return text.encode()[:draw(st.integers(0, len(text)))]
    return text.encode()


@st.composite
def compile_reports(draw):
    return _encode(draw, _mutate(draw, REPORT))


def _read_report(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "compile_report.json"
        p.write_bytes(content)
        try:
            report = read_compile_report(p, "compile_report.json")
        except DataFileError as exc:
            assert exc.exit_code == EXIT_USER
            assert exc.lines and all(ln.startswith("compile_report.json") for ln in exc.lines), exc.lines
            assert "\n" not in "".join(exc.lines)
        else:  # accepted: every entry is typed as the readers downstream expect
            assert isinstance(report, CompileReport) and isinstance(report.configs, dict)
            for entry in report.configs.values():
                assert entry.verdict in ("ok", "not dispatched", "low occupancy", "no matrix cores",
                                         "spills", "failed")
                assert all(v is None or (isinstance(v, int) and v >= 0) for k, v in entry.model_dump().items()
                           if k not in ("verdict", "error"))
        assert p.read_bytes() == content


def test_fuzz_compile_report():
    @fast(40)
    @given(compile_reports())
    def run(content):
        _read_report(content)

    run()


@pytest.mark.slow
def test_fuzz_compile_report_slow():
    @slow(400)
    @given(compile_reports())
    def run(content):
        _read_report(content)

    run()


def test_fuzz_compile_report_through_the_cli():
    """`precompile --tuning-report FILE`: the report is read before anything else runs."""

    @fast(15)
    @given(compile_reports())
    def run(content):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "compile_report.json"
            p.write_bytes(content)
            r = CliRunner().invoke(app, ["precompile", str(Path(d) / "no-tree"), "--tuning-report", str(p),
                                         "--python", sys.executable])
            assert r.exit_code == 2, r.output
            assert "Traceback" not in r.output and isinstance(r.exception, (SystemExit, type(None))), r.output

    run()


RECORD = {"arch": "gfx908", "kernel_name": "attn_fwd", "result": "tuned",
          "inputs": {"Q_dtype": "float16", "D_HEAD": 64, "Max_seqlen_q": 1024, "Max_seqlen_k": 1024,
                     "CAUSAL_TYPE": True, "ENABLE_DROPOUT": False, "BIAS_TYPE": 0},
          "tuned_kernel": {"BLOCK_M": 64, "BLOCK_N": 32, "PRE_LOAD_V": False},
          "compiler_options": {"waves_per_eu": 1, "num_warps": 4, "num_stages": 1},
          "ut_passed": True, "time": [0.5, 0.4, 0.6], "adiffs": 0.001}


@st.composite
def tuning_logs(draw):
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        rec = copy.deepcopy(RECORD)
        if draw(st.booleans()):
            rec["kernel_name"] = draw(st.sampled_from(["attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq"]))
        lines.append(_encode(draw, _mutate(draw, rec)) if draw(st.integers(0, 3)) else json.dumps(rec).encode())
    return b"\n".join(lines) + b"\n"


def _import(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "log.json"
        log.write_bytes(content)
        out = Path(d) / "out"
        r = CliRunner().invoke(app, ["tune", "import", str(log), "--out", str(out), "--date", "2026-11-24"])
        assert r.exit_code in (0, 2), (r.exit_code, r.output, content[:300])
        assert "Traceback" not in r.output and isinstance(r.exception, (SystemExit, type(None))), r.output
        if r.exit_code == 2:
            errors = [ln.strip().removeprefix("error: ") for ln in r.output.splitlines()
                      if ln.strip() and ln.strip() != "error:" and not ln.strip().startswith(("hint:", "skipped"))]
            assert errors, r.output
            assert all(ln.startswith(f"{log}:") for ln in errors if "no usable tuning records" not in ln), r.output
            assert not out.exists() or "no usable tuning records" in r.output or not any(out.iterdir())
        else:  # the next import reads what this one wrote
            for name in (MEASUREMENTS_FILE, WINNERS_FILE):
                for row in read_csv(out / name):
                    assert row["time_ms"] == "" or math.isfinite(row["time_ms"])


def test_fuzz_tune_import():
    @fast(40)
    @given(tuning_logs())
    def run(content):
        _import(content)

    run()


@pytest.mark.slow
def test_fuzz_tune_import_slow():
    @slow(400)
    @given(tuning_logs())
    def run(content):
        _import(content)

    run()
