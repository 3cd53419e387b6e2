"""Where the embedded data lives: inside the wheel (codegen/_data/...) or, for a source
checkout or an editable install, at the repository's top level."""

from __future__ import annotations

import contextlib
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


def shared_file(rel: Path, env: str, starts: list[Path] | None = None) -> Path | None:
    """A file of the project's shared folder (test and CI input kept beside a checkout, e.g.
    `shared/upstream/...`): the file `$env` names, else `rel` in the nearest ancestor of each of
    `starts` (default: the current folder, then this install) that holds it; None without one."""
    named = os.environ.get(env)
    if named:
        return Path(named) if Path(named).is_file() else None
    for start in starts if starts is not None else [Path.cwd(), _PKG]:
        for parent in [start.resolve(), *start.resolve().parents]:
            if (parent / rel).is_file():
                return parent / rel
    return None


DEFAULT_SPEC = "mi100"   # the embedded spec every command takes without --spec (`spec show` prints it)


def default_spec_path() -> Path:
    return data_dir("rules") / f"{DEFAULT_SPEC}.yaml"


def card_specs() -> list[Path]:
    """The spec of each card family mi100-codegen ships: every `*.yaml` at the top of the embedded
    `rules/` folder (examples and the schema live in folders below it). `torch status` serves a
    card from them (codegen.ship.detect), a release builds a bundle of each (codegen.ship.matrix)."""
    return sorted(p for p in data_dir("rules").glob("*.yaml") if p.is_file())


def embedded_specs() -> dict[str, Path]:
    """Every spec shipped in the embedded `rules/` folder by the name `spec show` takes: its path
    under `rules/` without `.yaml` ('mi100', 'examples/smoke')."""
    rules = data_dir("rules")
    specs = {p.relative_to(rules).with_suffix("").as_posix(): p for p in rules.rglob("*.yaml") if p.is_file()}
    return dict(sorted(specs.items()))


def embedded_spec(name: str) -> Path:
    """The shipped spec `name` (embedded_specs); anything else is one message naming them all."""
    specs = embedded_specs()
    if name not in specs:
        raise UserError(f"no embedded spec named {name!r}; the embedded specs: {', '.join(specs)}",
                        hint="for a spec file of yours, open it or pass it with --spec FILE")
    return specs[name]


def _embedded(resolved: Path) -> str | None:
    """How messages name a file of the install's data folders: its name there, and for a spec
    the command that prints it (the file itself may lie inside site-packages)."""
    for name in ("rules", "templates", "tuning"):
        try:
            rel = resolved.relative_to(data_dir(name).resolve()).as_posix()
        except (ValueError, OSError, RuntimeError, UserError):
            continue
        if name == "rules" and rel.endswith(".yaml"):
            return f"{name}/{rel} (embedded: mi100-codegen spec show {rel[:-len('.yaml')]})"
        return f"{name}/{rel} (embedded in mi100-codegen)"
    return None


def display_path(path: Path) -> str:
    """A short, stable name for messages: relative to the CWD when below it (a checkout's own
    `rules/mi100.yaml`), else for an embedded file its name in the install with the way to see it
    (`rules/mi100.yaml (embedded: mi100-codegen spec show mi100)`: never a path inside
    site-packages, and never a bare `rules/…` the user cannot open from where they are), else the
    path as given."""
    path = Path(path)
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):  # a symbolic-link loop, a working directory that is gone
        return str(path)
    inside_package = _PKG in resolved.parents
    if not inside_package:
        with contextlib.suppress(ValueError, OSError):
            return str(resolved.relative_to(Path.cwd().resolve()))
    return _embedded(resolved) or str(path)
