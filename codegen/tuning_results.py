"""Measured tuning results committed under tuning/<arch>/ (reviewable CSV), read by render.

`winners.csv` holds one row per tuning-grid entry: the config `mi100-codegen tune` measured
fastest (numerics checked) for that entry. Render turns them into tuning-database rows that
replace the rows seeded from the donor GPU (`codegen.models.rows.Winner`; the database
columns a winner becomes are `codegen.upstream.tuning_db.winner_row`). `measurements.csv` beside it holds every candidate
measured for every entry (time, status, errors against the fp64 reference): the evidence.

Both files are sorted, LF, with provenance on every row: `device` (the GPU's name), `proxy`
(empty for a measurement on the target arch itself, else what stood in for it, e.g.
`nvidia-proxy`), the Triton and torch versions and the date of the measurement.

This module is pure data handling (stdlib only): render imports it, so keep it light.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from .fsutil import write_if_changed
from .models import TargetSpec

WINNER_COLUMNS = (
    "gpu", "family", "dtype", "head_dim", "causal", "dropout", "bias", "seqlen_q", "seqlen_k",
    "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages", "pre_load_v",
    "config", "time_ms", "device", "proxy",
)
# Provenance columns of the CSV after the ones render passes on (render ignores them).
WINNER_META_COLUMNS = ("entry", "triton", "torch", "date", "source", "candidates")
WINNER_CSV_COLUMNS = WINNER_COLUMNS + WINNER_META_COLUMNS

MEASUREMENT_COLUMNS = (
    "entry", "gpu", "family", "dtype", "head_dim", "causal", "dropout", "bias", "seqlen_q",
    "seqlen_k", "config", "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages",
    "pre_load_v", "status", "time_ms", "errors", "same_kernel_as", "device", "proxy", "triton",
    "torch", "date", "source",
)
INT_COLUMNS = ("head_dim", "causal", "dropout", "bias", "seqlen_q", "seqlen_k", "block_m",
               "block_n", "waves_per_eu", "num_warps", "num_stages", "pre_load_v", "candidates")
FLOAT_COLUMNS = ("time_ms",)

WINNERS_FILE = "winners.csv"
MEASUREMENTS_FILE = "measurements.csv"

# Row identity: one winner per (gpu, family, functional inputs).
KEY_COLUMNS = ("gpu", "family", "dtype", "head_dim", "causal", "dropout", "bias",
               "seqlen_q", "seqlen_k")



def _typed(rec: dict) -> dict:
    row = dict(rec)
    for k in INT_COLUMNS:
        if k in row and row[k] not in ("", None):
            row[k] = int(row[k])
    for k in FLOAT_COLUMNS:
        if k in row and row[k] not in ("", None):
            row[k] = float(row[k])
    return row


def read_csv(path: Path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return [_typed(rec) for rec in csv.DictReader(fh)]


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


def format_csv(rows: list[dict], columns: tuple[str, ...], sort_by: tuple[str, ...]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for row in sorted(rows, key=_sort_key(sort_by)):
        out = {}
        for k in columns:
            v = row.get(k, "")
            if isinstance(v, bool):
                v = int(v)
            elif isinstance(v, float):
                v = f"{v:.6f}"
            out[k] = "" if v is None else v
        w.writerow(out)
    return buf.getvalue()


def write_text_atomic(path: Path, text: str) -> bool:
    """Write-if-changed via atomic replace; returns whether the file changed."""
    return write_if_changed(path, text)


def write_winners(folder: Path, rows: list[dict]) -> bool:
    return write_text_atomic(Path(folder) / WINNERS_FILE,
                             format_csv(rows, WINNER_CSV_COLUMNS, KEY_COLUMNS + ("config",)))


def write_measurements(folder: Path, rows: list[dict]) -> bool:
    return write_text_atomic(
        Path(folder) / MEASUREMENTS_FILE,
        format_csv(rows, MEASUREMENT_COLUMNS, KEY_COLUMNS + ("config",)),
    )


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
