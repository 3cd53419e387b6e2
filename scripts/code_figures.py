"""Print the architecture figures of issue 10, measured on the Python AST of codegen/.

    python scripts/code_figures.py [--json] [--root DIR]

Figures: functions over 80 and over 60 lines (listed), imports inside functions (count, those
without a justifying comment on the line or above the import block, and those whose comment
names neither the start-up cost the import saves, a number with ms or s, nor an import-time
dependency it breaks), whether models/, render/ or spec.py import a stage package, and files
that call os.replace/os.rename outside fsutil.py and apply/journal.py.
`tests/test_code_figures.py` asserts the bars on these figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

STAGES = ("apply", "imagebuild", "plan", "compile", "gpu", "ship")
PURE = ("core", "models", "upstream", "formats", "render")
RENAME_OWNERS = ("core/fsutil.py", "apply/journal.py")
# what justifies an import inside a function: the start-up it saves, measured ("~40 ms", "1.2 s"),
# or the import-time dependency it breaks (an optional package, an order, a cycle)
JUSTIFIED = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s)\b|\bimport-time dependency\b")


@dataclass
class Figures:
    functions_over_80: list[str] = field(default_factory=list)   # "path:line name (N lines)"
    functions_over_60: list[str] = field(default_factory=list)
    imports_in_functions: list[str] = field(default_factory=list)  # "path:line module"
    imports_in_functions_without_comment: list[str] = field(default_factory=list)
    imports_in_functions_without_cost: list[str] = field(default_factory=list)  # no cost, no dependency named
    pure_layer_imports_stage: list[str] = field(default_factory=list)  # "path:line module"
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


def measure(root: Path) -> Figures:
    figs = Figures()
    pkg = root / "codegen"
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg)
        shown = f"codegen/{rel.as_posix()}"
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text, filename=str(path))
        pure = rel.parts[0] in PURE or rel.as_posix() in PURE
        for node in ast.walk(tree):
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
            if pure and isinstance(node, (ast.Import, ast.ImportFrom)):
                for mod in _module_of(node, rel):
                    parts = mod.split(".")
                    if len(parts) > 1 and parts[0] == "codegen" and parts[1] in STAGES:
                        figs.pure_layer_imports_stage.append(f"{shown}:{node.lineno} {mod}")
            if (isinstance(node, ast.Attribute) and node.attr in ("replace", "rename")
                    and isinstance(node.value, ast.Name) and node.value.id == "os"
                    and rel.as_posix() not in RENAME_OWNERS):
                figs.atomic_renames_outside_owners.append(f"{shown}:{node.lineno}")
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
    print(f"imports inside functions whose comment names no cost (ms, s) and no import-time dependency: "
          f"{len(figs.imports_in_functions_without_cost)}")
    for i in figs.imports_in_functions_without_cost:
        print(f"  {i}")
    print(f"models/, render/, spec.py import a stage package: "
          f"{'yes' if figs.pure_layer_imports_stage else 'no'}")
    for i in figs.pure_layer_imports_stage:
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
