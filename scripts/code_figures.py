"""Print the architecture figures of issue 10, measured on the Python AST of codegen/.

    python scripts/code_figures.py [--json] [--root DIR]

Figures: functions over 80 and over 60 lines (listed), imports inside functions (count, those
without a justifying comment on the line or above the import block, and those whose comment
names neither the start-up it saves nor an import-time dependency it breaks), timings in
comments and docstrings (a figure like `~40 ms`: they belong in docs/measurements.md), the package edges against the layers of docs/explanation/architecture.md
(every import, function-level ones too, and every `python -m codegen.…` process the code starts;
the order is read from that page's table, its one statement), and files that call
os.replace/os.rename outside fsutil.py and apply/journal.py.
`tests/test_code_figures.py` asserts the bars on these figures.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path

ARCHITECTURE = "docs/explanation/architecture.md"   # its table lists the packages from the top
RENAME_OWNERS = ("core/fsutil.py", "apply/journal.py")
# what justifies an import inside a function: the start-up it saves ("CLI start-up: rich loads only
# when a stage prints"), or the import-time dependency it breaks (an optional package, an order, a cycle)
JUSTIFIED = re.compile(r"\bstart-up\b|\bimport-time dependency\b")
# a timing in a comment or a docstring: an approximate figure ("~40 ms", "≈0.45 s", "~1.2 s") or
# minutes and seconds ("3 min 47 s"); a deadline the code sets ("after 60 s") is no measurement
TIMING = re.compile(r"[~≈]\s?\d+(?:\.\d+)?\s?(?:ms|s|min)\b|\b\d+\s?min\s\d+\s?s\b|\b\d+ of \d+ s\b")


@dataclass
class Figures:
    functions_over_80: list[str] = field(default_factory=list)   # "path:line name (N lines)"
    functions_over_60: list[str] = field(default_factory=list)
    imports_in_functions: list[str] = field(default_factory=list)  # "path:line module"
    imports_in_functions_without_comment: list[str] = field(default_factory=list)
    imports_in_functions_without_cost: list[str] = field(default_factory=list)  # no cost, no dependency named
    timings_in_comments: list[str] = field(default_factory=list)  # "path:line figure"
    layer_order: list[list[str]] = field(default_factory=list)   # the page's rows, from the top
    layer_violations: list[str] = field(default_factory=list)  # "path:line a -> b (module)", cycles, unlisted
    atomic_renames_outside_owners: list[str] = field(default_factory=list)  # "path:line"


def _module_of(node: ast.Import | ast.ImportFrom, rel: Path) -> list[str]:
    """Absolute dotted module names an import statement names (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        return [node.module or ""]
    pkg = ["codegen", *rel.with_suffix("").parts]
    pkg = pkg[: len(pkg) - node.level]  # the module file itself, then each level up
    base = ".".join(pkg)
    if node.module:
        return [f"{base}.{node.module}"]
    return [f"{base}.{a.name}" for a in node.names]


def _comment(lines: list[str], lineno: int) -> str | None:
    """The comment that justifies the import at `lineno`: on its line, or above its block of
    imports (isort groups separated by blank lines count as one block; a comment of several
    lines is read whole); None without one."""
    i = lineno - 1
    if "#" in lines[i]:
        return lines[i][lines[i].index("#"):]
    while i >= 1:
        above = lines[i - 1].strip()
        if above.startswith("#"):
            block = []
            while i >= 1 and lines[i - 1].strip().startswith("#"):
                block.insert(0, lines[i - 1].strip())
                i -= 1
            return " ".join(block)
        if not (above == "" or above.startswith("from ") or above.startswith("import ")):
            return None
        if "#" in above:
            return above[above.index("#"):]
        i -= 1
    return None


def layer_order(root: Path) -> list[list[str]]:
    """The architecture page's table of packages, one row per layer from the top, each row the
    packages its first cell names (`render/`, `apply/`, … in one row: one layer)."""
    rows = []
    for line in (root / ARCHITECTURE).read_text(encoding="utf-8").splitlines():
        cells = line.split("|")
        names = re.findall(r"`(\w+)/`", cells[1]) if line.startswith("|") and len(cells) > 2 else []
        if names:
            rows.append(names)
    return rows


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def _processes(node: ast.AST, docstrings: set[int]) -> list[str]:
    """The `codegen.…` modules `node` starts as `python -m`: an argument list holding "-m" and
    the module, or a command line in a string (a docstring is prose, not a process)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [b.value for a, b in zip(node.elts, node.elts[1:])
                if isinstance(a, ast.Constant) and a.value == "-m" and isinstance(b, ast.Constant)
                and isinstance(b.value, str) and b.value.startswith("codegen.")]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
        return re.findall(r"-m\s+(codegen(?:\.\w+)+)", node.value)
    return []


def _imported(node: ast.AST, rel: Path) -> list[str]:
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "codegen":
        return [f"codegen.{a.name}" for a in node.names]   # `from codegen import models`
    return _module_of(node, rel) if isinstance(node, (ast.Import, ast.ImportFrom)) else []


def _layer_violations(root: Path, edges: list[tuple[str, str, str, str]]) -> tuple[list[list[str]], list[str]]:
    """Edges (where, from, to, what) against the page's order: each one that climbs, each cycle
    within a row, each package the page does not list."""
    order = layer_order(root)
    rank = {p: i for i, row in enumerate(order) for p in row}
    pkg = root / "codegen"
    packages = sorted(p.name for p in pkg.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    out = [f"codegen/{p}/: not a row of {ARCHITECTURE}'s table" for p in packages if p not in rank]
    graph: dict[str, set[str]] = {}
    for where, a, b, what in edges:
        graph.setdefault(a, set()).add(b)
        if a in rank and b in rank and rank[b] < rank[a]:
            out.append(f"{where} {a} -> {b} ({what})")

    def reaches(src: str, dst: str) -> bool:
        seen, todo = set(), [src]
        while todo:
            v = todo.pop()
            if v == dst:
                return True
            if v not in seen:
                seen.add(v)
                todo.extend(graph.get(v, ()))
        return False

    out += sorted(f"cycle: {a} -> {b} -> … -> {a}" for a, targets in graph.items() for b in targets
                  if a in rank and rank[a] == rank.get(b) and reaches(b, a))   # across rows: a climb, listed above
    return order, out


def _timings(text: str, tree: ast.AST) -> list[tuple[int, str]]:
    """(line, figure) of each timing in a comment or a docstring."""
    found = [(tok.start[0], m.group(0)) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
             if tok.type == tokenize.COMMENT for m in TIMING.finditer(tok.string)]
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body \
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant) \
                and isinstance(n.body[0].value.value, str):
            doc = n.body[0].value
            found += [(doc.lineno + i, m.group(0)) for i, line in enumerate(doc.value.splitlines())
                      for m in TIMING.finditer(line)]
    return sorted(found)


def measure(root: Path) -> Figures:
    figs = Figures()
    pkg = root / "codegen"
    edges: list[tuple[str, str, str, str]] = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        shown = f"codegen/{rel.as_posix()}"
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        docstrings = _docstrings(tree)
        figs.timings_in_comments += [f"{shown}:{line} {figure}" for line, figure in _timings(text, tree)]
        for node in ast.walk(tree):
            targets = [(m, m) for m in _imported(node, rel)] + [(m, f"python -m {m}") for m in _processes(node, docstrings)]
            for mod, what in targets:
                parts = mod.split(".")
                if (len(parts) > 1 and parts[0] == "codegen" and parts[1] != unit
                        and ((pkg / parts[1] / "__init__.py").exists() or (pkg / f"{parts[1]}.py").exists())):
                    edges.append((f"{shown}:{node.lineno}", unit, parts[1], what))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - start + 1
                if n > 60:
                    item = f"{shown}:{node.lineno} {node.name} ({n} lines)"
                    figs.functions_over_60.append(item)
                    if n > 80:
                        figs.functions_over_80.append(item)
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        item = f"{shown}:{inner.lineno} {', '.join(_module_of(inner, rel))}"
                        figs.imports_in_functions.append(item)
                        comment = _comment(lines, inner.lineno)
                        if comment is None:
                            figs.imports_in_functions_without_comment.append(item)
                        elif not JUSTIFIED.search(comment):
                            figs.imports_in_functions_without_cost.append(item)
            if (isinstance(node, ast.Attribute) and node.attr in ("replace", "rename")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and rel.as_posix() not in RENAME_OWNERS):
                figs.atomic_renames_outside_owners.append(f"{shown}:{node.lineno}")
    figs.layer_order, figs.layer_violations = _layer_violations(root, edges)
    # an import nested in two functions is listed once
    for name in ("imports_in_functions", "imports_in_functions_without_comment", "imports_in_functions_without_cost"):
        setattr(figs, name, sorted(set(getattr(figs, name))))
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ns = ap.parse_args(argv)
    figs = measure(ns.root)
    if ns.json:
        print(json.dumps(asdict(figs), indent=2))
        return 0
    rename_files = sorted({i.split(":")[0] for i in figs.atomic_renames_outside_owners})
    print(f"functions over 80 lines: {len(figs.functions_over_80)}")
    for i in figs.functions_over_80:
        print(f"  {i}")
    print(f"functions over 60 lines: {len(figs.functions_over_60)}")
    for i in figs.functions_over_60:
        print(f"  {i}")
    print(f"imports inside functions: {len(figs.imports_in_functions)} "
          f"({len(figs.imports_in_functions_without_comment)} without a justifying comment)")
    for i in figs.imports_in_functions_without_comment:
        print(f"  {i}")
    print(f"imports inside functions whose comment names no start-up and no import-time dependency: "
          f"{len(figs.imports_in_functions_without_cost)}")
    for i in figs.imports_in_functions_without_cost:
        print(f"  {i}")
    print(f"timings in comments and docstrings: {len(figs.timings_in_comments)}")
    for i in figs.timings_in_comments:
        print(f"  {i}")
    print(f"layers ({' > '.join('/'.join(row) for row in figs.layer_order)}), edges against them: "
          f"{len(figs.layer_violations)}")
    for i in figs.layer_violations:
        print(f"  {i}")
    print(f"files with os.replace/os.rename outside {', '.join(RENAME_OWNERS)}: {len(rename_files)}")
    for f in rename_files:
        print(f"  {f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # e.g. piped into head
        sys.exit(0)
