"""The one reader of the records and state files mi100-codegen keeps or is handed: a tree's lock
and journal, the reach records, a bundle's manifest, the HIP sysroot record, kernel-cache
records, a torch backup manifest, a build venv's and a build folder's records, an overlay's
manifest. Each is a frozen model (`Record`: `extra="forbid"`) beside this module; this module
turns bytes into one of them, or into one error (the compile report's reader uses its parser and
its located lines too).

Every record is read as possibly hostile (a tree, a bundle, a cache or a torch folder made
elsewhere): a bounded regular file (`codegen.core.fsutil.read_input`: never a FIFO, a device or a
link loop), UTF-8, JSON parsed by pydantic-core's parser, whose nesting limit (200 levels; our
records use fewer than 10) turns a 100,000-deep document into one message instead of a
RecursionError, with no object holding a key twice (the parser keeps the last, another reader may
keep the first: a signed manifest or an index could mean two things), then one model validation. Anything else is one `RecordError` (a `UserError`,
exit 2) that locates the problem:

    PATH: FIELD.SUBFIELD: what is wrong

(`PATH: not a bundle manifest: expected a JSON object, found list` for the wrong top level),
with the reader's hint. Keys and messages taken from the input are clipped and their control
characters escaped (a 10 MB key or a newline in one cannot flood or forge a message).

Shared field types of the records live here too: `Sha256`, `Text` (at most 4,096 characters),
`Name` (at most 200 printable characters) and `Count` (a bounded non-negative integer, never a
float or a bool)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, ValidationError
from pydantic_core import from_json

from codegen.core.errors import UserError
from codegen.core.ui import printable
from codegen.core.fsutil import read_input

RECORD_LIMIT = 16 << 20   # bytes: the largest record we write (a lock of a whole overlay) is well under 1 MB
_CLIP = 120               # characters of one key or value quoted from the input in a message


class Record(BaseModel):
    """Base of every record model: frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> dict:
        """The record as it is written: the fields it was made with (none of the defaults it was
        not given), in JSON types."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


M = TypeVar("M", bound=BaseModel)


class RecordError(UserError):
    """A record that is not what its model allows (exit 2). `problem` is the located part
    (`FIELD.SUBFIELD: what is wrong`); `kind`: 'read' (not a readable regular file), 'json' (not
    UTF-8 JSON, or nested too deeply) or 'shape' (JSON, but not this record)."""

    def __init__(self, where: str, problem: str, *, kind: Literal["read", "json", "shape"],
                 hint: str | None = None):
        super().__init__(f"{where}: {problem}", hint=hint)
        self.where, self.problem, self.kind = where, problem, kind


def clip(text: str, limit: int = _CLIP) -> str:
    """Text from an input, fit for a one-line message: control characters escaped, at most
    `limit` characters (then an ellipsis and the full length)."""
    shown = printable(text[:limit])
    return shown if len(text) <= limit else f"{shown[:limit]}… ({len(text):,} characters)"


def _kind(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def describe(err: dict) -> str:
    """One pydantic error as `FIELD.SUBFIELD: what is wrong` (the located line of a message; a
    rule over several fields names them itself)."""
    where = ".".join(clip(str(p), 60) for p in err["loc"] if p != "[key]")   # a mapping's key: named once
    kind = err["type"]
    if kind == "missing":
        why = "required field is missing"
    elif kind == "extra_forbidden":
        why = "unknown key"
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        why = f"expected a mapping (JSON object), found {_kind(err.get('input'))}"
    elif kind == "list_type":
        why = f"expected a list, found {_kind(err.get('input'))}"
    else:
        why = clip(err["msg"].removeprefix("Value error, "), 240)
    return f"{where}: {why}" if where else why


def parse_json(raw: bytes, *, where: str, what: str, hint: str | None = None) -> Any:
    """`raw` as JSON (UTF-8, nesting bounded by the parser, no object holding a key twice), else
    RecordError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(where, f"this {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                                 f"{exc.start})", kind="json", hint=hint) from None
    try:
        data = from_json(raw, allow_inf_nan=True)
    except ValueError as exc:
        msg = str(exc)
        why = "nested too deeply" if "recursion limit" in msg else f"not valid JSON ({clip(msg)})"
        raise RecordError(where, f"this {what} is {why}", kind="json", hint=hint) from None
    twice = _key_twice(text)
    if twice is not None:
        raise RecordError(where, f"this {what} holds the key '{clip(twice)}' twice in one object (readers differ on "
                                 "which one counts)", kind="json", hint=hint)
    return data


class _Twice(Exception):
    pass


def _no_repeat(pairs: list[tuple[str, Any]]) -> None:
    seen = set()
    for key, _value in pairs:
        if key in seen:
            raise _Twice(key)
        seen.add(key)


def _key_twice(text: str) -> str | None:
    """A key some object of `text` (valid JSON, nesting bounded) holds twice, else None: the
    parser above keeps the last silently, another reader may keep the first."""
    try:
        json.loads(text, object_pairs_hook=_no_repeat)
    except _Twice as exc:
        return exc.args[0]
    except ValueError:   # what only this parser refuses (an integer past its digits): no repeat found
        pass
    return None


def validate_record(model: type[M], data: Any, *, where: str, what: str, hint: str | None = None,
                    context: dict | None = None, defaults: dict | None = None) -> M:
    """`data` (parsed JSON) as `model`, else RecordError naming the first problem (and how many more).
    `defaults`: fields an older writer left out (a reach record of the first format has no `format`)."""
    if not isinstance(data, dict):
        raise RecordError(where, f"not a {what}: expected a JSON object, found {_kind(data)}", kind="shape",
                          hint=hint)
    try:
        return model.model_validate({**(defaults or {}), **data}, context=context)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        raise RecordError(where, describe(errors[0]) + more, kind="shape", hint=hint) from None


def parse_record(model: type[M], raw: bytes, *, where: str, what: str, hint: str | None = None,
                 context: dict | None = None, defaults: dict | None = None) -> M:
    """Bytes already read (a zip member) as `model`, else RecordError."""
    return validate_record(model, parse_json(raw, where=where, what=what, hint=hint), where=where, what=what,
                           hint=hint, context=context, defaults=defaults)


def read_record(model: type[M], path: str | Path, *, what: str, limit: int = RECORD_LIMIT,
                hint: str | None = None, context: dict | None = None, defaults: dict | None = None) -> M:
    """The record at `path` (a bounded regular file) as `model`, else RecordError."""
    try:
        raw = read_input(path, what=what, limit=limit)
    except UserError as exc:
        raise RecordError(str(path), str(exc).removeprefix(f"{path}: "), kind="read", hint=hint) from None
    return parse_record(model, raw, where=str(path), what=what, hint=hint, context=context, defaults=defaults)


def write_json(record: Record, *, indent: int | None = 2) -> bytes:
    """How records are written: sorted keys, LF, one trailing newline."""
    return (json.dumps(record.to_json(), indent=indent, sort_keys=True) + "\n").encode()


# --- field types shared by the records ------------------------------------------------------------
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, Field(max_length=4096)]
"""A string of a record: at most 4,096 characters."""


def _printable(value: str) -> str:
    if not value.isprintable():
        raise ValueError(f"'{clip(value)}' holds a control character")
    return value


Name = Annotated[str, Field(min_length=1, max_length=200), AfterValidator(_printable)]
"""A short printable name or label (at most 200 characters)."""
Count = Annotated[StrictInt, Field(ge=0, le=1 << 40)]
"""A count or size: an integer (never a float or a bool), 0 .. 2**40."""
