"""The one rule matcher: a rule (ExcludeRule, WavesCap, TileReplacement, ...) matches a config
when every axis the rule names (not None) equals the config's value on that axis."""

from __future__ import annotations

from functools import cache
from typing import Any

# The axes a rule may name; a rule model has some of them as optional fields.
AXES = ("family", "dtype", "head_dim", "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages",
        "pre_load_v")


@cache
def _rule_axes(cls: type) -> tuple[tuple[str, ...], bool]:
    """(the AXES a rule class has, whether it has min_tile_area). A pydantic rule model lacks
    most axes, and pydantic answers a missing attribute through a slow __getattr__: asking the
    class once keeps matching cheap (it runs for every config of the space)."""
    fields = getattr(cls, "model_fields", None)
    if fields is None:  # not a pydantic model: look every axis up
        return AXES, True
    return tuple(a for a in AXES if a in fields), "min_tile_area" in fields


def rule_matches(rule: Any, cfg: Any) -> bool:
    """`cfg` is anything with the axes as attributes (a KernelConfig, a RowTile); axes the rule
    does not have, or leaves None, match anything. `min_tile_area` (when the rule has it) matches
    tiles of at least that area."""
    axes, has_area = _rule_axes(type(rule))
    for axis in axes:
        want = getattr(rule, axis, None)
        if want is not None and want != getattr(cfg, axis, None):
            return False
    area = getattr(rule, "min_tile_area", None) if has_area else None
    if area is not None and cfg.block_m * cfg.block_n < area:
        return False
    return True
