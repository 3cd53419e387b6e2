"""The one content-addressed kernel cache of mi100-codegen, shared by `precompile`, `build` (its
warm-worker compile route) and `bundle build`: one record (+ the code object) per kernel, keyed by
what decides the code object, never by a release name: the kernel's Triton sources (the file that
defines it and the siblings it imports), kernel name, signature, compile options, target (arch,
warp size), Triton version and the compile environment (`KernelIdent`). Two releases whose kernel
sources are byte-identical (0.12b and 0.12.1b) therefore share every entry.

The cache is trusted storage, like ccache's (docs/trust.md, "The kernel cache"): opening it
(`check_cache_dir`, before any work) refuses a cache folder or two-hex subfolder that is a
symbolic link, another user's, or writable by others (a sticky folder of yours excepted), with
the fix; an entry file that is a link or not yours is never read (a miss) and never written
through. Entries are still checked on every read, against the caller's `KernelIdent`: the
record's sha256 of its code object, then the code object itself (`entry_problem`: kernel symbol
and metadata name, arch and features, wave size, workgroup size of `num_warps`, the kernarg
layout of the signature) and the record's resources and Triton sidecar against the object's
metadata note. An entry that fails is dropped and counted `corrupt` (the caller recompiles).
A compile failure is remembered for this process only, never stored: another run compiles the
kernel again, so a failure record found on disk (planted, or an older version's) is a miss.
Writes are atomic (code object first, then the record that commits it), into a subfolder
created under the containment rule and checked again after creating it, so a killed writer
leaves at most a temporary file that no reader looks at and `evict` sweeps. The folder is
bounded: `evict` removes the least recently used entries above `max_bytes`, under a file lock
(two builds may share it).
"""

from __future__ import annotations

import contextlib
import ast
import hashlib
import json
import os
import re
import stat
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import ValidationError

from codegen.core.contain import inside
from codegen.core.errors import UserError
from codegen.core.fsutil import atomic_write as _atomic_write
from codegen.core.fsutil import read_input, trusted_storage
from codegen.core.resources import user_cache_dir
from codegen.models.cache import CACHE_FORMAT, CacheRecord
from codegen.models.records import RecordError, parse_json, validate_record, write_json
from codegen.upstream import kernel_arg_types
from codegen.formats.elf import ElfError, parse_target_id, read_code_object
from codegen.compile.resources import note_resources

CACHE_ENV = {"TRITON_F32_DEFAULT": "ieee"}  # the compile environment the tree's build sets (part of the key)
DEFAULT_MAX_BYTES = 4 * 1024**3  # a default gfx908 image set is ~3,000 code objects of 20-200 KB
_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_SUB_RE = re.compile(r"^[0-9a-f]{2}$")
_FIX = "or point --cache-dir (or $MI100_CODEGEN_CACHE) at a kernel cache of your own"
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


@dataclass(frozen=True)
class KernelIdent:
    """What decides a kernel's code object: its cache entry's key (`key`, the sha256 of these
    fields with the cache format and compile environment), and what every read of the entry
    checks its code object against (`entry_problem`). `sources`: `source_hash` of the kernel file."""

    sources: str
    kernel_name: str
    signature: str          # entries stripped of spaces: '*fp16:16,i32,64'
    num_warps: int
    num_stages: int
    waves_per_eu: int
    arch: str
    warp_size: int
    triton_version: str

    @property
    def key(self) -> str:
        ident = {
            "format": CACHE_FORMAT,
            "sources": self.sources,
            "kernel": self.kernel_name,
            "signature": self.signature,
            "options": {"num_warps": self.num_warps, "num_stages": self.num_stages, "waves_per_eu": self.waves_per_eu},
            "target": {"backend": "hip", "arch": self.arch, "warp_size": self.warp_size},
            "triton": self.triton_version,
            "env": CACHE_ENV,
        }
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def kernel_ident(*, source: str, kernel_name: str, signature: str, num_warps: int, num_stages: int,
                 waves_per_eu: int, arch: str, warp_size: int, triton_version: str) -> KernelIdent:
    return KernelIdent(sources=source_hash(source, kernel_name), kernel_name=kernel_name,
                       signature=",".join(s.strip() for s in signature.split(",")), num_warps=num_warps,
                       num_stages=num_stages, waves_per_eu=waves_per_eu, arch=arch, warp_size=warp_size,
                       triton_version=triton_version)


# --- what a read checks of an entry ---------------------------------------------------------------
# Triton's layout of a kernel's arguments: a pointer is a global buffer of 8 bytes, a scalar is
# passed by value at its natural alignment; after the signature's own, Triton 3.5+ appends up to
# two pointers of its own (global and profile scratch).
_SCALAR_BYTES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "fp16": 2, "bf16": 2, "i32": 4, "u32": 4,
                 "fp32": 4, "i64": 8, "u64": 8, "fp64": 8}
TRITON_TRAILING_ARGS = 2
IMPLICIT_ARG_BYTES = 256  # LLVM's hidden kernel arguments, code object v5


def kernarg_layout(signature: str) -> list[tuple[str, int | None, int | None]]:
    """(value kind, offset, size) of each argument a kernel compiled from `signature` takes, in
    order; offset and size None from the first scalar type whose size is not in the table on."""
    out: list[tuple[str, int | None, int | None]] = []
    off: int | None = 0
    for t in kernel_arg_types(signature):
        kind, size = ("global_buffer", 8) if t.startswith("*") else ("by_value", _SCALAR_BYTES.get(t))
        if off is not None and size is not None:
            off = -(-off // size) * size
            out.append((kind, off, size))
            off += size
        else:
            off = None
            out.append((kind, None, None))
    return out


def _kernarg_problem(meta: dict, signature: str) -> str | None:
    """How the code object's kernel arguments (its metadata note's `.args` and
    `.kernarg_segment_size`) differ from the layout `signature` implies, followed by LLVM's hidden
    arguments when it has any; None when they agree."""
    args = meta.get(".args") if isinstance(meta.get(".args"), list) else None
    if args is None or not all(isinstance(a, dict) for a in args):
        return "no kernel argument list in the metadata note"
    explicit = [(a.get(".value_kind"), a.get(".offset"), a.get(".size")) for a in args
                if not str(a.get(".value_kind", "")).startswith("hidden_")]
    want = kernarg_layout(signature)
    head, tail = explicit[:len(want)], explicit[len(want):]
    same = len(head) == len(want) and all(
        h[0] == w[0] and (w[1] is None or (h[1], h[2]) == (w[1], w[2])) for h, w in zip(head, want))
    if not same or len(tail) > TRITON_TRAILING_ARGS or any(t[0] != "global_buffer" or t[2] != 8 for t in tail):
        return (f"{len(explicit)} kernel arguments {[k for k, _o, _s in explicit][:8]}..., "
                f"the signature takes {len(want)} (+ at most {TRITON_TRAILING_ARGS} Triton pointers)")
    ends = [o + n for _k, o, n in explicit if isinstance(o, int) and isinstance(n, int)]
    explicit_end = -(-max(ends, default=0) // 8) * 8
    hidden = [(a.get(".offset"), a.get(".size")) for a in args if str(a.get(".value_kind", "")).startswith("hidden_")]
    if not all(isinstance(o, int) and isinstance(n, int) for o, n in hidden):
        return "a hidden kernel argument without offset or size"
    size = meta.get(".kernarg_segment_size")
    # LLVM's implicit arguments follow the explicit ones, in a block of at most IMPLICIT_ARG_BYTES
    lo = max([explicit_end] + [o + n for o, n in hidden])
    hi = explicit_end + (IMPLICIT_ARG_BYTES if hidden else 0)
    if not isinstance(size, int) or not lo <= size <= hi or any(o < explicit_end for o, _n in hidden):
        return f"kernarg segment of {size!r} bytes, its arguments take {lo}" + (f" to {hi}" if hi > lo else "")
    return None


def entry_problem(ident: KernelIdent, record: CacheRecord, hsaco: bytes) -> str | None:
    """Why `hsaco` (and the `record` beside it) is not what compiling `ident` gives, as far as the
    code object itself shows; None when nothing shows it. Checked: an AMDGPU code object whose
    target (e_flags and the metadata note's `amdhsa.target`) is the arch with its features, one
    kernel named as the key's, with its symbol and descriptor, its wave size, a workgroup of
    `num_warps` waves, the argument layout of the signature; the record's resources that the
    note decides, and Triton's sidecar (name, options, target) that the image packer reads. Not
    checkable from the object: which constexpr values (flags) and which sources it came from."""
    try:
        co = read_code_object(hsaco, "code object")
        want = parse_target_id(ident.arch)
    except (ElfError, ValueError) as exc:
        return str(exc)
    if (co.arch, co.features()) != want:
        return f"a code object for {co.target_id()}, the key's target is {ident.arch}"
    try:
        noted = parse_target_id(co.target or "")
    except ValueError as exc:
        return str(exc)
    if noted != want:
        return f"metadata note target {co.target!r}, the key's target is {ident.arch}"
    name = ident.kernel_name
    if list(co.kernels) != [name]:
        return f"kernels {sorted(map(str, co.kernels))[:4]} in the code object, the key's is {name}"
    meta = co.kernels[name]
    if meta.get(".symbol") != f"{name}.kd" or not {name, f"{name}.kd"} <= co.symbols:
        return f"no kernel symbol {name} and descriptor {name}.kd"
    if meta.get(".wavefront_size") != ident.warp_size:
        return f"wave size {meta.get('.wavefront_size')!r}, the key's is {ident.warp_size}"
    if meta.get(".max_flat_workgroup_size") != ident.num_warps * ident.warp_size:
        return f"workgroup of {meta.get('.max_flat_workgroup_size')!r} lanes, the key's num_warps {ident.num_warps}"
    why = _kernarg_problem(meta, ident.signature)
    if why:
        return why
    return _record_problem(ident, record, meta, co.text_bytes)


def _record_problem(ident: KernelIdent, record: CacheRecord, meta: dict, text_bytes: int) -> str | None:
    """The record's sidecar and resources against the key and the code object's metadata note."""
    try:
        side = parse_json((record.sidecar or "").encode(), where="sidecar", what="Triton metadata sidecar")
    except RecordError as exc:
        return str(exc)
    if not isinstance(side, dict):
        return "no Triton metadata sidecar"
    for field, want in (("name", ident.kernel_name), ("arch", ident.arch), ("warp_size", ident.warp_size),
                        ("num_warps", ident.num_warps), ("num_stages", ident.num_stages),
                        ("waves_per_eu", ident.waves_per_eu)):
        if side.get(field) != want or type(side.get(field)) is not type(want):
            return f"sidecar {field} {side.get(field)!r}, the key's is {want!r}"
    shared = side.get("shared")
    if type(shared) is not int or shared < 0 or record.resources is None:
        return "no resources, or no shared-memory size in the sidecar"
    try:
        want_res = note_resources(meta, shared, text_bytes)
    except ValueError as exc:
        return str(exc)
    got = record.resources.model_dump()
    wrong = sorted(k for k, v in want_res.items() if got.get(k) != v)
    return f"resources {wrong} differ from the code object's metadata note" if wrong else None


def check_cache_dir(root: Path) -> None:
    """Refuse (UntrustedStorage, exit 2, with the fix) a kernel cache folder, or one of its two-hex
    subfolders, that is a symbolic link, belongs to someone else, or that others may write (a
    sticky folder of yours excepted: others can add to it but not replace what is yours, and an
    entry file not yours is never read). Nothing to check where the folder does not exist yet."""
    root = Path(root)
    if not os.path.lexists(root):
        return
    trusted_storage(root, what="kernel cache folder", sticky_ok=True, hint=_FIX)
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        raise UserError(f"{root}: cannot list this kernel cache folder ({exc.strerror or exc})", hint=_FIX) from None
    for n in names:
        if not _SUB_RE.match(n):
            continue
        try:
            st = os.lstat(root / n)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
            trusted_storage(root / n, what="kernel cache subfolder", sticky_ok=True, hint=_FIX)


def _read_entry(root: Path, rel: str, limit: int) -> bytes | None:
    """An entry's file under the containment rule (codegen.core.contain: no link on the way, the file
    itself not a link), as a bounded regular file that is trusted storage (fsutil.read_input:
    yours, and no one else may write it); None when absent or refused (the caller counts it a
    miss and compiles again)."""
    try:
        return read_input(inside(root, rel), what="kernel cache entry", limit=limit, trusted=True)
    except UserError:  # Escape and UntrustedStorage included
        return None


class CompileCache:
    """`get`/`put` of kernel records by `KernelIdent`; `stats` counts hits, misses, corrupt
    entries (dropped), evicted ones, and puts refused (a subfolder or entry file not trusted)."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES):
        """Open the cache at `root`, creating it; refuses one someone else could have written
        (`check_cache_dir`, UntrustedStorage)."""
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.stats = {"hits": 0, "misses": 0, "corrupt": 0, "evicted": 0, "refused": 0}
        self.problems: list[tuple[str, str]] = []    # (key, why) of each entry dropped, for messages and tests
        self._failed: dict[str, dict] = {}           # this process's compile failures, by key
        self._puts = 0
        if not os.path.lexists(self.root):
            try:
                self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
            except OSError as exc:
                raise UserError(f"{self.root}: cannot create the kernel cache folder ({exc.strerror or exc})",
                                hint=_FIX.removeprefix("or ")) from None
        check_cache_dir(self.root)  # after creating it too: what is there now must be ours

    def _rel(self, key: str, suffix: str) -> str:
        if not _KEY_RE.match(key or ""):
            raise ValueError(f"not a kernel cache key: {key!r}")
        return f"{key[:2]}/{key}{suffix}"

    def _entry(self, key: str, suffix: str) -> Path:
        """The entry file's path, no link on the way (the file itself may be one: a link is
        removed or replaced, never followed); Escape otherwise."""
        return inside(self.root, self._rel(key, suffix), final_link=True)

    def _drop(self, key: str, why: str) -> None:
        """Forget a record that failed a check: the record only (the commit point); a code object
        left alone may be another writer's, put a moment ago, and eviction sweeps orphans."""
        self.stats["corrupt"] += 1
        self.problems.append((key, why))
        with contextlib.suppress(OSError, UserError):
            self._entry(key, ".json").unlink()

    def get(self, ident: KernelIdent) -> dict | None:
        """The record of `ident`, its code object checked against the sha256 it records and
        against `ident` (`entry_problem`); a record that fails a check is removed (the caller
        compiles the kernel again). A failure is served only if this process compiled it."""
        key = ident.key
        if key in self._failed:
            self.stats["hits"] += 1
            return dict(self._failed[key])
        raw = _read_entry(self.root, self._rel(key, ".json"), limit=16 * 1024**2)
        if raw is None:
            self.stats["misses"] += 1
            return None
        where = str(self.root / self._rel(key, ".json"))
        try:
            data = parse_json(raw, where=where, what="kernel cache record")
            if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
                self.stats["misses"] += 1   # another format's record: compiled again, not corrupt
                return None
            rec = validate_record(CacheRecord, data, where=where, what="kernel cache record")
        except RecordError as exc:
            self._drop(key, str(exc))
            return None
        if rec.key != key:
            self._drop(key, "a record filed under another key")
            return None
        if not rec.ok:
            self.stats["misses"] += 1  # a failure from another run (or planted): compiled again
            return None
        image = _read_entry(self.root, self._rel(key, ".hsaco"), limit=256 * 1024**2)
        if image is None or hashlib.sha256(image).hexdigest() != rec.hsaco_sha256:
            self._drop(key, "the code object is missing or not the one its record names")
            return None
        why = entry_problem(ident, rec, image)
        if why:
            self._drop(key, why)
            return None
        record = rec.to_json()
        record["_hsaco"] = image
        self.stats["hits"] += 1
        with contextlib.suppress(OSError, UserError):  # least recently used first out: a hit is a use
            os.utime(self._entry(key, ".json"), follow_symlinks=False)
        return record

    def _subfolder(self, key: str) -> bool:
        """The entry's subfolder, created under the containment rule and checked again after
        creating it (a link, or another user's folder put there meanwhile, is refused)."""
        try:
            sub = inside(self.root, key[:2])
            sub.mkdir(mode=0o755, exist_ok=True)
            trusted_storage(sub, what="kernel cache subfolder", sticky_ok=True)
        except (OSError, UserError):
            return False
        return True

    def put(self, ident: KernelIdent, record: dict, hsaco: bytes | None) -> None:
        key = ident.key
        clean = {k: v for k, v in record.items() if k != "_hsaco"}
        clean.update(format=CACHE_FORMAT, key=key)
        if not clean.get("ok") or hsaco is None:
            self._failed[key] = clean  # this run's only: never written (module doc)
            return
        self._failed.pop(key, None)
        clean["hsaco_sha256"] = hashlib.sha256(hsaco).hexdigest()
        try:   # only what `get` reads back is written
            rec = CacheRecord.model_validate(clean)
        except ValidationError:
            return
        if not self._subfolder(key):
            self.stats["refused"] += 1
            return
        try:
            _atomic_write(self._entry(key, ".hsaco"), hsaco)
            _atomic_write(self._entry(key, ".json"), write_json(rec, indent=1))
            if not os.path.lexists(self._entry(key, ".hsaco")):
                # another build evicted or dropped this key between our two writes: put the code object back
                _atomic_write(self._entry(key, ".hsaco"), hsaco)
        except (PermissionError, UserError):  # a file another user put in a sticky folder, a link on the way
            self.stats["refused"] += 1
            return
        self._puts += 1
        if self._puts % 64 == 0:
            self.evict()

    def size(self) -> int:
        return sum(st.st_size for _p, st in self._files())

    def _files(self):
        """(path, lstat) of each regular file of ours in a two-hex subfolder (no link followed)."""
        try:
            subs = [s for s in self.root.iterdir() if _SUB_RE.match(s.name) and not s.is_symlink() and s.is_dir()]
        except OSError:
            return
        for sub in subs:
            try:
                files = list(sub.iterdir())
            except OSError:
                continue
            for f in files:
                try:
                    st = f.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():  # what is not ours stays
                    yield f, st

    def evict(self, max_bytes: int | None = None) -> int:
        """Remove the least recently used entries until the folder holds at most `max_bytes`, and
        temporary files of killed writers; returns the entries removed. Under a file lock: another
        process evicting at the same time waits (or, after 60 s, this one skips)."""
        limit = self.max_bytes if max_bytes is None else int(max_bytes)
        lock = self._lock_file()
        if lock is None:
            return 0
        try:
            with FileLock(str(lock), timeout=60):
                return self._evict(limit)
        except Timeout:
            return 0

    def _lock_file(self) -> Path | None:
        """`.evict.lock`, a regular file of ours (created without following a link: FileLock opens
        it by name); None when it is anything else (no eviction then)."""
        path = self.root / ".evict.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        return path if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() else None

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
                except FileNotFoundError:
                    continue
                except PermissionError:
                    break
            else:
                total -= size
                removed += 1
        self.stats["evicted"] += removed
        return removed
