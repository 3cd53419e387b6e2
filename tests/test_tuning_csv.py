"""Tuning CSVs (tuning/<arch>/winners.csv, measurements.csv, and a tune run's --out folder) are
validated row by row: every problem at once as `file:line: column: message`, exit 2, no traceback,
nothing written; a NaN time never reaches the overlay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.core.errors import DataFileError
from codegen.formats.spec import load_spec
from codegen.gpu.tune.store import pick_winner
from codegen.formats.tuning_csv import (
    MEASUREMENT_COLUMNS,
    WINNER_CSV_COLUMNS,
    MeasurementRow,
    WinnerRow,
    format_csv,
    load_winner_rows,
    read_csv,
)

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "tuning" / "gfx908"


def test_row_models_are_the_column_sets():
    assert set(WinnerRow.model_fields) == set(WINNER_CSV_COLUMNS)
    assert set(MeasurementRow.model_fields) == set(MEASUREMENT_COLUMNS)


def test_committed_csvs_read_typed():
    win = read_csv(COMMITTED / "winners.csv")
    meas = read_csv(COMMITTED / "measurements.csv")
    assert win and meas
    assert all(isinstance(r["head_dim"], int) and isinstance(r["time_ms"], float) for r in win)
    assert {r["status"] for r in meas} >= {"ok"}


def _folder(tmp_path: Path, name: str, text: str | bytes) -> Path:
    folder = tmp_path / "gfx908"
    folder.mkdir(exist_ok=True)
    p = folder / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def _winners_text(**change) -> str:
    lines = (COMMITTED / "winners.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, ln.split(","))) for ln in lines[1:3]]
    for k, v in change.items():
        rows[0][k] = v
    return "\n".join([lines[0]] + [",".join(r[c] for c in header) for r in rows]) + "\n"


CASES = {
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "winners.csv:1: file is not UTF-8 text (byte 0x89)"),
    "abc_in_int": (_winners_text(head_dim="abc"), "winners.csv:2: head_dim: Input should be a valid integer"),
    "nan_time": (_winners_text(time_ms="nan"), "winners.csv:2: time_ms: 'nan' is not a finite number"),
    "inf_time": (_winners_text(time_ms="inf"), "winners.csv:2: time_ms: 'inf' is not a finite number"),
    "negative_time": (_winners_text(time_ms="-1.5"), "winners.csv:2: time_ms: Input should be greater than or equal to 0"),
    "empty_required": (_winners_text(block_m=""), "winners.csv:2: block_m: empty: a value is required"),
    "bad_dtype": (_winners_text(dtype="fp8"), "winners.csv:2: dtype: Input should be 'fp16', 'bf16' or 'fp32'"),
    "wrong_columns": ("a,b,c\n1,2,3\n", "winners.csv:1: header: not a winners.csv header: found a,b,c"),
    "missing_column": (_winners_text().replace(",candidates\n", "\n", 1), "winners.csv:1: header: missing columns: candidates"),
    "reordered": (",".join(reversed(WINNER_CSV_COLUMNS)) + "\n", "winners.csv:1: header: columns out of order"),
    "field_count": (_winners_text() + "x,y\n", "winners.csv:4: expected 25 fields, found 2"),
    "empty_file": ("", "winners.csv:1: file is empty"),
    # issue 30 item 12: a NUL (or another control character) never becomes part of a name
    "nul_in_family": (_winners_text(family="attn_fwd\x00x"),
                      "winners.csv:2: family: character '\\x00' is not allowed"),
    "escape_in_device": (_winners_text(device="\x1b[2J"), "winners.csv:2: device: character '\\x1b' is not allowed"),
    "newline_in_family": (_winners_text().replace(",attn_fwd,", ',"attn\nfwd",', 1),
                          "winners.csv:2: family: character '\\n' is not allowed"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_winners_are_one_located_error(tmp_path, case):
    text, expect = CASES[case]
    path = _folder(tmp_path, "winners.csv", text)
    with pytest.raises(DataFileError) as exc:
        read_csv(path)
    assert expect in str(exc.value), str(exc.value)
    assert all(line.startswith(f"{path}:") for line in exc.value.lines), exc.value.lines


def test_every_bad_row_is_reported_at_once(tmp_path):
    text = _winners_text(head_dim="abc", time_ms="nan")
    lines = text.splitlines()
    lines[2] = lines[2].replace(",4,1,", ",four,1,", 1)
    path = _folder(tmp_path, "winners.csv", "\n".join(lines) + "\n")
    with pytest.raises(DataFileError) as exc:
        read_csv(path)
    got = exc.value.lines
    assert any(":2: head_dim:" in ln for ln in got) and any(":2: time_ms:" in ln for ln in got)
    assert any(":3: " in ln for ln in got), got


def test_measurements_allow_an_empty_time_but_not_nan(tmp_path):
    lines = (COMMITTED / "measurements.csv").read_text().splitlines()[:3]
    header = lines[0].split(",")
    row = dict(zip(header, lines[1].split(",")))
    row.update(status="error", time_ms="")
    ok = _folder(tmp_path, "measurements.csv", "\n".join([lines[0], ",".join(row[c] for c in header)]) + "\n")
    assert read_csv(ok)[0]["time_ms"] == ""
    row.update(status="ok", time_ms="NaN")
    bad = _folder(tmp_path, "measurements.csv", "\n".join([lines[0], ",".join(row[c] for c in header)]) + "\n")
    with pytest.raises(DataFileError, match=r"measurements.csv:2: time_ms: 'NaN' is not a finite number"):
        read_csv(bad)


def test_render_rows_never_see_nan(tmp_path):
    spec = load_spec(None).spec
    _folder(tmp_path, "winners.csv", _winners_text(time_ms="nan"))
    with pytest.raises(DataFileError):
        load_winner_rows(tmp_path / "gfx908", spec)


def test_writer_and_winner_pick_refuse_non_finite_times():
    rows = [{"status": "ok", "time_ms": float("nan"), "waves_per_eu": 1, "config": "a"},
            {"status": "ok", "time_ms": 0.5, "waves_per_eu": 1, "config": "b"}]
    assert pick_winner(rows)["config"] == "b"
    with pytest.raises(ValueError, match="not a finite number"):
        format_csv(rows, ("config", "time_ms"), ("config",))


def _log(tmp_path: Path) -> Path:
    from test_tune_import import line  # the upstream tuning-log record of the import tests

    p = tmp_path / "tune.json"
    p.write_text(json.dumps(line()) + "\n")
    return p


@pytest.mark.parametrize("case", ["binary", "abc_in_int", "nan_time", "wrong_columns"])
def test_tune_run_into_a_folder_with_a_bad_csv_exits_2_and_writes_nothing(tmp_path, case):
    text, expect = CASES[case]
    out = tmp_path / "out"
    out.mkdir()
    (out / "winners.csv").write_bytes(text if isinstance(text, bytes) else text.encode())
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    r = CliRunner().invoke(app, ["tune", "import", str(_log(tmp_path)), "--out", str(out), "--date", "2026-11-21"])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert expect.split(":", 1)[1] in r.output.replace("\n  ", "\n")
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
