"""Put a tree's tuning database where its generator reads it, as the tree's own CMake does at
configure time (v3src/CMakeLists.txt): central releases untar `v3python/rules/*.sqlite3.tar.xz`
into the build dir; sharded releases untar every `v3python/database/**.sqlite3.tar.xz` into
`<build>/database/<same relative dir>` and merge the shards with the tree's own
`python -m v3python.database_compose`. Used to prove applied rows work (tests, `plan`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import UpstreamError
from ..upstream import Adapter
from .dbrows import read_tarxz


def compose_database(adapter: Adapter, tree: Path, build_dir: Path, python: str) -> Path:
    """Returns the directory holding tuning_database.sqlite3 (and op_database.sqlite3)."""
    tree, build_dir = Path(tree).resolve(), Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    if adapter.tuning_db_layout == "central":
        for rel in [adapter.tuning_db] + ([adapter.op_db] if adapter.op_db else []):
            name, payload = read_tarxz((tree / rel).read_bytes(), rel)
            (build_dir / name).write_bytes(payload)
        return build_dir
    base = tree / "v3python" / "database"
    out = build_dir / adapter.build_db_dir
    for tarxz in sorted(base.rglob("*.sqlite3.tar.xz")):
        rel_dir = tarxz.parent.relative_to(base)
        name, payload = read_tarxz(tarxz.read_bytes(), str(tarxz))
        (out / rel_dir).mkdir(parents=True, exist_ok=True)
        (out / rel_dir / name).write_bytes(payload)
    cmd = [python, "-m", adapter.db_compose_module, "--database_file", str(out / "tuning_database.sqlite3"),
           "--decomposed", str(out)]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UpstreamError(f"{adapter.db_compose_module} failed (exit {proc.returncode}): "
                            f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return out


__all__ = ["compose_database"]
