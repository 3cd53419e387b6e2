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

from typing import Annotated, Union

from pydantic import (AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError,
                      model_validator)

from codegen.core.errors import DataFileError
from codegen.core.ui import printable
from codegen.core.fsutil import read_input
from codegen.models import FAMILIES, KernelConfig, TargetSpec
from codegen.models.target import tile_problems
from codegen.models.dtypes import by_torch
from codegen.gpu.tune.grid import SEQLEN_BINS, GridEntry
from codegen.gpu.tune.store import Provenance, config_columns, entry_columns

HEAD_DIM_BINS = (16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256, 512)


def _round_up(x: int, bins: tuple[int, ...]) -> int:
    for b in bins:
        if b >= x:
            return b
    return bins[-1]


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


Int = Annotated[int, Field(strict=True)]  # a JSON integer: not 64.5, not true, not 1e400
Flag = Union[StrictBool, Annotated[int, Field(strict=True, ge=0, le=1 << 31)]]  # truthy: as table_tool reads it


class _Inputs(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    Q_dtype: str
    head_dim: Annotated[Int, Field(ge=1, le=1 << 16)] = Field(validation_alias=AliasChoices("D_HEAD", "BLOCK_DMODEL"))
    seqlen_q: Annotated[Int, Field(ge=1, le=1 << 31)] = Field(
        validation_alias=AliasChoices("Max_seqlen_q", "max_seqlen_q", "seqlen_q"))
    seqlen_k: Annotated[Int, Field(ge=1, le=1 << 31)] = Field(
        validation_alias=AliasChoices("Max_seqlen_k", "max_seqlen_k", "seqlen_k"))
    causal: Flag = Field(0, validation_alias=AliasChoices("CAUSAL_TYPE", "CAUSAL"))
    dropout: Flag = Field(False, validation_alias="ENABLE_DROPOUT")
    bias: Flag = Field(0, validation_alias="BIAS_TYPE")


class _Kernel(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    BLOCK_M: Annotated[Int, Field(ge=1, le=1 << 16)]
    BLOCK_N: Annotated[Int, Field(ge=1, le=1 << 16)]
    PRE_LOAD_V: Flag = False

    @model_validator(mode="after")
    def _tile(self) -> "_Kernel":
        problems = tile_problems(self.BLOCK_M, self.BLOCK_N)
        if problems:
            raise ValueError(f"tile {self.BLOCK_M}x{self.BLOCK_N} is not one the kernels take: {'; '.join(problems)}")
        return self


class _Options(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    waves_per_eu: Annotated[Int, Field(ge=0, le=64)] = 0
    num_warps: Annotated[Int, Field(ge=1, le=64)] = 4
    num_stages: Annotated[Int, Field(ge=0, le=64)] = 1


def _none_to_empty(v):
    return {} if v is None else v


class TuningRecord(BaseModel):
    """The fields of one upstream tuning record we read (others are ignored); the one parser of
    a line of `tune import FILE`. What it accepts is what the CSVs we write accept on the next
    read (`codegen.formats.tuning_csv`): positive sizes, tiles the kernels take."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    kernel_name: str
    arch: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:+-]{1,64}$")]  # written into the CSVs' device column
    inputs: _Inputs
    tuned_kernel: _Kernel
    compiler_options: Annotated[_Options, BeforeValidator(_none_to_empty)] = _Options()


def _problem(e: dict) -> str:
    """One pydantic error of a record, in our words."""
    if e["type"] == "missing":
        return "required field is missing"
    if e["type"] in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping (JSON object), found {_json_type(e.get('input'))}"
    if e["type"] in ("int_type", "int_from_float") and isinstance(e.get("input"), float):
        return f"expected an integer, found {_shown(e['input'])}"
    return e["msg"].removeprefix("Value error, ")


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _record(j: dict, path: Path, lineno: int) -> dict:
    """The fields of one upstream tuning record; DataFileError (file:line: field: message) when
    one is missing or malformed."""
    try:
        rec = TuningRecord.model_validate(j)
    except ValidationError as exc:
        lines = []
        for e in exc.errors(include_url=False):
            loc = ".".join(printable(str(p)) for p in e["loc"]) or "(record)"
            lines.append(f"{path}:{lineno}: not an upstream tuning record: {loc}: {_problem(e)}")
        raise DataFileError(lines) from None
    inp, tk, co = rec.inputs, rec.tuned_kernel, rec.compiler_options
    fam = rec.kernel_name
    return {
        "family": fam, "arch": rec.arch,
        "dtype": _short_dtype(inp.Q_dtype),
        "head_dim": _round_up(inp.head_dim, HEAD_DIM_BINS),
        "seqlen_q": _round_up(inp.seqlen_q, SEQLEN_BINS),
        "seqlen_k": _round_up(inp.seqlen_k, SEQLEN_BINS),
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


LOG_LIMIT = 1 << 30  # bytes: upstream's logs of a whole tuning run are tens of MB


def _json_lines(path: Path):
    """(line number, JSON object, None) of every non-empty line, or (line number, None, message)
    for a malformed one (not UTF-8, not JSON, numbers past the parser, nesting past the
    interpreter, not an object), located as file:line."""
    raw = read_input(path, what="tuning log", limit=LOG_LIMIT)
    for lineno, chunk in enumerate(raw.split(b"\n"), 1):
        if not chunk.strip():
            continue
        try:
            j = json.loads(chunk.decode("utf-8"))
        except UnicodeDecodeError as exc:
            yield lineno, None, (f"{path}:{lineno}: not UTF-8 text (byte 0x{chunk[exc.start]:02x}): expected "
                                 "upstream's JSON lines")
        except json.JSONDecodeError as exc:
            yield lineno, None, f"{path}:{lineno}: not a JSON line: {exc.msg} (column {exc.colno})"
        except RecursionError:
            yield lineno, None, f"{path}:{lineno}: not an upstream tuning record: nested too deeply"
        except ValueError as exc:  # an integer with more digits than the parser allows
            yield lineno, None, f"{path}:{lineno}: not a JSON line: {printable(str(exc))[:120]}"
        else:
            if isinstance(j, dict):
                yield lineno, j, None
            else:
                yield lineno, None, f"{path}:{lineno}: expected a JSON object per line, found {type(j).__name__}"


_MAX_ERRORS = 20


def parse_records(path: Path, spec: TargetSpec, accept_proxy: bool, date: str,
                  space: dict[tuple, set[str]] | None = None) -> ImportResult:
    res = ImportResult()
    errors: list[str] = []
    for lineno, j, problem in _json_lines(path):
        if problem is not None:
            errors.append(problem)
            if len(errors) >= _MAX_ERRORS:
                break
            continue
        if j.get("result") != "tuned":
            res.skip(f"result {_shown(j.get('result', 'missing'))}")
            continue
        if j.get("kernel_name") not in FAMILIES:
            res.skip(f"kernel {_shown(j.get('kernel_name'))}")
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


def _shown(value) -> str:
    """A value of the log for a message: short, one line (it may be anything: a list, a mapping)."""
    text = printable(repr(value))
    return text if len(text) <= 40 else text[:39] + "…"
