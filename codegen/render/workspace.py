"""Where a user's own work lives: their spec and the measured tuning results that belong to it
(docs/workspace.md). One rule, the same for an install from PyPI, a wheel or an editable checkout:

- A spec's **home**: for a spec of yours (any file you pass with `--spec`), the folder that holds
  it, or the folder above when that one is named `rules` (the repository's shape: `rules/my.yaml`
  beside `tuning/`). For a spec shipped with mi100-codegen (the embedded default and every
  `rules/*.yaml` of the install, used by name or by path), your workspace: `$MI100_CODEGEN_HOME`,
  else `$XDG_DATA_HOME/mi100-codegen`, else `~/.local/share/mi100-codegen` (the install's own
  folder is never written). For the copy `apply` recorded in a tree, the tree's state folder
  (`codegen.apply.applied_spec`).
- Its **results** live in `<home>/tuning/<arch>/`: `winners.csv` and `measurements.csv` (written by
  `tune` and `tune import`), `compile_report.json` (written by `precompile --tuning-report` where
  you point it).
- **Readers** (render, apply, build, bundle build: everything that renders an overlay) take each
  file render uses (`RENDER_INPUTS`) from the spec's results folder when it is there, else the
  one mi100-codegen ships for the arch (`shipped_dir`), else none: `overlay_results(loaded)`.
- **Writers** (`tune`, `tune import`) write to the spec's results folder (`writable_results_dir`);
  for a tree's recorded copy that is your workspace when the copy is a shipped spec, and otherwise
  a refusal naming the fix (pass your spec, or `--out`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from codegen.core.errors import UserError
from codegen.core.resources import data_dir

if TYPE_CHECKING:
    from codegen.formats.spec import LoadedSpec

WINNERS = "winners.csv"
COMPILE_REPORT = "compile_report.json"
RENDER_INPUTS = (COMPILE_REPORT, WINNERS)  # the results render reads (sorted)
STATE_MARK = ".mi100-codegen"  # a tree's state folder (codegen.apply.journal.STATE_DIR)
ENV_HOME = "MI100_CODEGEN_HOME"


def user_home() -> Path:
    """Your workspace: the home of the specs shipped with mi100-codegen."""
    if os.environ.get(ENV_HOME):
        return Path(os.environ[ENV_HOME])
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mi100-codegen"


def _shipped_rules() -> Path | None:
    try:
        return data_dir("rules").resolve()
    except UserError:
        return None


def is_shipped(spec_path: Path) -> bool:
    """A spec file shipped with this mi100-codegen (under its rules/ data folder)."""
    rules = _shipped_rules()
    if rules is None:
        return False
    try:
        Path(spec_path).resolve().relative_to(rules)
        return True
    except ValueError:
        return False


def _recorded(spec_path: Path) -> bool:
    return STATE_MARK in Path(spec_path).resolve().parent.parts[-1:]


def spec_home(spec_path: Path) -> Path:
    """The folder a spec's results belong to (see the module doc)."""
    if is_shipped(spec_path):
        return user_home()
    folder = Path(spec_path).resolve().parent
    return folder.parent if folder.name == "rules" else folder


def results_dir(loaded: "LoadedSpec") -> Path:
    """`<home>/tuning/<arch>/` of the spec (it may not exist yet)."""
    return spec_home(loaded.path) / "tuning" / loaded.spec.arch


def shipped_dir(arch: str) -> Path | None:
    """The results mi100-codegen ships for `arch` (None when the install has no tuning data)."""
    try:
        return data_dir("tuning") / arch
    except UserError:
        return None


def result_file(loaded: "LoadedSpec", name: str) -> Path | None:
    """The file `name` render reads for this spec: its own, else the shipped one, else None."""
    own = results_dir(loaded) / name
    if own.is_file():
        return own
    shipped = shipped_dir(loaded.spec.arch)
    if shipped is not None and (shipped / name).is_file():
        return shipped / name
    return None


def overlay_results(loaded: "LoadedSpec") -> dict[str, Path]:
    """{file name: path} of every result render uses for this spec (see `result_file`); the one
    function render, apply, build and bundle build call."""
    out = {}
    for name in RENDER_INPUTS:
        path = result_file(loaded, name)
        if path is not None:
            out[name] = path
    return out


def _shipped_twin(spec_path: Path) -> bool:
    """A recorded copy that is byte for byte a shipped spec."""
    rules = _shipped_rules()
    if rules is None:
        return False
    data = Path(spec_path).read_bytes()
    return any(p.read_bytes() == data for p in sorted(rules.rglob("*.yaml")))


def writable_results_dir(loaded: "LoadedSpec", option: str = "--out") -> Path:
    """Where a writer puts this spec's results (see the module doc); a tree's recorded copy of a
    spec of yours is refused with the fix."""
    if _recorded(loaded.path):
        if _shipped_twin(loaded.path):
            return user_home() / "tuning" / loaded.spec.arch
        raise UserError(
            f"{loaded.display}: your results are not written into a tree's recorded state, and this "
            "spec is not one mi100-codegen ships",
            hint=f"pass the spec you applied from (--spec YOUR_SPEC: results go to tuning/{loaded.spec.arch}/ "
                 f"beside it), or {option} DIR (docs/workspace.md)")
    return results_dir(loaded)
