"""Results of `tune` on disk: measurements.csv + winners.csv under the output folder, rewritten
atomically after every grid entry, so an interrupted run loses at most the entry in flight and
`--resume` knows exactly what is done (an entry is done once its measurement rows exist)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from codegen.core.errors import UserError
from codegen.models import KernelConfig
from codegen.formats.tuning_csv import (
    MEASUREMENTS_FILE,
    WINNERS_FILE,
    measurements_table,
    read_csv,
    row_key,
    winners_table,
    write_measurements,
    write_winners,
)
from codegen.gpu.tune.grid import GridEntry

LOCK_FILE = ".tune.lock"


@dataclass(frozen=True)
class Provenance:
    device: str  # GPU name as the driver reports it
    proxy: str  # "" when measured on the target arch, else e.g. "nvidia-proxy"
    triton: str
    torch: str
    date: str  # YYYY-MM-DD
    source: str = "mi100-codegen tune"

    def as_dict(self) -> dict:
        return {"device": self.device, "proxy": self.proxy, "triton": self.triton,
                "torch": self.torch, "date": self.date, "source": self.source}


def entry_columns(entry: GridEntry, gpu: str) -> dict:
    return {
        "entry": entry.name, "gpu": gpu, "family": entry.family, "dtype": entry.dtype,
        "head_dim": entry.head_dim, "causal": int(entry.causal), "dropout": int(entry.dropout),
        "bias": int(entry.bias), "seqlen_q": entry.seqlen_q, "seqlen_k": entry.seqlen_k,
    }


def config_columns(cfg: KernelConfig) -> dict:
    return {
        "config": cfg.name, "block_m": cfg.block_m, "block_n": cfg.block_n,
        "waves_per_eu": cfg.waves_per_eu, "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
        "pre_load_v": "" if cfg.pre_load_v is None else int(cfg.pre_load_v),
    }


def pick_winner(rows: list[dict]) -> dict | None:
    """Fastest row whose status is ok; ties go to the config name (lowest waves_per_eu first,
    as names sort)."""
    ok = [r for r in rows if r.get("status") == "ok" and isinstance(r.get("time_ms"), (int, float))
          and math.isfinite(r["time_ms"])]
    if not ok:
        return None
    return min(ok, key=lambda r: (float(r["time_ms"]), int(r.get("waves_per_eu") or 0), r["config"]))


def winner_from(best: dict, n_candidates: int) -> dict:
    w = {k: best.get(k, "") for k in (
        "gpu", "family", "dtype", "head_dim", "causal", "dropout", "bias", "seqlen_q", "seqlen_k",
        "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages", "pre_load_v", "config",
        "time_ms", "device", "proxy", "entry", "triton", "torch", "date", "source")}
    w["candidates"] = n_candidates
    return w


class ResultStore:
    """The output folder of one tuning run (locked while the run writes)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(str(self.folder / LOCK_FILE))
        self._measurements = measurements_table(read_csv(self.folder / MEASUREMENTS_FILE))
        self._winners = winners_table(read_csv(self.folder / WINNERS_FILE))

    @property
    def measurements(self) -> list[dict]:
        return self._measurements.rows()

    @property
    def winners(self) -> list[dict]:
        return self._winners.rows()

    def __enter__(self) -> "ResultStore":
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise UserError(f"{self.folder} is being written by another tune run "
                            f"(lock {self.folder / LOCK_FILE})") from None
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()
        (self.folder / LOCK_FILE).unlink(missing_ok=True)

    def done_entries(self) -> set[str]:
        return {r["entry"] for r in self.measurements if r.get("entry")}

    def devices(self) -> set[str]:
        return {r.get("device", "") for r in self.measurements if r.get("device")}

    def record(self, entry: GridEntry, rows: list[dict], n_candidates: int) -> dict | None:
        """Replace the entry's rows (and its winner), then flush both files (each row is
        formatted once: `formats.tuning_csv.SortedCsv`)."""
        self._measurements.replace(lambda r: r.get("entry") == entry.name, rows)
        best = pick_winner(rows)
        key = row_key(rows[0]) if rows else None
        winner = winner_from(best, n_candidates) if best is not None else None
        self._winners.replace(lambda w: w.get("entry") == entry.name or (key is not None and row_key(w) == key),
                              [winner] if winner is not None else [])
        write_measurements(self.folder, self._measurements)
        write_winners(self.folder, self._winners)
        return winner
