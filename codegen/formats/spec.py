"""YAML -> TargetSpec, with every error located as `file:line:col: path: message`; and the one
rewrite of a spec file (`with_exclude_rules`: precompile --prune-to).

ruamel.yaml's round-trip loader gives the line/column of every key and item; those positions are
kept in a side table (never inside the data) and used to place pydantic's errors and the
cross-field diagnostics. All errors are reported at once.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import re
from pydantic import BaseModel, ValidationError

from codegen.core.errors import SpecError, UserError
from codegen.core.ui import printable
from codegen.core.fsutil import read_input, sha256
from codegen.models import Diagnostic, TargetSpec, check_target
from codegen.core.resources import default_spec_path, display_path

if TYPE_CHECKING:
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import MarkedYAMLError

Loc = tuple[str | int, ...]

# Limits on what a spec file may be (the default spec is about 10 KB, 6 levels deep, no aliases).
# They are checked before YAML is composed, so a hostile file is refused in well under a second.
MAX_SPEC_BYTES = 64 * 1024
MAX_DEPTH = 64
MAX_NODES = 100_000  # nodes of the document once aliases are expanded


@dataclass
class LoadedSpec:
    spec: TargetSpec
    path: Path
    display: str
    sha256: str
    warnings: list[str] = field(default_factory=list)


def spec_sha256(spec: TargetSpec) -> str:
    """Hash of the spec's meaning (canonical JSON), not of its comments or layout."""
    canon = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return sha256(canon.encode())


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + printable(str(part))
    return out or "(top level)"


class _Positions:
    """Path -> (line, col), 1-based, for every node of the document."""

    def __init__(self) -> None:
        self.table: dict[Loc, tuple[int, int]] = {}

    def walk(self, node: Any, loc: Loc) -> None:
        # CLI start-up: ruamel loads only when a spec needs its positions (the located path)
        from ruamel.yaml.comments import CommentedMap, CommentedSeq

        # a node ruamel composed without positions (one a future ruamel builds differently)
        # takes its parent's: `find` walks up to the nearest located path
        if isinstance(node, CommentedMap):
            for key in node:
                self._put(loc + (str(key),), node.lc.key(key))
                self.walk(node[key], loc + (str(key),))
        elif isinstance(node, CommentedSeq):
            for i, item in enumerate(node):
                self._put(loc + (i,), node.lc.item(i))
                self.walk(item, loc + (i,))

    def _put(self, loc: Loc, mark: Any) -> None:
        if isinstance(mark, (tuple, list)) and len(mark) >= 2 and all(isinstance(v, int) for v in mark[:2]):
            self.table[loc] = (mark[0] + 1, mark[1] + 1)

    def find(self, loc: Loc) -> tuple[int, int]:
        loc = tuple(loc)
        while loc:
            if loc in self.table:
                return self.table[loc]
            loc = loc[:-1]
        return (1, 1)


def _plain(node: Any) -> Any:
    """ruamel's round-trip types -> plain JSON-able Python (other scalars as strings)."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return str(node)


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class that owns the mapping at `loc` (for 'allowed keys' hints)."""
    model: Any = TargetSpec
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        info = model.model_fields.get(part)
        if info is None:
            return None
        model = _unwrap(info.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(ann: Any) -> Any:
    for arg in (ann, *get_args(ann)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
        for sub in get_args(arg):
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                return sub
    return ann


def _pydantic_lines(exc: ValidationError) -> list[tuple[Loc, str]]:
    out = []
    for e in exc.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p and "]" in p))
        typ = e["type"]
        if typ == "missing":
            msg = "required field is missing"
        elif typ == "extra_forbidden":
            owner = _model_at(loc[:-1])
            allowed = ", ".join(sorted(owner.model_fields)) if owner else ""
            msg = "unknown key" + (f" (allowed: {allowed})" if allowed else "")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
        out.append((loc, msg))
    return out


def _mark_error(display: str, exc: MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    problem = exc.problem or "invalid YAML"
    if "duplicate" in problem.lower() or "duplicate" in str(exc.context or "").lower():
        problem = f"duplicate key: {problem}"
    elif exc.context and exc.context_mark and exc.problem_mark:
        cm = exc.context_mark
        problem = f"{problem} ({exc.context} started at {cm.line + 1}:{cm.column + 1})"
    return f"{display}:{line}:{col}: YAML: {printable(problem)}"


# the tags of YAML's core schema: a spec may spell a plain type explicitly (`!!str 0.11b`)
_CORE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "seq", "map")}


def _tag_errors(yaml: Any, text: str, display: str) -> list[str]:
    """Every node carrying a tag other than the core schema's (`!!python/object/apply:os.system`,
    `!custom`): a spec is plain data, and a tag would ask a loader to build an object. Read from
    the parser's events, before anything is constructed; a text that does not parse is left to
    the loader's own located error."""
    # CLI start-up: ruamel loads only when a spec needs its positions (the located path)
    from ruamel.yaml.error import YAMLError

    out: list[str] = []
    try:
        for ev in yaml.parse(text):
            tag = getattr(ev, "tag", None)
            tag = None if tag is None else str(getattr(tag, "value", tag))
            if tag is None or tag in _CORE_TAGS:
                continue
            shown = printable(tag.replace("tag:yaml.org,2002:", "!!"))
            shown = shown if len(shown) <= 80 else shown[:79] + "…"
            mark = ev.start_mark
            out.append(f"{display}:{mark.line + 1}:{mark.column + 1}: YAML: tag {shown} is not allowed: a spec is "
                       "plain data (mappings, lists, strings, numbers, booleans)")
            if len(out) >= 20:
                break
    except (YAMLError, RecursionError):
        return out
    return out


_NODE_START = (None, ":", "-", ",", "?", "[", "{")
_BLOCK_SCALAR = ("|", ">", "|-", "|+", ">-", ">+")


def _nesting_error(text: str) -> tuple[int, int] | None:
    """Line and column where the document nests deeper than MAX_DEPTH, found lexically.

    A bound, not a parser: block levels from the indentation stack and `- ` prefixes, flow levels
    from the `[`/`{` that open a node (outside quotes, comments and block scalars). ruamel's
    scanner is quadratic in flow depth and its composer recursive, so this runs first."""
    flow = 0
    indents: list[int] = []
    quote: str | None = None
    block_scalar_at: int | None = None  # indentation of the line that opened a block scalar
    for lineno, line in enumerate(text.split("\n"), 1):
        stripped = line.lstrip(" ")
        ind = len(line) - len(stripped)
        if block_scalar_at is not None:
            if not stripped or ind > block_scalar_at:
                continue
            block_scalar_at = None
        depth_block = len(indents)
        rest = stripped
        if flow == 0 and quote is None:
            if not stripped or stripped.startswith("#"):
                continue
            while indents and indents[-1] >= ind:
                indents.pop()
            indents.append(ind)
            dashes = 0
            while rest == "-" or rest.startswith("- "):
                dashes += 1
                rest = rest[1:].lstrip(" ")
            depth_block = len(indents) + dashes
            if depth_block > MAX_DEPTH:
                return lineno, ind + 1
            words = stripped.split(" #")[0].rstrip().split()
            if words and words[-1] in _BLOCK_SCALAR and (len(words) == 1 or words[-2].endswith(":") or words[-2] == "-"):
                block_scalar_at = ind
        prev: str | None = None
        escaped = False
        for j, ch in enumerate(line):
            if quote is not None:
                if quote == '"' and ch == "\\" and not escaped:
                    escaped = True
                    continue
                if ch == quote and not escaped:
                    quote = None
                    prev = ch
                escaped = False
                continue
            if ch in " \t":
                continue
            if ch == "#" and (j == 0 or line[j - 1] in " \t"):
                break
            if ch in "'\"" and prev in _NODE_START:
                quote = ch
            elif ch in "[{" and (flow > 0 or prev in _NODE_START):
                flow += 1
                if depth_block + flow > MAX_DEPTH:
                    return lineno, j + 1
            elif ch in "]}" and flow > 0:
                flow -= 1
            prev = ch
    return None


def _expansion_error(doc: Any) -> tuple[tuple[int, int], str] | None:
    """Position and text when aliases expand the document past MAX_NODES nodes or MAX_DEPTH
    levels, or a node contains itself. Shared nodes (aliases) are sized once (memo by id)."""
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def where(node: Any) -> tuple[int, int]:
        lc = getattr(node, "lc", None)
        return (lc.line + 1, lc.col + 1) if lc is not None and lc.line is not None else (1, 1)

    class _Stop(Exception):
        def __init__(self, node: Any, msg: str):
            self.node, self.msg = node, msg

    def size(node: Any) -> tuple[int, int]:
        if not isinstance(node, (dict, list)):
            return 1, 0
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise _Stop(node, "recursive alias (a node that contains itself)")
        active.add(key)
        children = list(node.values()) if isinstance(node, dict) else list(node)
        total, height = 1 + (len(node) if isinstance(node, dict) else 0), 0
        for child in children:
            n, h = size(child)
            total += n
            height = max(height, h + 1)
            if total > MAX_NODES:
                raise _Stop(node, f"more than {MAX_NODES} nodes once aliases are expanded (limit)")
            if height > MAX_DEPTH:
                raise _Stop(node, f"nesting deeper than {MAX_DEPTH} levels once aliases are expanded (limit)")
        active.discard(key)
        memo[key] = (total, height)
        return memo[key]

    try:
        size(doc)
    except _Stop as stop:
        return where(stop.node), stop.msg
    return None


def _read_text(path: Path, display: str) -> str:
    """The spec's text: a regular file (never a FIFO, a device or a link loop: fsutil.read_input),
    bounded in size, UTF-8, not empty; one located error otherwise."""
    try:
        raw = read_input(path, what="spec file", limit=MAX_SPEC_BYTES)
    except UserError as exc:
        if "larger than" in exc.message:
            raise SpecError([f"{display}: spec is larger than {MAX_SPEC_BYTES // 1024} KiB (the limit; "
                             f"the default spec is about 10 KB): not read"]) from None
        if not path.exists() and not path.is_symlink():
            raise UserError(f"{display}: spec file not found") from None
        raise UserError(exc.message.replace(str(path), display, 1)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(
            [f"{display}:{line}:{col}: file is not UTF-8 text (byte 0x{raw[exc.start]:02x})"]
        ) from None
    if not text.strip() or all(
        not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()
    ):
        raise SpecError([f"{display}:1:1: spec is empty (expected a mapping of target fields)"])
    return text


def _parse_yaml(text: str, display: str, yaml: Any = None) -> CommentedMap:
    """YAML -> a round-trip mapping (positions kept), with nesting and alias expansion bounded
    (`yaml`: a round-trip YAML set up to write the document back)."""
    # CLI start-up: ruamel loads only when a spec needs its positions (the located path)
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    from ruamel.yaml.reader import ReaderError

    deep = _nesting_error(text)
    if deep is not None:
        raise SpecError([f"{display}:{deep[0]}:{deep[1]}: YAML: nesting deeper than {MAX_DEPTH} levels (limit)"])
    yaml = yaml or YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    tagged = _tag_errors(yaml, text, display) if "!" in text else []
    if tagged:
        raise SpecError(tagged)
    try:
        doc = yaml.load(text)
    except MarkedYAMLError as exc:
        raise SpecError([_mark_error(display, exc)]) from None
    except RecursionError:  # a nesting the lexical bound did not see
        raise SpecError([f"{display}:1:1: YAML: nesting deeper than {MAX_DEPTH} levels (limit)"]) from None
    except ReaderError as exc:  # a character YAML does not allow (NUL, other controls)
        pos = max(0, min(int(exc.position or 0), len(text)))
        line, col = text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character or 0)
        raise SpecError([f"{display}:{line}:{col}: YAML: character {ascii(char)} is not allowed in YAML"]) from None
    except YAMLError as exc:  # ruamel marks every other parse error
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError([f"{display}:1:1: YAML: {printable(first)}"]) from None
    if not isinstance(doc, CommentedMap):
        kind = type(_plain(doc)).__name__ if doc is not None else "nothing"
        raise SpecError([f"{display}:1:1: expected a mapping of target fields, found {kind}"])
    expanded = _expansion_error(doc)
    if expanded is not None:
        (line, col), msg = expanded
        raise SpecError([f"{display}:{line}:{col}: YAML: {msg}"])
    return doc


# ------------------------------------------------------------------- the fast path (libyaml) --

_NO = object()  # "the fast path cannot vouch for this scalar"
_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]+")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.+/-]*(?: [A-Za-z0-9_.,+/()-]+)*")
_RELEASE = re.compile(r"(?:0|[1-9][0-9]*)(?:\.[0-9]+)+(?:[a-df-z][a-z]*|-dev)")  # 0.11b, 0.14.0-dev: never a number
_SPECIAL = {"true", "false", "null", "yes", "no", "on", "off", "y", "n", "nan", "inf"}
_NOT_PLAIN_ASCII = re.compile(r"[^\t\n\x20-\x7e]")


def _plain_characters(text: str) -> bool:
    """Only characters libyaml (YAML 1.1) and ruamel (YAML 1.2) read alike: tab, LF, printable
    ASCII and printable non-ASCII. Not: a byte-order mark after the first character (libyaml
    drops one anywhere, ruamel reads it as content), CR, NEL, LS, PS (line breaks in one and
    not the other), other controls and format characters."""
    body = text[1:] if text.startswith("\ufeff") else text
    return all(ch.isprintable() for ch in set(_NOT_PLAIN_ASCII.findall(body)))


def _fast_scalar(ev: Any, text: str) -> Any:
    """The value ruamel's YAML 1.2 loader gives a scalar, for the unambiguous spellings only
    (they mean the same under YAML 1.1 and 1.2): decimal ints and floats, lower-case true/false,
    empty/null, quoted strings on one line without escapes, plain words. Anything else: _NO."""
    if ev.start_mark.line != ev.end_mark.line:
        return _NO
    v = ev.value
    if ev.style in ("'", '"'):
        return _NO if "\\" in text[ev.start_mark.index:ev.end_mark.index] else v
    if ev.style:  # block scalars
        return _NO
    if v in ("", "~", "null"):
        return None
    if v in ("true", "false"):
        return v == "true"
    if _INT.fullmatch(v):
        return int(v)
    if _FLOAT.fullmatch(v):
        return float(v)
    if (_WORD.fullmatch(v) and v.split(" ")[0].lower() not in _SPECIAL) or _RELEASE.fullmatch(v):
        return v
    return _NO


def _fast_doc(text: str) -> dict | None:
    """The document as plain data via libyaml's event parser (C, ~20x ruamel's round-trip
    loader), or None where it might differ from the round-trip loader's reading or the loader
    would refuse it: no libyaml, a character outside `_plain_characters`, a parse error, anchors,
    aliases, tags, directives, more than one document, a duplicate key, a non-string key, any
    scalar `_fast_scalar` cannot vouch for, or past the nesting/node limits. None sends the
    caller to the located path (ruamel)."""
    if not _plain_characters(text):
        return None
    try:
        # CLI start-up, and an import-time dependency: pyyaml is optional (without libyaml
        # every spec takes the ruamel path)
        import yaml
        from yaml import events as ev_types

        loader = yaml.CSafeLoader
    except (ImportError, AttributeError):
        return None
    stack: list[list] = []  # [container, pending key]
    root: Any = _NO
    nodes = docs = 0
    try:
        for ev in yaml.parse(text, Loader=loader):
            kind = type(ev)
            if kind is ev_types.DocumentStartEvent:
                docs += 1
                if docs > 1 or ev.version or ev.tags:
                    return None
                continue
            if kind in (ev_types.StreamStartEvent, ev_types.StreamEndEvent, ev_types.DocumentEndEvent):
                continue
            if kind is ev_types.AliasEvent or getattr(ev, "anchor", None) is not None or getattr(ev, "tag", None) is not None:
                return None
            if kind is ev_types.MappingStartEvent or kind is ev_types.SequenceStartEvent:
                nodes += 1
                stack.append([{} if kind is ev_types.MappingStartEvent else [], _NO])
                if len(stack) > MAX_DEPTH:
                    return None
                continue
            if kind is ev_types.ScalarEvent:
                nodes += 1
                value = _fast_scalar(ev, text)
                if value is _NO:
                    return None
            else:  # the end of a mapping or sequence
                value = stack.pop()[0]
            if nodes > MAX_NODES:
                return None
            if not stack:
                root = value
                continue
            top = stack[-1]
            if isinstance(top[0], list):
                top[0].append(value)
            elif top[1] is _NO:
                if not isinstance(value, str) or kind is not ev_types.ScalarEvent or value in top[0]:
                    return None  # a non-string key (ruamel would type it), or a duplicate
                top[1] = value
            else:
                top[0][top[1]] = value
                top[1] = _NO
    except yaml.YAMLError:
        return None
    return root if isinstance(root, dict) else None


# ------------------------------------------------------------------------------- loading --


def _validate(plain: Any, path: Path, display: str, pos: _Positions | None) -> LoadedSpec | None:
    """Validate plain data; every problem located with `pos`. Without positions (the fast path)
    any error or warning returns None: the caller re-reads with positions."""

    def located(loc: Loc, msg: str, severity: str = "error") -> str:
        assert pos is not None
        line, col = pos.find(loc)
        prefix = "warning: " if severity == "warning" else ""
        return f"{display}:{line}:{col}: {prefix}{format_loc(loc)}: {printable(msg)}"

    try:
        spec = TargetSpec.model_validate_json(json.dumps(plain), strict=True)
    except ValidationError as exc:
        if pos is None:
            return None
        items = sorted(set(_pydantic_lines(exc)), key=lambda t: (pos.find(t[0]), format_loc(t[0])))
        raise SpecError([located(loc, msg) for loc, msg in items]) from None

    diags: list[Diagnostic] = check_target(spec)
    if diags and pos is None:
        return None
    order = lambda d: (pos.find(d.path), d.message)  # noqa: E731
    errors = [d for d in diags if d.severity == "error"]
    if errors:
        raise SpecError([located(d.path, d.message) for d in sorted(errors, key=order)])
    warnings = [d for d in diags if d.severity == "warning"]
    return LoadedSpec(
        spec=spec,
        path=path,
        display=display,
        sha256=spec_sha256(spec),
        warnings=[located(d.path, d.message, "warning") for d in sorted(warnings, key=order)],
    )


def load_spec(path: str | Path | None = None) -> LoadedSpec:
    """Load and validate a spec; raise SpecError with every problem found.

    A clean spec is read by libyaml (`_fast_doc`); whenever that path cannot vouch for the
    reading, or there is anything to report, the spec is read again with ruamel's round-trip
    loader, whose positions place every message: the messages come from one path only."""
    path = Path(path) if path is not None else default_spec_path()
    display = display_path(path)
    return _load_text(_read_text(path, display), path, display)


def _load_text(text: str, path: Path, display: str) -> LoadedSpec:
    if _nesting_error(text) is None:
        fast = _fast_doc(text)
        if fast is not None:
            loaded = _validate(fast, path, display, None)
            if loaded is not None:
                return loaded
    doc = _parse_yaml(text, display)
    pos = _Positions()
    pos.walk(doc, ())
    loaded = _validate(_plain(doc), path, display, pos)
    assert loaded is not None
    return loaded


def _same_rule(a, b: dict) -> bool:
    keys = set(b) - {"reason"}
    return all(a.get(k) == b[k] for k in keys) and set(a) - {"reason"} == keys


def with_exclude_rules(loaded: LoadedSpec, rules: dict[str, list[dict]]) -> tuple[str | None, int]:
    """The spec file's text with `rules` (family -> exclude rules, each a mapping with its
    `reason`) appended to its families' `tuning.<family>.exclude` lists, comments and layout kept;
    a rule the list already holds is not added again. (None, 0) when none is added (the file's
    own bytes stay); SpecError when the result is no valid spec (e.g. no config left in a cell)."""
    # CLI start-up: ruamel loads only when a spec is rewritten
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)  # the layout of rules/*.yaml
    doc = _parse_yaml(_read_text(loaded.path, loaded.display), loaded.display, yaml)
    added = 0
    for family, new in rules.items():
        fam = doc["tuning"][family]
        if fam.get("exclude") is None:
            fam["exclude"] = CommentedSeq()
        for rule in new:
            if any(_same_rule(dict(old), rule) for old in fam["exclude"]):
                continue
            item = CommentedMap({k: DoubleQuotedScalarString(v) if k == "reason" else v for k, v in rule.items()})
            item.fa.set_flow_style()
            fam["exclude"].append(item)
            added += 1
    if not added:
        return None, 0
    buf = io.StringIO()
    yaml.dump(doc, buf)
    if len(buf.getvalue().encode()) > MAX_SPEC_BYTES:
        raise SpecError([f"{loaded.display}: with the rules added, larger than {MAX_SPEC_BYTES // 1024} KiB (the limit)"])
    _load_text(buf.getvalue(), loaded.path, loaded.display)   # a pruned spec must still be a spec
    return buf.getvalue(), added


def spec_json_schema() -> str:
    schema = TargetSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "mi100-codegen target spec"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
