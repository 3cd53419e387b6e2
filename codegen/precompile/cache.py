"""Persistent compile cache: one JSON record (+ the code object) per kernel, keyed by the hash of
its Triton sources, signature, compile options, target and the Triton version."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from ..fsutil import atomic_write as _atomic_write
from ..resources import user_cache_dir

CACHE_FORMAT = 3  # 2: resources read from the metadata note, waves-per-eu bound; 3: dot-instruction counts


def default_cache_dir() -> Path:
    return user_cache_dir("precompile")


@lru_cache(maxsize=64)
def source_hash(source_dir: str) -> str:
    """sha256 over every .py file of the kernel's source folder (kernels import their siblings)."""
    h = hashlib.sha256()
    root = Path(source_dir)
    for p in sorted(root.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def cache_key(*, source_dir: str, kernel_name: str, signature: str, num_warps: int, num_stages: int,
              waves_per_eu: int, arch: str, warp_size: int, triton_version: str) -> str:
    ident = {
        "format": CACHE_FORMAT,
        "sources": source_hash(source_dir),
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
