"""`tune import FILE`: ingest the raw JSON lines upstream's own tuner writes (the format:
codegen.formats.tuning_log) into our measurements.csv/winners.csv. Lines with `"result":
"skipped"` and kernels we do not tune are ignored. As table_tool does, head dims and seqlens are
rounded up to upstream's bins and a truthy CAUSAL_TYPE is causal.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from codegen.core.errors import DataFileError
from codegen.formats.tuning_db import SEQLEN_BINS, bin_of
from codegen.formats.tuning_log import json_lines, read_record, shown
from codegen.models import FAMILIES, KernelConfig, TargetSpec
from codegen.models.dtypes import by_torch
from codegen.gpu.tune.grid import GridEntry
from codegen.gpu.tune.store import Provenance, config_columns, entry_columns

HEAD_DIM_BINS = (16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 512)


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
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    try:
        t = float(t)  # an integer past float's range: OverflowError
    except OverflowError:
        return None
    return t if math.isfinite(t) and t >= 0 else None


def _adiffs_text(adiffs) -> str:
    """upstream's adiffs for the errors column (short: a log line may hold anything there)."""
    try:
        text = json.dumps(adiffs)
    except (RecursionError, ValueError, TypeError):
        return "(unreadable)"
    return text if len(text) <= 200 else text[:199] + "…"


def _any_nan(adiffs) -> bool:
    vals = adiffs if isinstance(adiffs, list) else [adiffs]
    return any(isinstance(v, float) and math.isnan(v) for v in vals)


def _record(j: dict, path: Path, lineno: int) -> dict:
    """The fields of one upstream tuning record, head dims and seqlens binned as table_tool bins
    them; DataFileError (file:line: field: message) when one is missing or malformed."""
    rec = read_record(j, path, lineno)
    inp, tk, co = rec.inputs, rec.tuned_kernel, rec.compiler_options
    fam = rec.kernel_name
    return {
        "family": fam, "arch": rec.arch,
        "dtype": _short_dtype(inp.Q_dtype),
        "head_dim": bin_of(HEAD_DIM_BINS, inp.head_dim),
        "seqlen_q": bin_of(SEQLEN_BINS, inp.seqlen_q),
        "seqlen_k": bin_of(SEQLEN_BINS, inp.seqlen_k),
        "causal": bool(inp.causal), "dropout": bool(inp.dropout), "bias": bool(inp.bias),
        "block_m": tk.BLOCK_M, "block_n": tk.BLOCK_N,
        "pre_load_v": bool(tk.PRE_LOAD_V) if fam == "attn_fwd" else None,
        "waves_per_eu": co.waves_per_eu, "num_warps": co.num_warps, "num_stages": co.num_stages,
    }


def _status(j: dict, t: float | None) -> str:
    adiffs = j.get("adiffs")
    if t is None:
        return "error"
    if j.get("ut_passed") is False or (adiffs is not None and _any_nan(adiffs)):
        return "numerics"
    return "ok"


_MAX_ERRORS = 20


def parse_records(path: Path, spec: TargetSpec, accept_proxy: bool, date: str,
                  space: dict[tuple, set[str]] | None = None) -> ImportResult:
    res = ImportResult()
    errors: list[str] = []
    for lineno, j, problem in json_lines(path):
        if problem is not None:
            errors.append(problem)
            if len(errors) >= _MAX_ERRORS:
                break
            continue
        if j.get("result") != "tuned":
            res.skip(f"result {shown(j.get('result', 'missing'))}")
            continue
        if j.get("kernel_name") not in FAMILIES:
            res.skip(f"kernel {shown(j.get('kernel_name'))}")
            continue
        try:
            f = _record(j, path, lineno)
        except DataFileError as exc:
            errors.extend(exc.lines)
            if len(errors) >= _MAX_ERRORS:
                break
            continue
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
               "errors": "" if adiffs is None else f"adiffs={_adiffs_text(adiffs)}",
               "same_kernel_as": "", **prov.as_dict()}
        _, rows = res.entries.setdefault(entry.name, (entry, []))
        # the same kernel measured twice (a resumed upstream run): keep the later line
        rows[:] = [r for r in rows if r["config"] != cfg.name] + [row]
    if errors:
        raise DataFileError(errors[:_MAX_ERRORS])
    return res
