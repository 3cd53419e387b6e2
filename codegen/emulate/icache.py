"""The compiled instructions of every Machine child on this host, kept across runs (child-side).

Compiling an instruction (tinygrad's passes over its kernel, then clang) is the emulator's main
cost; one kernel of AOTriton's has a few hundred distinct instructions, and every child compiled
them again. Here each compiled instruction is one row of an SQLite file: its kind, the bits that
select it (base, mask: the emulator's canonical form, register fields left out), its buffers and
its object code. A child reads the index at start and loads an object when an instruction needs
it. The file's name carries everything the objects depend on (the emulator's commit, our
child-side sources, the layer's parts, clang and the host CPU, since clang compiles for it), so a
change of any is a new file. The folder is trusted storage (the parent checks it, as it checks the
kernel cache): the objects are executed."""

from __future__ import annotations

import hashlib
import platform
import sqlite3
import subprocess
from pathlib import Path

from codegen.core import processes
from codegen.emulate import source

_SCHEMA = ("CREATE TABLE IF NOT EXISTS inst (kind TEXT, base TEXT, mask TEXT, globals TEXT, barrier INTEGER, "
           "name TEXT, lib BLOB, PRIMARY KEY (kind, base, mask))")
CHILD_SOURCES = ("child.py", "compiler.py", "dispatch.py", "gfx9.py", "guard.py", "icache.py", "parts.py", "runner.py")


def _host() -> str:
    """What clang's `-march=native` objects depend on: the CPU's model and flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            lines = [ln for ln in fh.read(1 << 20).splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = []
    return platform.machine() + "|" + "|".join(lines) + "|" + platform.processor()


def _clang(cc: str) -> str:
    try:
        return processes.run([cc, "--version"], capture_output=True, timeout=60).stdout.decode(errors="replace").strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def version(layer_version: str, bounded: bool, cc: str) -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in CHILD_SOURCES:
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    for part in (source.COMMIT, layer_version, str(bounded), _clang(cc), _host()):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:20]


class InstructionCache:
    """Rows of compiled instructions in `folder`/instructions-<version>.sqlite."""

    def __init__(self, folder: str, key: str):
        self.path = Path(folder) / f"instructions-{key}.sqlite"
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(_SCHEMA)

    def index(self) -> dict[str, list[tuple[int, int, tuple, bool, str]]]:
        """kind -> [(base, mask, globals, is_barrier, name)] of every row."""
        out: dict[str, list] = {}
        for kind, base, mask, globs, barrier, name in self.db.execute(
                "SELECT kind, base, mask, globals, barrier, name FROM inst"):
            out.setdefault(kind, []).append((int(base, 16), int(mask, 16), tuple(int(g) for g in globs.split(",") if g),
                                             bool(barrier), name))
        return out

    def lib(self, kind: str, base: int, mask: int) -> bytes | None:
        row = self.db.execute("SELECT lib FROM inst WHERE kind=? AND base=? AND mask=?",
                              (kind, f"{base:x}", f"{mask:x}")).fetchone()
        return bytes(row[0]) if row else None

    def put(self, kind: str, base: int, mask: int, globs: tuple, barrier: bool, name: str, lib: bytes) -> None:
        self.db.execute("INSERT OR IGNORE INTO inst VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (kind, f"{base:x}", f"{mask:x}", ",".join(map(str, globs)), int(barrier), name, lib))
