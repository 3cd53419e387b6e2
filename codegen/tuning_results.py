"""Measured tuning results committed under tuning/<arch>/ (reviewable CSV), read by render.

`winners.csv` holds one row per tuning-grid entry: the config `mi100-codegen tune` measured
fastest (numerics checked) for that entry. Render turns them into tuning-database rows that
replace the rows seeded from the donor GPU.
"""

from __future__ import annotations

import csv
from pathlib import Path

from .models import TargetSpec

WINNER_COLUMNS = (
    "gpu", "family", "dtype", "head_dim", "causal", "dropout", "bias", "seqlen_q", "seqlen_k",
    "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages", "pre_load_v",
    "config", "time_ms", "device", "proxy",
)
INT_COLUMNS = ("head_dim", "causal", "dropout", "bias", "seqlen_q", "seqlen_k", "block_m",
               "block_n", "waves_per_eu", "num_warps", "num_stages")


def load_winner_rows(folder: Path, spec: TargetSpec) -> list[dict]:
    path = Path(folder) / "winners.csv"
    if not path.is_file():
        return []
    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        for rec in csv.DictReader(fh):
            if rec.get("gpu") not in spec.gpus:
                continue
            if rec.get("dtype") not in spec.dtypes or int(rec["head_dim"]) not in spec.head_dims:
                continue
            row = {k: rec[k] for k in WINNER_COLUMNS if k in rec}
            for k in INT_COLUMNS:
                if k in row and row[k] != "":
                    row[k] = int(row[k])
            rows.append(row)
    key = lambda r: tuple(str(r.get(k, "")) for k in WINNER_COLUMNS)  # noqa: E731
    return sorted(rows, key=key)
