"""The one rule matcher: a rule (ExcludeRule, WavesCap, TileReplacement, ...) matches a config
when every axis the rule names (not None) equals the config's value on that axis."""

from __future__ import annotations

from typing import Any

# The axes a rule may name; a rule model has some of them as optional fields.
AXES = ("family", "dtype", "head_dim", "block_m", "block_n", "waves_per_eu", "num_warps", "num_stages",
        "pre_load_v")


def rule_matches(rule: Any, cfg: Any) -> bool:
    """`cfg` is anything with the axes as attributes (a KernelConfig, a RowTile); axes the rule
    does not have, or leaves None, match anything. `min_tile_area` (when the rule has it) matches
    tiles of at least that area."""
    for axis in AXES:
        want = getattr(rule, axis, None)
        if want is not None and want != getattr(cfg, axis, None):
            return False
    area = getattr(rule, "min_tile_area", None)
    if area is not None and cfg.block_m * cfg.block_n < area:
        return False
    return True


__all__ = ["AXES", "rule_matches"]
