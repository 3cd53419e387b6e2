"""Measured tuning results committed under tuning/<arch>/ (reviewable CSV), read by render.

`winners.csv` holds one row per tuning-grid entry: the config `mi100-codegen tune` measured
fastest (numerics checked) for that entry. Render turns them into tuning-database rows that
replace the rows seeded from the donor GPU (`codegen.models.rows.Winner`; the database
columns a winner becomes are `codegen.formats.tuning_db.winner_row`). `measurements.csv` beside it holds every candidate
measured for every entry (time, status, errors against the fp64 reference): the evidence.

Both files are sorted, LF, with provenance on every row: `device` (the GPU's name), `proxy`
(empty for a measurement on the target arch itself, else what stood in for it, e.g.
`nvidia-proxy`), the Triton and torch versions and the date of the measurement.

Reading validates every row with a Pydantic model of its file (`WinnerRow`, `MeasurementRow`,
whose fields are exactly the column tuples below): the header must be the file's columns,
integers must be integers, times finite and non-negative. Every problem of a file is reported at
once as `file:line: column: message` (exit 2), like spec errors.

This module is pure data handling (no I/O beyond the two CSVs): render imports it, so keep it light.
"""

import bisect
import csv
import io
import math
from pathlib import Path
from typing import Annotated

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from codegen.core.errors import DataFileError
from codegen.core.ui import printable
from codegen.core.fsutil import read_input, write_if_changed
from codegen.models import TargetSpec
from codegen.models.functional import FIELDS
from codegen.models.records import Record
from codegen.models.target import DType, tile_problems
from codegen.core.resources import display_path

# Row identity: one winner per (gpu, family, functional key: codegen.models.functional).
KEY_COLUMNS = ("gpu", "family", *FIELDS)
WINNER_COLUMNS = KEY_COLUMNS + ("block_m", "block_n", "waves_per_eu", "num_warps", "num_stages", "pre_load_v",
                                "config", "time_ms", "device", "proxy")
# Provenance columns of the CSV after the ones render passes on (render ignores them).
WINNER_META_COLUMNS = ("entry", "triton", "torch", "date", "source", "candidates")
WINNER_CSV_COLUMNS = WINNER_COLUMNS + WINNER_META_COLUMNS

MEASUREMENT_COLUMNS = (
    "entry", *KEY_COLUMNS, "config", "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages",
    "pre_load_v", "status", "time_ms", "errors", "same_kernel_as", "device", "proxy", "triton",
    "torch", "date", "source",
)

CSV_LIMIT = 256 << 20  # bytes; a full tuning run's measurements.csv is a few MB
WINNERS_FILE = "winners.csv"
MEASUREMENTS_FILE = "measurements.csv"



Flag = Annotated[int, Field(ge=0, le=1)]
Positive = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]
TimeMs = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1)]


class _Row(Record):
    gpu: Name
    family: Name
    dtype: DType
    head_dim: Positive
    causal: Flag
    dropout: Flag
    bias: Flag
    seqlen_q: Positive
    seqlen_k: Positive
    config: Name
    block_m: Positive
    block_n: Positive
    waves_per_eu: Count
    num_warps: Positive
    num_stages: Count
    pre_load_v: Flag | None = None
    entry: str
    device: str
    proxy: str
    triton: str
    torch: str
    date: str
    source: str


    @field_validator("block_n")
    @classmethod
    def _tile(cls, block_n: int, info: ValidationInfo) -> int:
        block_m = info.data.get("block_m")
        if block_m is not None:
            problems = tile_problems(block_m, block_n)
            if problems:
                raise ValueError(f"tile {block_m}x{block_n} is not one the kernels take: {'; '.join(problems)}")
        return block_n


class WinnerRow(_Row):
    """One row of winners.csv (fields: WINNER_CSV_COLUMNS)."""

    time_ms: TimeMs
    candidates: Count | None = None


class MeasurementRow(_Row):
    """One row of measurements.csv (fields: MEASUREMENT_COLUMNS); no time unless measured."""

    # built on first use: render reads only winners.csv, and its start-up need not build this model
    model_config = ConfigDict(defer_build=True)

    status: Name
    time_ms: TimeMs | None = None
    errors: str
    same_kernel_as: str


_ROW_MODELS = {WINNERS_FILE: (WinnerRow, WINNER_CSV_COLUMNS),
               MEASUREMENTS_FILE: (MeasurementRow, MEASUREMENT_COLUMNS)}
_OPTIONAL = {name for model, _ in _ROW_MODELS.values()
             for name, f in model.model_fields.items() if not f.is_required()}


def _cell_errors(exc: ValidationError, raw: dict) -> list[tuple[str, str]]:
    out = []
    for e in exc.errors(include_url=False):
        col = str(e["loc"][0]) if e["loc"] else "(row)"
        if e["type"] == "missing" or (raw.get(col) == "" and e["type"] != "extra_forbidden"):
            msg = "empty: a value is required"
        elif e["type"] == "finite_number":
            msg = f"{raw.get(col)!r} is not a finite number"
        else:
            msg = e["msg"].removeprefix("Value error, ") + (f" (got {raw.get(col)!r})" if col in raw else "")
        out.append((col, msg))
    return out


def read_csv(path: Path) -> list[dict]:
    """Rows of winners.csv or measurements.csv (chosen by file name), typed; [] if absent.

    Raises DataFileError with every problem found (`file:line: column: message`)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return []
    display = display_path(path)
    model, columns = _ROW_MODELS.get(path.name, _ROW_MODELS[MEASUREMENTS_FILE])
    reader = csv.reader(io.StringIO(_read_text(path, display, columns), newline=""))
    _check_header(reader, path, display, columns)
    errors: list[str] = []
    rows: list[dict] = []
    start = reader.line_num + 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            errors.append(f"{display}:{start}: not CSV ({printable(str(exc))})")
            break
        line, start = start, reader.line_num + 1
        if not cells:
            continue
        if len(cells) != len(columns):
            errors.append(f"{display}:{line}: expected {len(columns)} fields, found {len(cells)}")
            continue
        raw = dict(zip(columns, cells))
        unprintable = [(col, next(c for c in v if not c.isprintable())) for col, v in raw.items() if not v.isprintable()]
        if unprintable:  # a NUL, an escape, a newline inside a cell: never part of a name or a number
            errors.extend(f"{display}:{line}: {col}: character {ascii(ch)} is not allowed (tune writes printable "
                          "text only)" for col, ch in unprintable)
            continue
        data = {k: (None if v == "" and k in _OPTIONAL else v) for k, v in raw.items()}
        try:
            row = model.model_validate(data)
        except ValidationError as exc:
            errors.extend(f"{display}:{line}: {col}: {msg}" for col, msg in _cell_errors(exc, raw))
            continue
        rows.append({k: ("" if v is None else v) for k, v in row.model_dump().items()})
    if errors:
        raise DataFileError(errors)
    return rows


def _read_text(path: Path, display: str, columns: tuple[str, ...]) -> str:
    """The file as UTF-8 text, not empty; one located error otherwise."""
    raw_bytes = read_input(path, what="tuning results file", limit=CSV_LIMIT)
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw_bytes.count(b"\n", 0, exc.start) + 1
        raise DataFileError([f"{display}:{line}: file is not UTF-8 text "
                             f"(byte 0x{raw_bytes[exc.start]:02x}): expected a CSV written by tune"]) from None
    if not text.strip():
        raise DataFileError([f"{display}:1: file is empty (expected the header: {','.join(columns)})"])
    return text


def _check_header(reader, path: Path, display: str, columns: tuple[str, ...]) -> None:
    """The first row must be exactly our columns, in order; one message says what differs."""
    try:
        header = next(reader)
    except csv.Error as exc:
        raise DataFileError([f"{display}:1: header: not CSV ({printable(str(exc))})"]) from None
    if tuple(header) == columns:
        return
    missing = [c for c in columns if c not in header]
    if len(missing) == len(columns):
        raise DataFileError([f"{display}:1: header: not a {path.name} header: found "
                             f"{printable(','.join(header))} (expected: {','.join(columns)})"])
    unknown = [printable(c) for c in header if c not in columns]
    why = "; ".join(x for x in (
        f"missing columns: {', '.join(missing)}" if missing else "",
        f"unknown columns: {', '.join(unknown)}" if unknown else "",
        "columns out of order" if not (missing or unknown) else "") if x)
    raise DataFileError([f"{display}:1: header: {why} (expected: {','.join(columns)})"])


def row_key(row: dict) -> tuple:
    return tuple(str(row.get(k, "")) for k in KEY_COLUMNS)


def _sort_key(columns: tuple[str, ...]):
    def key(row: dict) -> tuple:
        out = []
        for k in columns:
            v = row.get(k, "")
            out.append((0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool)
                       else (1, 0, str(v)))
        return tuple(out)
    return key


def _line(row: dict, columns: tuple[str, ...]) -> str:
    """One row as its CSV line (booleans 0/1, floats with 6 decimals, a NaN or infinity refused)."""
    out = []
    for k in columns:
        v = row.get(k, "")
        if isinstance(v, bool):
            v = int(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{k}: {v} is not a finite number (row {row.get('config', '')})")
            v = f"{v:.6f}"
        out.append("" if v is None else v)
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(out)
    return buf.getvalue()


class SortedCsv:
    """A CSV's rows, each formatted once and kept in order, for a writer that replaces a few
    rows at a time (tune records each entry as it finishes: formatting and sorting every row
    again each time made the run's writing grow with the square of its rows). `text()` is
    what `format_csv` gives for the same rows."""

    def __init__(self, rows: list[dict], columns: tuple[str, ...], sort_by: tuple[str, ...]):
        self.columns, self._key = columns, _sort_key(sort_by)
        self._seq = 0
        self._items: list[tuple] = []  # (sort key, arrival, line, row): arrival keeps sorted()'s stability
        self.replace(lambda _row: False, rows)

    def replace(self, drop, rows: list[dict]) -> None:
        """Remove the rows drop(row) is true of, then add `rows`."""
        self._items = [it for it in self._items if not drop(it[3])]
        for row in rows:
            self._seq += 1
            bisect.insort(self._items, (self._key(row), self._seq, _line(row, self.columns), row),
                          key=lambda it: it[:2])

    def rows(self) -> list[dict]:
        return [it[3] for it in self._items]

    def text(self) -> str:
        return ",".join(self.columns) + "\n" + "".join(it[2] for it in self._items)


def format_csv(rows: list[dict], columns: tuple[str, ...], sort_by: tuple[str, ...]) -> str:
    return SortedCsv(rows, columns, sort_by).text()


def winners_table(rows: list[dict]) -> SortedCsv:
    return SortedCsv(rows, WINNER_CSV_COLUMNS, KEY_COLUMNS + ("config",))


def measurements_table(rows: list[dict]) -> SortedCsv:
    return SortedCsv(rows, MEASUREMENT_COLUMNS, KEY_COLUMNS + ("config",))


def write_winners(folder: Path, rows: list[dict] | SortedCsv) -> bool:
    """Write-if-changed (atomic); whether the file changed. Likewise `write_measurements`."""
    table = rows if isinstance(rows, SortedCsv) else winners_table(rows)
    return write_if_changed(Path(folder) / WINNERS_FILE, table.text())


def write_measurements(folder: Path, rows: list[dict] | SortedCsv) -> bool:
    table = rows if isinstance(rows, SortedCsv) else measurements_table(rows)
    return write_if_changed(Path(folder) / MEASUREMENTS_FILE, table.text())


def load_winner_rows(folder: Path, spec: TargetSpec) -> list[dict]:
    """Winners of the spec's GPUs, dtypes and head dims, as render's `rows['measured']`."""
    rows = []
    for rec in read_csv(Path(folder) / WINNERS_FILE):
        if rec.get("gpu") not in spec.gpus:
            continue
        if rec.get("dtype") not in spec.dtypes or rec.get("head_dim") not in spec.head_dims:
            continue
        if rec.get("proxy") and not spec.rows.use_proxy_measurements:
            continue  # measured on a stand-in GPU: opt in with rows.use_proxy_measurements
        rows.append({k: rec[k] for k in WINNER_COLUMNS if k in rec})
    return sorted(rows, key=lambda r: tuple(str(r.get(k, "")) for k in WINNER_COLUMNS))
