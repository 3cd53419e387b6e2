"""`tune import FILE`: ingest the raw JSON lines upstream's own tuner writes (AOTriton 0.10b/0.11b
`test/tune_flash.py --json_file …`, one line per measured kernel, as also read by
`v2python/table_tool.py --action rawjson`) into our measurements.csv/winners.csv.

A line looks like (abridged):
  {"arch": "gfx908", "kernel_name": "attn_fwd", "result": "tuned",
   "inputs": {"Q_dtype": "float16", "D_HEAD": 64, "BLOCK_DMODEL": 64, "Max_seqlen_q": 1024,
              "Max_seqlen_k": 1024, "CAUSAL_TYPE": true, "ENABLE_DROPOUT": false, "BIAS_TYPE": 0, ...},
   "tuned_kernel": {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": false, ...},
   "compiler_options": {"waves_per_eu": 1, "num_warps": 4, "num_stages": 1},
   "ut_passed": true, "time": [median, p20, p80], "adiffs": ..., "_debug_task_id": 3, ...}
Lines with `"result": "skipped"` and kernels we do not tune are ignored. As table_tool does,
head dims and seqlens are rounded up to upstream's bins and a truthy CAUSAL_TYPE is causal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..models import FAMILIES, KernelConfig, TargetSpec
from ..models.dtypes import by_torch
from .grid import SEQLEN_BINS, GridEntry
from .store import Provenance, config_columns, entry_columns

HEAD_DIM_BINS = (16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 512)


def _round_up(x: int, bins: tuple[int, ...]) -> int:
    for b in bins:
        if b >= x:
            return b
    return bins[-1]


def _first(d: dict, *keys, default=None):
    for k in keys:
        if k in d:
            return d[k]
    return default


def _short_dtype(value) -> str | None:
    """'torch.float16' (or 'float16') -> 'fp16'; None for a dtype we do not tune."""
    known = by_torch(str(value))
    return known.short if known else None


@dataclass
class ImportResult:
    entries: dict[str, tuple[GridEntry, list[dict]]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    outside_space: int = 0

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def _time_ms(t) -> float | None:
    if isinstance(t, list) and t:
        t = t[0]  # upstream stores [median, p20, p80]
    if isinstance(t, (int, float)) and math.isfinite(t):
        return float(t)
    return None


def _any_nan(adiffs) -> bool:
    vals = adiffs if isinstance(adiffs, list) else [adiffs]
    return any(isinstance(v, float) and math.isnan(v) for v in vals)


def _record(j: dict, path: Path, lineno: int) -> dict:
    """The fields of one upstream tuning record; UserError (file:line) when one is malformed."""
    fam = j.get("kernel_name")
    try:
        inp, tk, co = j["inputs"], j["tuned_kernel"] or {}, j["compiler_options"] or {}
        return {
            "family": fam, "arch": str(j["arch"]),
            "dtype": _short_dtype(inp["Q_dtype"]),
            "head_dim": _round_up(int(_first(inp, "D_HEAD", "BLOCK_DMODEL")), HEAD_DIM_BINS),
            "seqlen_q": _round_up(int(_first(inp, "Max_seqlen_q", "max_seqlen_q", "seqlen_q")), SEQLEN_BINS),
            "seqlen_k": _round_up(int(_first(inp, "Max_seqlen_k", "max_seqlen_k", "seqlen_k")), SEQLEN_BINS),
            "causal": bool(_first(inp, "CAUSAL_TYPE", "CAUSAL", default=0)),
            "dropout": bool(inp.get("ENABLE_DROPOUT", False)),
            "bias": bool(inp.get("BIAS_TYPE", 0)),
            "block_m": int(tk["BLOCK_M"]), "block_n": int(tk["BLOCK_N"]),
            "pre_load_v": bool(tk.get("PRE_LOAD_V", False)) if fam == "attn_fwd" else None,
            "waves_per_eu": int(co.get("waves_per_eu", 0)),
            "num_warps": int(co.get("num_warps", 4)), "num_stages": int(co.get("num_stages", 1)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"{path}:{lineno}: not an upstream tuning record ({exc!r} missing or malformed)") from None


def _status(j: dict, t: float | None) -> str:
    adiffs = j.get("adiffs")
    if t is None:
        return "error"
    if j.get("ut_passed") is False or (adiffs is not None and _any_nan(adiffs)):
        return "numerics"
    return "ok"


def _json_lines(path: Path):
    """(line number, JSON object) of every non-empty line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            j = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: not a JSON line: {exc.msg}") from None
        if not isinstance(j, dict):
            raise UserError(f"{path}:{lineno}: expected a JSON object per line")
        yield lineno, j


def parse_records(path: Path, spec: TargetSpec, accept_proxy: bool, date: str,
                  space: dict[tuple, set[str]] | None = None) -> ImportResult:
    res = ImportResult()
    for lineno, j in _json_lines(path):
        if j.get("result") != "tuned":
            res.skip(f"result {j.get('result', 'missing')!r}")
            continue
        if j.get("kernel_name") not in FAMILIES:
            res.skip(f"kernel {j.get('kernel_name')!r}")
            continue
        f = _record(j, path, lineno)
        fam, arch, dt, hd = f["family"], f["arch"], f["dtype"], f["head_dim"]
        if dt is None:
            res.skip("dtype")
            continue
        if arch != spec.arch and not accept_proxy:
            res.skip(f"arch {arch} (not {spec.arch}; --proxy imports it as a proxy)")
            continue
        if dt not in spec.dtypes or hd not in spec.head_dims:
            res.skip("dtype/head dim outside the spec")
            continue
        entry = GridEntry(fam, spec.arch, dt, hd, f["causal"], f["dropout"], f["bias"], f["seqlen_q"], f["seqlen_k"])
        cfg = KernelConfig(fam, spec.arch, dt, hd, f["block_m"], f["block_n"], f["waves_per_eu"], f["num_warps"],
                           f["num_stages"], f["pre_load_v"])
        if space is not None and cfg.name not in space.get((fam, dt, hd), set()):
            res.outside_space += 1
        t = _time_ms(j.get("time"))
        adiffs = j.get("adiffs")
        prov = Provenance(device=arch, proxy="" if arch == spec.arch else f"amd-{arch}-proxy",
                          triton="", torch="", date=date, source="import:test/tune_flash.py")
        row = {**entry_columns(entry, spec.primary_gpu), **config_columns(cfg), "status": _status(j, t),
               "time_ms": t if t is not None else "",
               "errors": "" if adiffs is None else f"adiffs={json.dumps(adiffs)}",
               "same_kernel_as": "", **prov.as_dict()}
        _, rows = res.entries.setdefault(entry.name, (entry, []))
        # the same kernel measured twice (a resumed upstream run): keep the later line
        rows[:] = [r for r in rows if r["config"] != cfg.name] + [row]
    return res
