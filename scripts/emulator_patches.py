#!/usr/bin/env python3
"""Print our fixes to the pinned tinygrad AMD emulator as notes upstream could take: for each part
of our layer (codegen.emulate.parts) the emulator's functions it concerns, with their lines in the
pinned tree (found by name in its source, not copied), what is wrong for GFX9, and the corrected
rule. Markdown on stdout.

    scripts/emulator_patches.py              # the tree from TINYGRAD_SRC / TINYGRAD_GIT / shared/emulators
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codegen.emulate import source  # noqa: E402  (after the checkout is on sys.path)
from codegen.emulate.parts import PARTS_TABLE  # noqa: E402


def _lines(root: Path, rel: str) -> dict[str, int]:
    """Top-level function/class name -> its first line in `rel` of the pinned tree."""
    path = root / "test" / "mockgpu" / "amd" / rel
    if not path.is_file():
        return {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node.lineno
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = node.lineno
    return out


def main() -> int:
    root = source.emulator_root()
    print(f"# Fixes to tinygrad's AMD emulator for GFX9 (commit {source.COMMIT})\n")
    for part in PARTS_TABLE:
        where = []
        for chunk in part.where.split(";"):
            file, _, names = chunk.strip().partition(":")
            lines = _lines(root, file.strip()) if file.strip().endswith(".py") else {}
            for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", names):
                if name in lines:
                    where.append(f"`{file.strip()}:{lines[name]}` {name}")
        print(f"## {part.name}\n\n- where: {part.where}" + (f" ({', '.join(where)})" if where else ""))
        print(f"- wrong: {part.wrong}\n- rule: {part.rule}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
