"""Where the embedded data lives: inside the wheel (codegen/_data/...) or, for a source
checkout or an editable install, at the repository's top level."""

from __future__ import annotations

import os
from pathlib import Path

from codegen.core.errors import UserError

_PKG = Path(__file__).resolve().parent.parent  # codegen/ (this module is codegen/core/resources.py)
ENV_CACHE = "MI100_CODEGEN_CACHE"


def user_cache_dir(name: str) -> Path:
    """The user's cache folder `name` (e.g. `precompile`): under $MI100_CODEGEN_CACHE, else
    $XDG_CACHE_HOME/mi100-codegen, else ~/.cache/mi100-codegen. Never inside the repository;
    callers treat it as optional (missing or read-only: work without it)."""
    if os.environ.get(ENV_CACHE):
        return Path(os.environ[ENV_CACHE]) / name
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mi100-codegen" / name


def cache_origin() -> str:
    """The environment variable that places `user_cache_dir` (for messages about it)."""
    if os.environ.get(ENV_CACHE):
        return ENV_CACHE
    return "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "HOME"


def data_dir(name: str) -> Path:
    """`rules`, `templates` or `tuning`."""
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise UserError(f"mi100-codegen data folder '{name}' is missing from this install",
                    hint="reinstall mi100-codegen (pip install .)")


def default_spec_path() -> Path:
    return data_dir("rules") / "mi100.yaml"


def card_specs() -> list[Path]:
    """The spec of each card family mi100-codegen ships: every `*.yaml` at the top of the embedded
    `rules/` folder (examples and the schema live in folders below it). `torch status` serves a
    card from them (codegen.ship.detect), a release builds a bundle of each (codegen.ship.matrix)."""
    return sorted(p for p in data_dir("rules").glob("*.yaml") if p.is_file())


def display_path(path: Path) -> str:
    """A short, stable name for messages: relative to the CWD when below it, else the name
    under the data folder for embedded files, else the path as given."""
    path = Path(path)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symbolic-link loop, a working directory that is gone
        return str(path)
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        pass
    for name in ("rules", "templates", "tuning"):
        try:
            return f"{name}/{resolved.relative_to(data_dir(name).resolve())}"
        except (ValueError, OSError, RuntimeError):
            continue
    return str(path)
