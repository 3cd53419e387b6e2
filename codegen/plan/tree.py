"""What plan needs to know about an AOTriton tree: its release, whether the target GPUs are
registered (the overlay applied), and how its CMake composes the tuning database before it runs
the generator. Everything here reads the tree; nothing writes to it.

Which release a tree is, and where its databases live, comes from `codegen.upstream.detect`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UpstreamError, UserError
from ..upstream import Adapter, detect


@dataclass(frozen=True)
class TreeInfo:
    root: Path
    adapter: Adapter

    @property
    def release(self) -> str:
        return self.adapter.release

    @property
    def package(self) -> str:
        return self.adapter.generator_module.split(".")[0]

    @property
    def gpu_targets(self) -> Path:
        return self.root / self.package / "gpu_targets.py"

    @property
    def compiler(self) -> Path:
        return self.root / self.package / "compile.py"


def release_of(tree: Path) -> TreeInfo:
    """Identify the release of an AOTriton tree (codegen.upstream.detect), refusing others."""
    return TreeInfo(root=Path(tree), adapter=detect(tree))


def _literal_strings(path: Path, name: str) -> list[str] | None:
    """String items of the top-level tuple/list/dict literal assigned to `name` (None if absent)."""
    try:
        module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError):
        return None
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return None


def check_registered(info: TreeInfo, gpus: list[str], arch: str) -> None:
    """Refuse a tree whose tables do not know the target (the overlay is not applied)."""
    supported = _literal_strings(info.gpu_targets, "AOTRITON_SUPPORTED_GPUS")
    if supported is None:
        raise UpstreamError(f"{info.gpu_targets}: no AOTRITON_SUPPORTED_GPUS table found")
    missing = [g for g in gpus if g not in supported]
    if missing:
        raise UserError(
            f"{info.root}: AOTriton {info.release} does not know {', '.join(missing)}: "
            "the mi100-codegen overlay is not applied to this tree",
            hint=f"run: mi100-codegen apply {info.root}",
        )
    packs = _literal_strings(info.gpu_targets, "AOTRITON_ARCH_TO_PACK") or []
    if arch not in packs:
        raise UserError(
            f"{info.root}: {arch} is in AOTRITON_SUPPORTED_GPUS but not in AOTRITON_ARCH_TO_PACK "
            "(partially applied overlay)",
            hint=f"run: mi100-codegen apply {info.root}",
        )


def generator_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment CMake gives the generator, plus determinism and a hands-off tree:
    PYTHONHASHSEED=0 (0.11b orders #includes by set iteration) and no __pycache__ writes."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update({
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "AOTRITON_ENABLE_FP32": env.get("AOTRITON_ENABLE_FP32", "1"),  # CMake default ON
    })
    env.update(extra or {})
    return env


def _extract(archive: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python without extraction filters
            tar.extractall(dest)


def compose_database(info: TreeInfo, build_dir: Path, python: str, env: dict[str, str]) -> None:
    """Put the tuning (and op) database where the generator reads it, as v3src/CMakeLists.txt
    does at configure time for this release."""
    ad = info.adapter
    try:
        if ad.tuning_db_layout == "central":  # 0.10b, 0.11b: archives extracted into the build dir
            for rel in (ad.tuning_db, ad.op_db):
                if rel:
                    _extract(info.root / rel, build_dir / ad.build_db_dir)
            return
        # sharded (0.11.1b+): CMake globs every *.sqlite3.tar.xz below the central DB's folder,
        # extracts each into <build>/database/<same relative folder>, then composes them.
        base = (info.root / ad.tuning_db).parent
        for archive in sorted(base.rglob("*.sqlite3.tar.xz")):
            _extract(archive, build_dir / ad.build_db_dir / archive.parent.relative_to(base))
    except (OSError, tarfile.TarError) as exc:
        raise UpstreamError(f"{info.root}: cannot extract the tuning database: {exc}") from None
    db_dir = build_dir / ad.build_db_dir
    proc = subprocess.run(
        [python, "-m", ad.db_compose_module,
         "--database_file", str(db_dir / "tuning_database.sqlite3"), "--decomposed", str(db_dir)],
        cwd=info.root, env=env, capture_output=True, text=True,
    )
    if proc.returncode:
        raise UpstreamError(
            f"{info.root}: {ad.db_compose_module} failed (rc {proc.returncode}): "
            + _last_line(proc.stderr or proc.stdout),
            hint=_python_hint(proc.stderr, python),
        )


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(no output)"


def _python_hint(stderr: str, python: str) -> str | None:
    if "ModuleNotFoundError" in (stderr or ""):
        return (f"{python} lacks the generator's requirements: install the tree's requirements.txt "
                "into it (e.g. pip install pandas pyyaml) or pass --python")
    return None
