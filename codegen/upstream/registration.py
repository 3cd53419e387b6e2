"""Is a target registered in a tree, and may a spec be applied to a tree at all?

`registration_gaps` is the one answer to "does this tree know the target?" (plan and build ask
it); `refuse_unsuitable_tree` is what apply checks before it computes anything: the spec must
list the tree's release, and the arch must be one the release does not ship already (the
record's `shipped_archs`)."""

from __future__ import annotations

import ast
from pathlib import Path

from codegen.core.errors import UserError
from codegen.models import TargetSpec
from codegen.upstream import Adapter
from codegen.upstream.layouts import layout_of

def refuse_unsuitable_tree(tree: Path, adapter: Adapter, spec: TargetSpec, spec_display: str) -> None:
    """UserError (exit 2) when the spec is not for this tree's release, or the release already
    supports the arch. Reads nothing."""
    if adapter.release not in spec.upstream.releases:
        raise UserError(
            f"{tree}: AOTriton {adapter.label}, but {spec_display} is for upstream.releases "
            f"{', '.join(spec.upstream.releases)}",
            hint=f"apply to a tree of one of those releases, or add {adapter.release} to upstream.releases "
                 f"once the spec was checked against it")
    if spec.arch in adapter.shipped_archs:
        raise UserError(
            f"{tree}: AOTriton {adapter.release} already supports {spec.arch} (it ships kernels and tuning "
            f"rows for it); mi100-codegen adds archs a release does not ship",
            hint="build the release as it is for this GPU")


def _literal_strings(path: Path, name: str) -> list[str] | None:
    """String items (dict keys) of the module-level literal assigned to `name` (None if absent)."""
    try:
        module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", [])
            return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return None


def registration_gaps(tree: Path, layout: str, gpus: list[str], arch: str | None = None) -> list[tuple[str, str]]:
    """What the tree's GPU tables lack for the target: [(table, name)], e.g.
    [("AOTRITON_SUPPORTED_GPUS", "gfx908_mod0")]; empty when the target is registered. `arch`
    None: check the GPUs only. Reads the tree."""
    table = Path(tree) / layout_of(layout).edit_paths.gpu_targets
    supported = _literal_strings(table, "AOTRITON_SUPPORTED_GPUS")
    if supported is None:
        return [("AOTRITON_SUPPORTED_GPUS", "(the table itself)")]
    gaps = [("AOTRITON_SUPPORTED_GPUS", g) for g in gpus if g not in supported]
    if arch is not None and arch not in (_literal_strings(table, "AOTRITON_ARCH_TO_PACK") or []):
        gaps.append(("AOTRITON_ARCH_TO_PACK", arch))
    return gaps
