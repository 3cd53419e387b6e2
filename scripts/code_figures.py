"""Print the architecture figures of issue 10, measured on the Python AST of codegen/.

    python scripts/code_figures.py [--json] [--root DIR]

Figures: functions over 80 and over 60 lines (listed), imports inside functions (count, and
those without a justifying comment on the line or the line above), whether models/, render/ or
spec.py import a stage package, and files that call os.replace/os.rename outside fsutil.py and
apply/journal.py. `tests/test_code_figures.py` asserts the bars on these figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

STAGES = ("apply", "imagebuild", "plan", "compile", "gpu", "ship")
PURE = ("core", "models", "upstream", "formats", "render")
RENAME_OWNERS = ("core/fsutil.py", "apply/journal.py")


@dataclass
class Figures:
    functions_over_80: list[str] = field(default_factory=list)   # "path:line name (N lines)"
    functions_over_60: list[str] = field(default_factory=list)
    imports_in_functions: list[str] = field(default_factory=list)  # "path:line module"
    imports_in_functions_without_comment: list[str] = field(default_factory=list)
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


def _commented(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or above its block of imports (isort groups separated by
    blank lines count as one block)."""
    i = lineno - 1
    if "#" in lines[i]:
        return True
    while i >= 1:
        above = lines[i - 1].strip()
        if above.startswith("#"):
            return True
        if not (above == "" or above.startswith("from ") or above.startswith("import ")):
            return False
        if "#" in above:
            return True
        i -= 1
    return False


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
                        if not _commented(lines, inner.lineno):
                            figs.imports_in_functions_without_comment.append(item)
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
    for name in ("imports_in_functions", "imports_in_functions_without_comment"):
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
