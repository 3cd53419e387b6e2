"""The one content-addressed kernel cache of mi100-codegen, shared by `precompile`, `build` (its
warm-worker compile route) and `bundle build`: one record (+ the code object) per kernel, keyed by
what decides the code object, never by a release name: the kernel's Triton sources (the file that
defines it and the siblings it imports), kernel name, signature, compile options, target (arch,
warp size), Triton version and the compile environment. Two releases whose kernel sources are
byte-identical (0.12b and 0.12.1b) therefore share every entry.

Entries are possibly hostile input (another user's cache folder, a disk error, an interrupted
writer): keys are checked to be sha256 hex before they become file names, files are read under the
containment rule (codegen.core.contain: no symbolic link on the way) as bounded regular files
(fsutil.read_input), and a record carries the sha256 of its code object, checked on every read; an
entry that fails a check is removed and counted as a miss (the caller recompiles it). Writes are
atomic (code object first, then the record that commits it), so a killed writer leaves at most a
temporary file that no reader looks at and `evict` sweeps. The folder is bounded: `evict` removes
the least recently used entries above `max_bytes`, under a file lock (two builds may share it).
"""

from __future__ import annotations

import ast
import errno
import hashlib
import json
import os
import re
import stat
import threading
import time
from functools import lru_cache
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import ValidationError

from codegen.core.contain import inside
from codegen.core.errors import UserError
from codegen.core.fsutil import atomic_write as _atomic_write
from codegen.core.fsutil import read_input
from codegen.core.resources import user_cache_dir
from codegen.models.cache import CACHE_FORMAT, CacheRecord
from codegen.models.records import RecordError, parse_json, validate_record, write_json

CACHE_ENV = {"TRITON_F32_DEFAULT": "ieee"}  # the compile environment the tree's build sets (part of the key)
DEFAULT_MAX_BYTES = 4 * 1024**3  # a default gfx908 image set is ~3,000 code objects of 20-200 KB
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_STALE_TMP_S = 3600.0  # a temporary file older than this belongs to a writer that was killed


def default_cache_dir() -> Path:
    """`$MI100_CODEGEN_CACHE/kernels` (or ~/.cache/mi100-codegen/kernels): the one folder precompile,
    build and bundle build share."""
    return user_cache_dir("kernels")


_PARSE_LOCK = threading.Lock()  # CPython 3.11's ast.parse is not safe in concurrent threads (the
#                                 compile service keys requests in one thread per ninja edge)


def _parse(path: Path) -> ast.Module | None:
    try:
        with _PARSE_LOCK:
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
        "env": CACHE_ENV,
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def _read_entry(root: Path, rel: str, limit: int) -> bytes | None:
    """An entry's file under the containment rule (codegen.core.contain: no link on the way, the file
    itself not a link) and as a bounded regular file (fsutil.read_input); None when absent or
    refused (the caller counts it a miss and compiles again)."""
    try:
        path = inside(root, rel)
        if not path.is_file():
            return None
        return read_input(path, what="kernel cache entry", limit=limit)
    except UserError:  # Escape included
        return None


class CompileCache:
    """`get`/`put` of kernel records; `stats` counts hits, misses and corrupt entries."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "evicted": 0}
        self._puts = 0

    def _rel(self, key: str, suffix: str) -> str:
        if not _KEY_RE.match(key or ""):
            raise ValueError(f"not a kernel cache key: {key!r}")
        return f"{key[:2]}/{key}{suffix}"

    def _path(self, key: str, suffix: str) -> Path:
        return self.root / self._rel(key, suffix)

    def _drop(self, key: str) -> None:
        """Forget a record that failed a check: the record only (the commit point); a code object
        left alone may be another writer's, put a moment ago, and eviction sweeps orphans."""
        self.stats["corrupt"] += 1
        try:
            self._path(key, ".json").unlink()
        except OSError:
            pass

    def get(self, key: str) -> dict | None:
        """The record of `key`, its code object checked against the sha256 it records; a record
        that fails a check is removed (the caller compiles the kernel again)."""
        raw = _read_entry(self.root, self._rel(key, ".json"), limit=16 * 1024**2)
        if raw is None:
            self.stats["misses"] += 1
            return None
        where = str(self._path(key, ".json"))
        try:
            data = parse_json(raw, where=where, what="kernel cache record")
            if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
                self.stats["misses"] += 1   # another format's record: compiled again, not corrupt
                return None
            rec = validate_record(CacheRecord, data, where=where, what="kernel cache record")
        except RecordError:
            self._drop(key)
            return None
        if rec.key != key:
            self._drop(key)
            return None
        record = rec.to_json()
        if record.get("ok"):
            data = _read_entry(self.root, self._rel(key, ".hsaco"), limit=256 * 1024**2)
            if data is None or hashlib.sha256(data).hexdigest() != record.get("hsaco_sha256"):
                self._drop(key)
                return None
            record["_hsaco"] = data
        self.stats["hits"] += 1
        try:  # least recently used first out: a hit is a use
            os.utime(self._path(key, ".json"))
        except OSError:
            pass
        return record

    def hsaco(self, key: str) -> bytes | None:
        """The checked code object of an `ok` entry (None when absent or corrupt)."""
        record = self.get(key)
        return record.get("_hsaco") if record else None

    def put(self, key: str, record: dict, hsaco: bytes | None) -> None:
        path = self._path(key, ".json")
        clean = {k: v for k, v in record.items() if k != "_hsaco"}
        clean.update(format=CACHE_FORMAT, key=key)
        if hsaco is not None:
            clean["hsaco_sha256"] = hashlib.sha256(hsaco).hexdigest()
        try:   # only what `get` reads back is written
            rec = CacheRecord.model_validate(clean)
        except ValidationError:
            return
        if hsaco is not None:
            _atomic_write(self._path(key, ".hsaco"), hsaco)
        _atomic_write(path, write_json(rec, indent=1))
        if hsaco is not None and not self._path(key, ".hsaco").is_file():
            # another build evicted or dropped this key between our two writes: put the code object back
            _atomic_write(self._path(key, ".hsaco"), hsaco)
        self._puts += 1
        if self._puts % 64 == 0:
            self.evict()

    def size(self) -> int:
        return sum(st.st_size for _p, st in self._files())

    def _files(self):
        if not self.root.is_dir():
            return
        for sub in self.root.iterdir():
            if len(sub.name) != 2 or sub.is_symlink() or not sub.is_dir():
                continue
            for f in sub.iterdir():
                try:
                    st = f.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield f, st

    def evict(self, max_bytes: int | None = None) -> int:
        """Remove the least recently used entries until the folder holds at most `max_bytes`, and
        temporary files of killed writers; returns the entries removed. Under a file lock: another
        process evicting at the same time waits (or, after 60 s, this one skips)."""
        limit = self.max_bytes if max_bytes is None else int(max_bytes)
        if not self.root.is_dir():
            return 0
        try:
            with FileLock(str(self.root / ".evict.lock"), timeout=60):
                return self._evict(limit)
        except Timeout:
            return 0

    def _evict(self, limit: int) -> int:
        now = time.time()
        entries: dict[str, list] = {}
        for f, st in self._files():
            if f.name.startswith("."):
                if now - st.st_mtime > _STALE_TMP_S:
                    f.unlink(missing_ok=True)
                continue
            key, _, suffix = f.name.partition(".")
            e = entries.setdefault(key, [None, 0, [], st.st_mtime])
            e[1] += st.st_size
            e[2].append((f, st.st_mtime_ns))
            if suffix == "json":
                e[0] = st.st_mtime
        # a code object without its record yet belongs to a writer still at work: left alone unless stale
        entries = {k: e for k, e in entries.items() if e[0] is not None or now - e[3] > _STALE_TMP_S}
        for e in entries.values():
            e[0] = e[3] if e[0] is None else e[0]
        total = sum(e[1] for e in entries.values())
        removed = 0
        for key, (used, size, files, _) in sorted(entries.items(), key=lambda kv: kv[1][0]):
            if total <= limit:
                break
            for f, seen in sorted(files, key=lambda fs: not fs[0].name.endswith(".json")):  # the record first
                try:
                    if f.lstat().st_mtime_ns != seen:
                        break  # used or rewritten since it was listed (another build): the entry stays
                    f.unlink()
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
            else:
                total -= size
                removed += 1
        self.stats["evicted"] += removed
        return removed


KernelCache = CompileCache
