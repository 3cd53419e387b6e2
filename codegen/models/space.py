"""Expansion of a spec's tuning space into named kernel configs (pure, deterministic)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from .target import FAMILIES, ExcludeRule, FamilySpace, TargetSpec


@dataclass(frozen=True, order=True)
class KernelConfig:
    """One candidate config; `name` encodes every axis and is its identity everywhere."""

    family: str
    arch: str
    dtype: str
    head_dim: int
    block_m: int
    block_n: int
    waves_per_eu: int
    num_warps: int
    num_stages: int
    pre_load_v: bool | None = None

    @property
    def tile(self) -> str:
        return f"M{self.block_m}N{self.block_n}"

    @property
    def name(self) -> str:
        parts = [
            self.family,
            self.arch,
            self.dtype,
            f"d{self.head_dim}",
            self.tile,
            f"wpe{self.waves_per_eu}",
            f"w{self.num_warps}",
            f"s{self.num_stages}",
        ]
        if self.pre_load_v is not None:
            parts.append(f"plv{int(self.pre_load_v)}")
        return ".".join(parts)

    @property
    def config_key(self) -> str:
        """The config without dtype/head dim: the part a tuning row stores."""
        key = f"{self.tile}.wpe{self.waves_per_eu}.w{self.num_warps}.s{self.num_stages}"
        if self.pre_load_v is not None:
            key += f".plv{int(self.pre_load_v)}"
        return key


def rule_matches(rule: ExcludeRule, cfg: KernelConfig) -> bool:
    checks = (
        (rule.block_m, cfg.block_m),
        (rule.block_n, cfg.block_n),
        (rule.waves_per_eu, cfg.waves_per_eu),
        (rule.num_warps, cfg.num_warps),
        (rule.num_stages, cfg.num_stages),
        (rule.pre_load_v, cfg.pre_load_v),
        (rule.dtype, cfg.dtype),
        (rule.head_dim, cfg.head_dim),
    )
    if any(want is not None and want != got for want, got in checks):
        return False
    if rule.min_tile_area is not None and cfg.block_m * cfg.block_n < rule.min_tile_area:
        return False
    return True


def expand_family(
    spec: TargetSpec, family: str, dtype: str, head_dim: int, space: FamilySpace | None = None
) -> list[KernelConfig]:
    """Configs of one family for one (dtype, head dim), sorted, exclusions applied."""
    space = space or spec.family_space(family)
    plv: list[bool | None] = list(space.pre_load_v) if space.pre_load_v is not None else [None]
    out = []
    for (m, n), wpe, warps, stages, pre in itertools.product(
        space.block_sizes, space.waves_per_eu, space.num_warps, space.num_stages, plv
    ):
        cfg = KernelConfig(family, spec.arch, dtype, head_dim, m, n, wpe, warps, stages, pre)
        if any(rule_matches(r, cfg) for r in space.exclude):
            continue
        out.append(cfg)
    return sorted(set(out))


def expand_space(spec: TargetSpec) -> dict[str, list[KernelConfig]]:
    """family -> configs over every dtype and head dim of the spec."""
    result: dict[str, list[KernelConfig]] = {}
    for family in FAMILIES:
        cfgs: list[KernelConfig] = []
        for dtype in spec.dtypes:
            for hd in sorted(spec.head_dims):
                cfgs.extend(expand_family(spec, family, dtype, hd))
        result[family] = cfgs
    return result
