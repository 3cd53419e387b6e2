"""The raw JSON lines upstream's own tuner writes (AOTriton 0.10b/0.11b `test/tune_flash.py
--json_file …`, one line per measured kernel, as also read by `v2python/table_tool.py --action
rawjson`): `json_lines` splits a log into objects (or one located message per malformed line),
`read_record` validates one as a `TuningRecord`: the fields we read, others ignored; what it
accepts is what the CSVs `tune import` writes accept on the next read (positive sizes, tiles the
kernels take). A line looks like (abridged):

  {"arch": "gfx908", "kernel_name": "attn_fwd", "result": "tuned",
   "inputs": {"Q_dtype": "float16", "D_HEAD": 64, "BLOCK_DMODEL": 64, "Max_seqlen_q": 1024,
              "Max_seqlen_k": 1024, "CAUSAL_TYPE": true, "ENABLE_DROPOUT": false, "BIAS_TYPE": 0, ...},
   "tuned_kernel": {"BLOCK_M": 128, "BLOCK_N": 64, "PRE_LOAD_V": false, ...},
   "compiler_options": {"waves_per_eu": 1, "num_warps": 4, "num_stages": 1},
   "ut_passed": true, "time": [median, p20, p80], "adiffs": ..., "_debug_task_id": 3, ...}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Union

from pydantic import (AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, ValidationError,
                      model_validator)

from codegen.core.errors import DataFileError
from codegen.core.fsutil import read_input
from codegen.core.ui import printable
from codegen.models.target import tile_problems

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
    """The fields of one upstream tuning record we read (others are ignored)."""

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
        return f"expected an integer, found {shown(e['input'])}"
    return e["msg"].removeprefix("Value error, ")


def _json_type(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def shown(value) -> str:
    """A value of a log for a message: short, one line (it may be anything: a list, a mapping)."""
    text = printable(repr(value))
    return text if len(text) <= 40 else text[:39] + "…"


def read_record(j: dict, path: Path, lineno: int) -> TuningRecord:
    """One line's object as a record; DataFileError (file:line: field: message) when a field we
    read is missing or malformed."""
    try:
        return TuningRecord.model_validate(j)
    except ValidationError as exc:
        lines = []
        for e in exc.errors(include_url=False):
            loc = ".".join(printable(str(p)) for p in e["loc"]) or "(record)"
            lines.append(f"{path}:{lineno}: not an upstream tuning record: {loc}: {_problem(e)}")
        raise DataFileError(lines) from None


LOG_LIMIT = 1 << 30  # bytes: upstream's logs of a whole tuning run are tens of MB


def json_lines(path: Path):
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
