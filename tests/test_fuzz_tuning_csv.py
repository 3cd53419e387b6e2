"""Fuzzing tuning CSVs (hypothesis): cell-level mutations (any text in any column: numbers, nan,
inf, quotes, commas, newlines, empty) and byte-level noise (invalid UTF-8, NUL, truncation,
header edits) of the committed tuning/gfx908/{winners,measurements}.csv. Every case must either
read as typed rows with finite times, or raise one DataFileError (exit 2) whose every line is
located FILE:LINE: — never another exception — and leave the file unchanged.

Default run: 2 properties x 150 cases; `-m slow`: 2 x 600 = 1,200 cases (tests/fuzz_profiles.py)."""

from __future__ import annotations

import csv
import io
import math
import re
import tempfile
from pathlib import Path

import pytest
from fuzz_profiles import fast, slow
from hypothesis import given
from hypothesis import strategies as st

from codegen.core.errors import EXIT_USER, DataFileError
from codegen.formats.tuning_csv import read_csv

REPO = Path(__file__).resolve().parents[1]
FILES = {name: (REPO / "tuning" / "gfx908" / name).read_text().splitlines(keepends=True)[:6]
         for name in ("winners.csv", "measurements.csv")}

cell_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "nan", "NaN", "inf", "-inf", "-1", "0", "1e308", "1e999", "abc", "4.0", " 4",
                     "0x10", "\"", "a,b", "x\ny", "fp8", "gfx908_mod0", "9" * 40]),
    st.integers().map(str), st.floats().map(repr),
)


@st.composite
def cell_mutations(draw):
    name = draw(st.sampled_from(sorted(FILES)))
    rows = list(csv.reader(io.StringIO("".join(FILES[name]))))
    for _ in range(draw(st.integers(1, 4))):
        r = draw(st.integers(0, len(rows) - 1))
        if not rows[r]:
            continue
        c = draw(st.integers(0, len(rows[r]) - 1))
        op = draw(st.sampled_from(["set", "set", "set", "drop", "add"]))
        if op == "set":
            rows[r][c] = draw(cell_text)
        elif op == "drop":
            del rows[r][c]
        else:
            rows[r].insert(c, draw(cell_text))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return name, buf.getvalue().encode("utf-8", "surrogatepass")


@st.composite
def byte_noise(draw):
    name = draw(st.sampled_from(sorted(FILES)))
    data = bytearray("".join(FILES[name]).encode())
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["insert", "delete", "truncate", "flip"]))
        if op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=6))
        elif op == "delete":
            del data[pos:pos + draw(st.integers(1, 30))]
        elif op == "truncate":
            del data[pos:]
        elif pos < len(data):
            data[pos] ^= draw(st.integers(1, 255))
    return name, bytes(data)


def _check(case) -> None:
    name, data = case
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        try:
            rows = read_csv(path)
        except DataFileError as exc:
            assert exc.exit_code == EXIT_USER
            located = re.compile(re.escape(str(path)) + r":\d+: ")
            assert exc.lines and all(located.match(ln) for ln in exc.lines), exc.lines
            assert all(len(ln.splitlines()) == 1 for ln in exc.lines), exc.lines  # one line each
        else:
            for row in rows:
                t = row["time_ms"]
                assert t == "" or (isinstance(t, float) and math.isfinite(t) and t >= 0), row
                assert isinstance(row["head_dim"], int) and isinstance(row["num_warps"], int)
        assert path.read_bytes() == data  # reading writes nothing


STRATEGIES = {"cells": cell_mutations(), "bytes": byte_noise()}


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fuzz_tuning_csv(kind):
    @fast(150)
    @given(STRATEGIES[kind])
    def run(case):
        _check(case)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STRATEGIES))
def test_fuzz_tuning_csv_slow(kind):
    @slow(600)
    @given(STRATEGIES[kind])
    def run(case):
        _check(case)

    run()
