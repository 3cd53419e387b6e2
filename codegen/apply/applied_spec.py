"""The spec a tree was applied from, kept with the tree's state: the one owner of "which spec do
the stages after `apply` use".

`apply` records, inside its transaction, a copy of the spec's bytes in `.mi100-codegen/spec.yaml`
and of the results it rendered with (`codegen.render.workspace.overlay_results`: the spec's own
`tuning/<arch>/` files, else those shipped for the arch) in `.mi100-codegen/tuning/<arch>/`; the
lock's `recorded` maps each to its sha256. The recorded spec's home is then `.mi100-codegen/`
(`codegen.render.workspace.spec_home`), so rendering it again reads exactly what apply read. `revert`
removes them with the lock, so a reverted tree stays byte-identical. The user may move, edit or
delete their own files: plan, precompile, bench, build and tune read the recorded copy
(`resolve_spec`).

A `--spec` given to one of them must mean the same spec (same sha256 of its meaning), or it is
refused with one message naming both. A tree applied by an older mi100-codegen (a lock without
`recorded`) is checked the same way against the lock's spec sha256.

The recorded files are input we did not just write ourselves: their paths must be the ones this
module writes (`recorded_paths`), each a regular file inside the tree (no symbolic link on the
way, `codegen.core.contain.inside`), bounded in size, holding the bytes the lock names; the spec is
parsed by the normal spec loader. Every refusal names the recorded file and says to re-apply."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from codegen.core.contain import inside
from codegen.core.errors import CodegenError, UserError
from codegen.core.fsutil import read_input, sha256
from codegen.render.workspace import RENDER_INPUTS, overlay_results
from codegen.apply.journal import STATE_DIR
from codegen.apply.lock import LOCK_NAME, ApplyLock, read_lock

if TYPE_CHECKING:
    from codegen.formats.spec import LoadedSpec

SPEC_COPY = f"{STATE_DIR}/spec.yaml"
RESULTS_LIMIT = 16 << 20  # bytes per recorded result file (the largest shipped one is ~250 KB)


def _results_rel(arch: str, name: str) -> str:
    return f"{STATE_DIR}/tuning/{arch}/{name}"


def recorded_files(loaded: "LoadedSpec") -> dict[str, bytes]:
    """Tree-relative path -> bytes of what apply records for `loaded`: the spec's file as read now
    (bounded like any spec) and every result render reads for it."""
    # CLI start-up: revert imports this module; the spec loader loads when used
    from codegen.formats.spec import MAX_SPEC_BYTES

    out = {SPEC_COPY: read_input(loaded.path, what="spec", limit=MAX_SPEC_BYTES)}
    for name, path in overlay_results(loaded).items():
        out[_results_rel(loaded.spec.arch, name)] = read_input(path, what="tuning result", limit=RESULTS_LIMIT)
    return out


def recorded_paths(tree: Path, lock: ApplyLock) -> list[str]:
    """The lock's recorded paths, each one this module writes; anything else is refused (a lock
    naming another file must not make revert delete it)."""
    allowed = {SPEC_COPY} | {_results_rel(lock.arch, n) for n in RENDER_INPUTS}
    foreign = sorted(set(lock.recorded) - allowed)
    if foreign:
        raise UserError(f"{tree}/{LOCK_NAME}: records {foreign[0]!r}, which is not a file apply records",
                        hint="restore the lock from a backup, or start again from a pristine tree")
    return sorted(lock.recorded)


def _hint(tree: Path) -> str:
    return (f"re-apply to record it again: mi100-codegen apply {tree} --spec SPEC "
            f"(or revert the tree: mi100-codegen revert {tree})")


def _check_recorded(tree: Path, lock: ApplyLock) -> None:
    # CLI start-up: revert imports this module; the spec loader loads when used
    from codegen.formats.spec import MAX_SPEC_BYTES

    for rel in recorded_paths(tree, lock):
        limit = MAX_SPEC_BYTES if rel == SPEC_COPY else RESULTS_LIMIT
        try:
            data = read_input(inside(tree, rel), what="recorded file", limit=limit)
        except UserError as exc:
            raise UserError(f"{tree}/{rel}: what apply recorded cannot be read ({exc})", hint=_hint(tree)) from None
        if sha256(data) != lock.recorded[rel]:
            raise UserError(f"{tree}/{rel}: what apply recorded was changed since (its sha256 is not the one "
                            f"{LOCK_NAME} records)", hint=_hint(tree))


def load_recorded(tree: Path, lock: ApplyLock) -> "LoadedSpec | None":
    """The spec recorded at apply time, None for a lock written before specs were recorded.
    Refuses (UserError naming the file) recorded files that are missing, not regular files, too
    large or not the bytes the lock names, and a recorded spec that is not valid."""
    # CLI start-up: revert imports this module; the spec loader loads when used
    from codegen.formats.spec import load_spec

    if SPEC_COPY not in lock.recorded:
        return None
    _check_recorded(tree, lock)
    path = tree / SPEC_COPY
    try:
        loaded = load_spec(path)
    except CodegenError as exc:
        raise UserError(f"{path}: the spec apply recorded is not a valid spec:\n{exc}", hint=_hint(tree)) from None
    if loaded.sha256 != lock.spec_sha256:
        raise UserError(f"{path}: the spec apply recorded does not mean the spec {LOCK_NAME} names "
                        f"(sha256 {loaded.sha256[:12]}…, not {lock.spec_sha256[:12]}…)", hint=_hint(tree))
    return replace(loaded, display=f"{loaded.display} (the spec applied to this tree)")


def resolve_spec(tree: Path | str | None = None, explicit: Path | None = None) -> "LoadedSpec":
    """The spec a command works with: the one rule, for every command.

    - With `tree` (the commands that read an applied tree: plan, precompile, bench, build, bundle
      build, tune): the spec apply recorded in it; an `explicit` spec that means another one is
      refused, naming both. A tree without a lock is taken as no tree (the stage's own check
      then says it is not applied).
    - Without a tree (render, spec check, validate, report, torch, tune import, and apply, which
      records the spec it is given): `explicit`, else the embedded rules/mi100.yaml.

    Whenever the embedded default is taken while the current folder holds a different
    `rules/<same name>` (an installed tool run in an edited checkout), the spec's warnings end
    with the note that says which one runs."""
    # CLI start-up: revert imports this module; the spec loader loads when used
    from codegen.formats.spec import load_spec

    lock = read_lock(Path(tree)) if tree is not None and Path(tree).is_dir() else None
    recorded = load_recorded(Path(tree), lock) if lock is not None else None
    if recorded is not None and explicit is None:
        return recorded
    given = load_spec(explicit)
    note = _default_note(given) if explicit is None else None
    if note:
        given = replace(given, warnings=[*given.warnings, note])
    if lock is None or given.sha256 == lock.spec_sha256:
        return given
    applied = recorded.display if recorded is not None else f"spec {lock.spec_name!r}"
    what = "--spec " + given.display if explicit is not None else f"the embedded default {given.display}"
    raise UserError(
        f"{tree}: {what} (sha256 {given.sha256[:12]}…) is not the spec this tree was applied from: "
        f"{applied} (sha256 {lock.spec_sha256[:12]}…)",
        hint=("leave out --spec to use the applied one, or re-apply: "
              if recorded is not None else "pass the spec it was applied from, or re-apply: ")
        + f"mi100-codegen apply {tree} --spec {given.display if explicit is not None else 'SPEC'}")


def _default_note(loaded: "LoadedSpec") -> str | None:
    """The note for the embedded default taken while the current folder holds a different
    `rules/<same name>`."""
    local = Path("rules") / Path(loaded.path).name
    try:
        if local.resolve() == Path(loaded.path).resolve() or not local.is_file():
            return None
        if local.read_bytes() == Path(loaded.path).read_bytes():
            return None
    except OSError:
        return None
    return (f"note: {local} here differs from the spec embedded in this install ({loaded.display}), "
            f"which is what runs without --spec; pass --spec {local} to use yours")
