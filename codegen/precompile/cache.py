"""Persistent compile cache: one JSON record (+ the code object) per kernel, keyed by the hash of
its Triton sources (the kernel file and the siblings it imports), signature, compile options,
target and the Triton version."""

from __future__ import annotations

import ast
import hashlib
import json
from functools import lru_cache
from pathlib import Path

from ..fsutil import atomic_write as _atomic_write
from ..resources import user_cache_dir

CACHE_FORMAT = 4  # 2: resources read from the metadata note, waves-per-eu bound; 3: dot-instruction counts;
#                  4: sources = the kernel file's import closure


def default_cache_dir() -> Path:
    return user_cache_dir("precompile")


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def _sibling_imports(tree: ast.Module) -> set[str]:
    """Module names a kernel file imports that may be siblings (`import x`, `from x import`,
    `from .x import`); AOTriton's kernels import their helpers as top-level siblings."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level <= 1:
            names.add(node.module.split(".")[0])
    return names


def _closure(start: Path) -> dict[str, tuple[Path, ast.Module | None]]:
    """The file and every sibling module it imports, transitively: name -> (path, its AST)."""
    root = start.parent
    seen: dict[str, tuple[Path, ast.Module | None]] = {}
    todo = [start]
    while todo:
        p = todo.pop()
        if p.name in seen:
            continue
        tree = _parse(p)
        seen[p.name] = (p, tree)
        for name in _sibling_imports(tree) if tree else ():
            todo.extend(c for c in (root / f"{name}.py", root / name / "__init__.py") if c.is_file())
    return seen


def _defines(tree: ast.Module | None, name: str) -> bool:
    return tree is not None and any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


@lru_cache(maxsize=256)
def source_hash(source: str, kernel_name: str | None = None) -> str:
    """sha256 over the file that defines the kernel and every sibling module it imports.

    Only that import closure counts, not the whole folder nor a re-exporting entry module:
    releases that ship the same kernel files beside different tests or tools, or name another
    entry module (0.12b and 0.12.1b plan `flash.py`, 0.13b `fwd_kernel.py`, …), share entries."""
    files = _closure(Path(source))
    if kernel_name:
        home = next((p for p, tree in files.values() if _defines(tree, kernel_name)), None)
        if home is not None:
            files = _closure(home)
    root = Path(source).parent
    h = hashlib.sha256()
    for name in sorted(files):
        p = files[name][0]
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def cache_key(*, source: str, kernel_name: str, signature: str, num_warps: int, num_stages: int,
              waves_per_eu: int, arch: str, warp_size: int, triton_version: str) -> str:
    ident = {
        "format": CACHE_FORMAT,
        "sources": source_hash(source, kernel_name),
        "kernel": kernel_name,
        "signature": ",".join(s.strip() for s in signature.split(",")),
        "options": {"num_warps": num_warps, "num_stages": num_stages, "waves_per_eu": waves_per_eu},
        "target": {"backend": "hip", "arch": arch, "warp_size": warp_size},
        "triton": triton_version,
        "env": {"TRITON_F32_DEFAULT": "ieee"},
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


class CompileCache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}{suffix}"

    def get(self, key: str) -> dict | None:
        try:
            record = json.loads(self._path(key, ".json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if record.get("format") != CACHE_FORMAT:
            return None
        if record.get("ok") and not self._path(key, ".hsaco").is_file():
            return None
        return record

    def hsaco(self, key: str) -> bytes | None:
        try:
            return self._path(key, ".hsaco").read_bytes()
        except OSError:
            return None

    def put(self, key: str, record: dict, hsaco: bytes | None) -> None:
        if hsaco is not None:
            _atomic_write(self._path(key, ".hsaco"), hsaco)
        data = json.dumps({**record, "format": CACHE_FORMAT}, sort_keys=True, indent=1).encode()
        _atomic_write(self._path(key, ".json"), data)
