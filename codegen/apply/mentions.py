"""Lines of an upstream file that already mention the target arch (a partial earlier patch, a
hand edit), and the file without them, so the engine can tell "exactly what apply would write"
from a conflict. Pure text functions (no libcst)."""

from __future__ import annotations

import re

from codegen.upstream.edits import EditRecord


def _arch_re(arch: str) -> re.Pattern:
    """The arch's spellings in upstream's tables: gfx908 / GFX908 (also inside gfx908_mod0,
    GPU_AMD_ARCH_GFX908_MOD0) and its enum value 0x908."""
    word = r"(?<![0-9A-Za-z])({}|{})(?![0-9A-Za-z])"
    return re.compile(word.format(re.escape(arch), re.escape("0x" + arch[3:])), re.IGNORECASE)


def arch_mentions(text: str, arch: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line that mentions `arch`."""
    rx = _arch_re(arch)
    return [(n + 1, line.rstrip("\r\n")) for n, line in enumerate(text.splitlines()) if rx.search(line)]


def strip_mentions(text: str, arch: str, edits: list[EditRecord]) -> str:
    """`text` without what our edits would have put there: a substituted line gets its old text
    back, an element inserted into a one-line literal is taken out, any other line mentioning
    the arch is dropped. Applying the edits to the result gives `text` back exactly when the
    file holds exactly our edits (the caller checks that)."""
    rx = _arch_re(arch)
    undo = [(e.payload["new"], e.payload["old"]) for e in edits if e.op == "text.substitute"]
    undo += [(f"{e.payload}, ", "") for e in edits if e.op in ("python.seq_insert", "python.seq_insert_first")]
    undo += [(f"{e.payload.get('sep', ';')}{e.payload['item']}", "") for e in edits
             if e.op == "text.list_insert" and int(e.payload["index"]) > 0]
    undo += [(f"{e.payload['item']}{e.payload.get('sep', ';')}", "") for e in edits
             if e.op == "text.list_insert" and int(e.payload["index"]) == 0]
    out = []
    for line in text.splitlines(keepends=True):
        for new, old in undo:
            if rx.search(line) and new in line:
                line = line.replace(new, old, 1)
        if not rx.search(line):
            out.append(line)
    return "".join(out)
