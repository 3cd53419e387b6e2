"""Put a tree's tuning database where its generator reads it, as the tree's own CMake does at
configure time (v3src/CMakeLists.txt): central releases untar the kernel tuning and op database
archives into the build dir; sharded releases untar every archive below the central one's folder
into `<build>/<build_db_dir>/<same relative dir>` and merge the shards with the tree's own
composer (`python -m v3python.database_compose`, `aotriton.database_compose` from 0.13b). The
archives are read by `codegen.formats.tuning_db`. Used by `plan` and by the tests that prove
applied rows work. Reads the tree; writes only below `build_dir`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from codegen.core import processes
from codegen.core.errors import UpstreamError, UserError
from codegen.formats.tuning_db import extract_archive
from codegen.upstream import Adapter
from codegen.upstream.releases import DB_ARCHIVE_SUFFIX, TUNING_DB_FILE

COMPOSE_TIMEOUT_S = 1800  # the composer reads a few MB of sqlite: seconds; a hang is killed


def last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no output)"


def python_hint(stderr: str, python: str) -> str | None:
    if "ModuleNotFoundError" in (stderr or ""):
        return (f"{python} lacks the generator's requirements (the tree's requirements.txt: pandas, pyyaml ...): "
                "plan, precompile and build hold them in their build venv: leave out --python")
    return None


def compose_database(adapter: Adapter, tree: Path, build_dir: Path, python: str,
                     env: dict[str, str] | None = None) -> Path:
    """Returns the directory holding the composed kernel tuning database (and the op database)."""
    tree, build_dir = Path(tree).resolve(), Path(build_dir).resolve()
    db_dir = build_dir / adapter.build_db_dir
    try:
        if adapter.tuning_db_layout == "central":
            for rel in (adapter.tuning_db, adapter.op_db):
                if rel:
                    extract_archive(tree / rel, db_dir)
            return db_dir
        base = (tree / adapter.tuning_db).parent  # CMake globs every shard below the central DB's folder
        for archive in sorted(base.rglob(f"*{DB_ARCHIVE_SUFFIX}")):
            extract_archive(archive, db_dir / archive.parent.relative_to(base))
    except (OSError, UserError) as exc:
        raise UpstreamError(f"{tree}: cannot extract the tuning database: {exc}") from None
    try:
        proc = processes.run(
            [python, "-m", adapter.db_compose_module,
             "--database_file", str(db_dir / TUNING_DB_FILE), "--decomposed", str(db_dir)],
            cwd=tree, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=COMPOSE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise UpstreamError(f"{tree}: {adapter.db_compose_module} did not finish within "
                            f"{COMPOSE_TIMEOUT_S // 60} min (killed)") from None
    if proc.returncode:
        raise UpstreamError(f"{tree}: {adapter.db_compose_module} failed (rc {proc.returncode}): "
                            + last_line(proc.stderr or proc.stdout), hint=python_hint(proc.stderr, python))
    return db_dir
