"""Anchored edits of upstream files, computed at apply time from the edit records
(`Overlay.edits`: `codegen.upstream.edits.EditRecord`, built from the spec).

Python literal tables are edited with libcst (format-preserving): the new element is inserted
right before (default) or after the neighbour element, and takes the neighbour's whitespace so
the file's own alignment is kept. C++/CMake files are edited with strict text anchors: the
neighbour must occur on exactly one line of the file.

Every function here is pure: text in, text out. A problem with an anchor raises `EditConflict`;
an optional edit whose symbol is absent raises `EditSkipped`. An anchor line that carries a
comment is a local edit: refused (the comment would be cloned onto our line).

Lines that already mention the target arch are found by `codegen.apply.mentions`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Callable

import libcst as cst

from codegen.upstream.edits import EditRecord


class EditConflict(Exception):
    """The anchor is missing, ambiguous, or the tree already holds the payload."""


class EditSkipped(Exception):
    """An optional edit whose symbol the file does not have."""


def _position(edit: EditRecord) -> str:
    pos = edit.position or "before"
    if pos not in ("before", "after"):
        raise EditConflict(f"edit {edit.id}: position must be 'before' or 'after', not {pos!r}")
    return pos


# ------------------------------------------------------------------------------------- python --


_LAST: dict[str, cst.Module] = {}  # the module a python op just produced, by its code


def _parse(text: str, path: str) -> cst.Module:
    """Parse once per file: the next edit of the same file gets the module the last one made."""
    if text in _LAST:
        return _LAST[text]
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise EditConflict(f"{path}: not valid Python ({str(exc).splitlines()[0]})") from None


def _expr(src: str, what: str) -> cst.BaseExpression:
    try:
        return cst.parse_expression(src)
    except cst.ParserSyntaxError:
        raise EditConflict(f"{what}: {src!r} is not a Python expression") from None


def _assignments(module: cst.Module, symbol: str) -> list[tuple[int, int, cst.BaseSmallStatement]]:
    """Module-level `symbol = ...` / `symbol: T = ...`: (statement index, small index, node)."""
    hits = []
    for i, stmt in enumerate(module.body):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for j, small in enumerate(stmt.body):
            if isinstance(small, cst.Assign):
                names = [t.target for t in small.targets]
                if any(isinstance(n, cst.Name) and n.value == symbol for n in names):
                    hits.append((i, j, small))
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                if isinstance(small.target, cst.Name) and small.target.value == symbol:
                    hits.append((i, j, small))
    return hits


def _the_one(hits: list, edit: EditRecord, absent: str, many: str):
    """The one anchor among `hits`: none is skipped for an optional edit, else a conflict
    (`absent`); several are ambiguous (`many`, formatted with their count as `n`)."""
    if not hits:
        if edit.optional:
            raise EditSkipped(f"{edit.symbol} is absent (optional edit)")
        raise EditConflict(f"{edit.path}: {absent}")
    if len(hits) > 1:
        raise EditConflict(f"{edit.path}: {many.format(n=len(hits))} (ambiguous anchor)")
    return hits[0]


def _one_assignment(module: cst.Module, edit: EditRecord):
    symbol = edit.symbol
    return _the_one(_assignments(module, symbol), edit, f"no module-level assignment to {symbol}",
                    f"{symbol} is assigned {{n}} times")


def _replace_value(module: cst.Module, idx: tuple[int, int], new_small) -> cst.Module:
    i, j = idx
    stmt = module.body[i]
    body = list(stmt.body)
    body[j] = new_small
    new_body = list(module.body)
    new_body[i] = stmt.with_changes(body=body)
    return module.with_changes(body=new_body)


def _code(module: cst.Module, node: cst.CSTNode) -> str:
    return module.code_for_node(node)


def _check_neighbour_line(module: cst.Module, literal, nb, edit: EditRecord) -> None:
    """In a multi-line literal the neighbour must sit alone on its line(s), without a comment:
    anything else there is a local edit at the anchor (and would be cloned into the new line)."""
    code = module.code
    lit = _code(module, literal)
    if "\n" not in lit:
        return
    elem = _code(module, nb.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip()
    hits = [n for n in range(len(code)) if code.startswith(lit, n)]
    if len(hits) != 1:
        return
    start = hits[0]
    body = code[start:start + len(lit)]
    lines = [l.strip() for l in body.splitlines()]
    expected = {elem + ",", elem}
    if not any(l in expected for l in lines):
        raise EditConflict(
            f"{edit.path}: the line of {edit.neighbour} in {edit.symbol} was changed locally "
            f"(expected it alone on its line: {elem + ','!r})"
        )


def _insert_element(module: cst.Module, edit: EditRecord, kind: str) -> cst.Module:
    """Insert into the tuple/list/set (seq) or dict literal assigned to edit.symbol."""
    i, j, assign = _one_assignment(module, edit)
    value = assign.value
    path, symbol = edit.path, edit.symbol
    if kind == "seq":
        if not isinstance(value, (cst.Tuple, cst.List, cst.Set)):
            raise EditConflict(f"{path}: {symbol} is not a tuple/list/set literal")
        key_src = edit.payload
        new_value_node = _expr(key_src, f"edit {edit.id} payload")
        present = [e for e in value.elements if _code(module, e.value).strip() == key_src.strip()]
    else:
        if not isinstance(value, cst.Dict):
            raise EditConflict(f"{path}: {symbol} is not a dict literal")
        key_src = edit.payload["key"]
        new_key = _expr(key_src, f"edit {edit.id} payload key")
        new_val = _expr(str(edit.payload["value"]), f"edit {edit.id} payload value")
        present = [e for e in value.elements
                   if isinstance(e, cst.DictElement) and _code(module, e.key).strip() == key_src.strip()]
    if present:
        raise EditConflict(f"{path}: {symbol} already contains {key_src} (tree patched by something else?)")

    def ident(e) -> str:
        node = e.value if kind == "seq" else getattr(e, "key", None)
        return _code(module, node).strip() if node is not None else ""

    elems = list(value.elements)
    matches = [k for k, e in enumerate(elems) if ident(e) == edit.neighbour.strip()]
    if len(matches) != 1:
        what = "not found" if not matches else f"found {len(matches)} times"
        raise EditConflict(f"{path}: neighbour {edit.neighbour} of {symbol} {what}")
    k = matches[0]
    nb = elems[k]
    _check_neighbour_line(module, value, nb, edit)

    if kind == "seq":
        new = nb.with_changes(value=new_value_node)
    else:
        ws = nb.whitespace_before_colon
        if isinstance(ws, cst.SimpleWhitespace) and ws.value.strip(" ") == "" and ws.value:
            # keep the colon column: pad by the width difference of the keys
            col = len(_code(module, nb.key)) + len(ws.value)
            ws = cst.SimpleWhitespace(" " * max(1, col - len(key_src)))
        new = nb.with_changes(key=new_key, value=new_val, whitespace_before_colon=ws)

    # The comma after an element carries the whitespace up to the next one: give every element
    # of the pair a real comma (cloned from a neighbour that has one).
    def comma_like() -> cst.Comma:
        return next((e.comma for e in [nb] + elems if isinstance(e.comma, cst.Comma)),
                    cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))

    if _position(edit) == "before":
        new = new.with_changes(comma=nb.comma if isinstance(nb.comma, cst.Comma) else comma_like())
        elems[k:k] = [new]
    else:
        if isinstance(nb.comma, cst.Comma):
            elems[k + 1:k + 1] = [new]  # new keeps nb's comma (and so its trailing whitespace)
        else:  # nb was last without a trailing comma: nb gets one, new stays last without
            elems[k] = nb.with_changes(comma=comma_like())
            elems[k + 1:k + 1] = [new.with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    return _replace_value(module, (i, j), assign.with_changes(value=value.with_changes(elements=elems)))


def _insert_first(module: cst.Module, edit: EditRecord) -> cst.Module:
    """Insert before the first element of the list literal assigned to edit.symbol: anchored on
    the list itself, whichever archs it holds (the neighbour is whatever element comes first)."""
    _, _, assign = _one_assignment(module, edit)
    value = assign.value
    if not isinstance(value, (cst.Tuple, cst.List, cst.Set)) or not value.elements:
        raise EditConflict(f"{edit.path}: {edit.symbol} is not a non-empty tuple/list/set literal")
    first = _code(module, value.elements[0].value).strip()
    return _insert_element(module, replace(edit, neighbour=first, position="before"), "seq")


GETENV_FUNCS = ("os.getenv", "getenv", "os.environ.get")


def _set_getenv_default(module: cst.Module, edit: EditRecord) -> cst.Module:
    """Change the default of `SYMBOL = os.getenv(NEIGHBOUR, default=...)` (the one assignment
    of SYMBOL that reads that variable; later re-assignments like a split() are ignored)."""
    path, symbol = edit.path, edit.symbol
    hits = _assignments(module, symbol)
    if not hits:
        _the_one(hits, edit, f"no module-level assignment to {symbol}", "")   # skipped, or a conflict
    hits = [h for h in hits if _reads_env(module, h[2].value, edit.neighbour)]
    if len(hits) != 1:
        what = "no" if not hits else f"{len(hits)}"
        raise EditConflict(f"{path}: {what} assignments of {symbol} from os.getenv({edit.neighbour})")
    i, j, assign = hits[0]
    call = _with_getenv_default(module, assign.value, edit, symbol)
    return _replace_value(module, (i, j), assign.with_changes(value=call))


def _reads_env(module: cst.Module, node: cst.CSTNode, neighbour: str) -> bool:
    """`node` is an os.getenv(NEIGHBOUR, ...) call (any spelling in GETENV_FUNCS)."""
    return (isinstance(node, cst.Call) and _code(module, node.func).strip() in GETENV_FUNCS and bool(node.args)
            and _code(module, node.args[0].value).strip() == neighbour.strip())


def _with_getenv_default(module: cst.Module, call: cst.Call, edit: EditRecord, where: str) -> cst.Call:
    """The getenv call with its default argument (keyword or second positional) set to the payload."""
    args = list(call.args)
    slot = [n for n, a in enumerate(args) if a.keyword is not None and a.keyword.value == "default"]
    if not slot and len(args) >= 2 and args[1].keyword is None:
        slot = [1]
    if len(slot) != 1:
        raise EditConflict(f"{edit.path}: {where}: os.getenv(...) has no default argument to change")
    n = slot[0]
    args[n] = args[n].with_changes(value=_expr(edit.payload, f"edit {edit.id} payload"))
    return call.with_changes(args=args)


class _GetenvCalls(cst.CSTVisitor):
    """The os.getenv(NEIGHBOUR, ...) calls below a node."""

    def __init__(self, module: cst.Module, neighbour: str):
        self.module, self.neighbour, self.hits = module, neighbour, []

    def visit_Call(self, node: cst.Call) -> None:
        if _reads_env(self.module, node, self.neighbour):
            self.hits.append(node)


class _ReplaceNode(cst.CSTTransformer):
    def __init__(self, old: cst.CSTNode, new: cst.CSTNode):
        self.old, self.new = old, new

    def on_leave(self, original_node, updated_node):
        return self.new if original_node is self.old else updated_node


def _set_getenv_default_in_function(module: cst.Module, edit: EditRecord) -> cst.Module:
    """Change the default of the one `os.getenv(NEIGHBOUR, default=...)` call inside the
    module-level function SYMBOL (0.13b reads the head dims inside `block_dmodel_values()`)."""
    path, symbol = edit.path, edit.symbol
    func = _the_one([st for st in module.body if isinstance(st, cst.FunctionDef) and st.name.value == symbol],
                    edit, f"no module-level function {symbol}()", f"{symbol}() is defined {{n}} times")
    finder = _GetenvCalls(module, edit.neighbour)
    func.visit(finder)
    if len(finder.hits) != 1:
        what = "no" if not finder.hits else f"{len(finder.hits)}"
        raise EditConflict(f"{path}: {what} os.getenv({edit.neighbour}) calls in {symbol}()")
    call = finder.hits[0]
    return module.visit(_ReplaceNode(call, _with_getenv_default(module, call, edit, f"{symbol}()")))


# --------------------------------------------------------------------------------------- text --


def _symbol_re(symbol: str) -> re.Pattern:
    words = symbol.split()
    return re.compile(r".*?".join(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9_])" for w in words))


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _eol(line: str) -> str:
    return line[len(line.rstrip("\r\n")):] or "\n"


def _unique_line(lines: list[str], edit: EditRecord) -> int:
    path, nbr = edit.path, edit.neighbour
    sym = _symbol_re(edit.symbol)
    if not any(sym.search(l) for l in lines):
        if edit.optional:
            raise EditSkipped(f"{edit.symbol} is absent (optional edit)")
        raise EditConflict(f"{path}: symbol {edit.symbol!r} not found")
    hits = [n for n, l in enumerate(lines) if nbr in l]
    if len(hits) != 1:
        what = "not found" if not hits else f"matches {len(hits)} lines"
        raise EditConflict(f"{path}: anchor {nbr!r} {what}")
    n = hits[0]
    if not any(sym.search(l) for l in lines[: n + 1]):
        raise EditConflict(f"{path}: anchor {nbr!r} is not inside {edit.symbol!r}")
    if _has_comment(lines[n], path):
        raise EditConflict(f"{path}:{n + 1}: the anchor line carries a comment (a local edit?): "
                           f"{lines[n].strip()!r}")
    return n


_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def _has_comment(line: str, path: str) -> bool:
    """A comment on the line, outside string literals (`//`, `/*` in C/C++; `#` elsewhere)."""
    code = _STRING_RE.sub('""', line)
    if PurePosixPath(path).suffix in (".h", ".hh", ".hpp", ".c", ".cc", ".cpp", ".cxx"):
        return "//" in code or "/*" in code
    return "#" in code


def _substitute(line: str, pairs: list, edit: EditRecord) -> str:
    for old, new in pairs:
        if line.count(old) != 1:
            raise EditConflict(
                f"{edit.path}: anchor line {line.strip()!r} has {line.count(old)} occurrences of {old!r}"
            )
        line = line.replace(old, new)
    return line


def _text_op(text: str, edit: EditRecord) -> str:
    lines = _lines(text)
    n = _unique_line(lines, edit)
    line = lines[n]
    op, payload = edit.op, edit.payload
    if op == "text.clone_line":
        new = _substitute(line, payload["substitute"], edit)
        if new == line or new in lines:
            raise EditConflict(f"{edit.path}: the line {new.strip()!r} is already there")
        at = n if _position(edit) == "before" else n + 1
        lines[at:at] = [new]
    elif op == "text.substitute":
        new = _substitute(line, [(payload["old"], payload["new"])], edit)
        if payload["new"] in line:
            raise EditConflict(f"{edit.path}: {line.strip()!r} already contains {payload['new']!r}")
        lines[n] = new
    elif op == "text.replace_line":
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        eol = _eol(line)
        lines[n : n + 1] = [indent + p + eol for p in payload["lines"]]
    else:  # pragma: no cover - guarded by OPS
        raise AssertionError(op)
    return "".join(lines)


def _list_insert(text: str, edit: EditRecord) -> str:
    """Insert payload['item'] at payload['index'] of the quoted, payload['sep']-separated list that
    follows the anchor on its (unique) line, e.g. CMake's `set(AOTRITON_TARGET_ARCH "a;b;c" ...)`:
    anchored on the list, not on any arch's place in it."""
    lines = _lines(text)
    n = _unique_line(lines, edit)
    line = lines[n]
    item, sep, index = str(edit.payload["item"]), str(edit.payload.get("sep", ";")), int(edit.payload["index"])
    start = line.index(edit.neighbour) + len(edit.neighbour)
    end = line.find('"', start)
    if end < 0:
        raise EditConflict(f"{edit.path}: no closing quote after {edit.neighbour!r}: {line.strip()!r}")
    items = line[start:end].split(sep) if line[start:end] else []
    if item in items:
        raise EditConflict(f"{edit.path}: {edit.symbol} already contains {item!r}")
    items.insert(min(index, len(items)), item)
    lines[n] = line[:start] + sep.join(items) + line[end:]
    return "".join(lines)


def _python_op(fn: Callable[[cst.Module, EditRecord], cst.Module]) -> Callable[[str, EditRecord], str]:
    def run(text: str, edit: EditRecord) -> str:
        module = fn(_parse(text, edit.path), edit)
        code = module.code
        _LAST.clear()
        _LAST[code] = module
        return code

    return run


OPS: dict[str, Callable[[str, EditRecord], str]] = {
    "python.seq_insert": _python_op(lambda m, e: _insert_element(m, e, "seq")),
    "python.dict_insert": _python_op(lambda m, e: _insert_element(m, e, "dict")),
    "python.set_getenv_default": _python_op(_set_getenv_default),
    "python.set_getenv_default_in_function": _python_op(_set_getenv_default_in_function),
    "python.seq_insert_first": _python_op(_insert_first),
    "text.list_insert": _list_insert,
    "text.clone_line": _text_op,
    "text.substitute": _text_op,
    "text.replace_line": _text_op,
}


def apply_edit(text: str, edit: EditRecord) -> str:
    """Return `text` with `edit` applied. Raises EditConflict / EditSkipped."""
    op = OPS.get(edit.op)
    if op is None:
        raise EditConflict(f"edit {edit.id}: unknown op {edit.op!r}")
    new = op(text, edit)
    if new == text:
        raise EditConflict(f"{edit.path}: edit {edit.id} changes nothing")
    return new
