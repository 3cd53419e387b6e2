"""Expansion of a spec's tuning space into named kernel configs (pure, deterministic)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, replace

from codegen.models.match import rule_matches
from codegen.models.target import FAMILIES, FamilySpace, TargetSpec


# ASCII numbers without leading zeros: a name that matches is spelled the one way `name` prints it.
_NUM = r"(?:0|[1-9][0-9]*)"
_NAME_RE = re.compile(
    r"^(?P<family>[a-z][a-z0-9_]*)\.(?P<arch>gfx[0-9a-z]+)\.(?P<dtype>[a-z0-9]+)"
    rf"(?:\.d(?P<head_dim>{_NUM}))?(?:\.M(?P<block_m>{_NUM})(?:N(?P<block_n>{_NUM}))?)?"
    rf"\.wpe(?P<waves_per_eu>{_NUM})\.w(?P<num_warps>{_NUM})\.s(?P<num_stages>{_NUM})"
    r"(?:\.plv(?P<pre_load_v>[01]))?\Z"  # \Z: `$` would also accept a trailing newline
)


@dataclass(frozen=True, order=True)
class KernelConfig:
    """One kernel config; its procedural name encodes every axis and is its identity everywhere
    (logs, caches, compile reports, tuning rows, tests). `KernelConfig.parse` is the one parser
    of that name and `name` the one printer: `KernelConfig.parse(n).name == n`.

    The tunable families (FAMILIES) have every axis. Other kernels of upstream's compile list
    (e.g. bwd_preprocess) have only some: `head_dim`, `block_m`/`block_n` may be None, and their
    name omits them (`bwd_preprocess.gfx908.fp16.d64.M128.wpe2.w4.s1`)."""

    family: str
    arch: str
    dtype: str
    head_dim: int | None
    block_m: int | None
    block_n: int | None
    waves_per_eu: int
    num_warps: int
    num_stages: int
    pre_load_v: bool | None = None

    @classmethod
    def parse(cls, name: str) -> "KernelConfig":
        """The config a procedural name stands for; ValueError when `name` is not one."""
        m = _NAME_RE.match(name)
        if not m:
            raise ValueError(f"not a kernel config name: {name!r}")
        family, arch, dtype, hd, bm, bn, wpe, warps, stages, plv = m.groups()
        return cls(family, arch, dtype, None if hd is None else int(hd), None if bm is None else int(bm),
                   None if bn is None else int(bn), int(wpe), int(warps), int(stages),
                   None if plv is None else plv == "1")

    @classmethod
    def try_parse(cls, name: str) -> "KernelConfig | None":
        try:
            return cls.parse(name)
        except ValueError:
            return None

    @property
    def tunable(self) -> bool:
        """A family of the spec's tuning space (and of the tuning database), all axes known."""
        return (self.family in FAMILIES and self.head_dim is not None and self.block_m is not None
                and self.block_n is not None)

    @property
    def tile(self) -> str:
        if self.block_m is None:
            return ""
        return f"M{self.block_m}" + (f"N{self.block_n}" if self.block_n is not None else "")

    def _parts(self, waves: bool) -> list[str]:
        parts = [self.family, self.arch, self.dtype]
        if self.head_dim is not None:
            parts.append(f"d{self.head_dim}")
        if self.tile:
            parts.append(self.tile)
        if waves:
            parts.append(f"wpe{self.waves_per_eu}")
        parts += [f"w{self.num_warps}", f"s{self.num_stages}"]
        if self.pre_load_v is not None:
            parts.append(f"plv{int(self.pre_load_v)}")
        return parts

    @property
    def name(self) -> str:
        return ".".join(self._parts(waves=True))

    def __str__(self) -> str:
        return self.name

    @property
    def limit_key(self) -> str:
        """The name without waves_per_eu: the variants of one config that differ only in the
        occupancy hint share it (compile-report limits, waves_per_eu caps)."""
        return ".".join(self._parts(waves=False))

    @property
    def config_key(self) -> str:
        """The config without family/arch/dtype/head dim: the part a tuning row stores."""
        return ".".join(self._parts(waves=True)[4 if self.head_dim is not None else 3:])

    def with_waves(self, waves_per_eu: int) -> "KernelConfig":
        """The same config with another waves_per_eu (the one axis stages vary)."""
        return replace(self, waves_per_eu=waves_per_eu)

    def vary(self, **axes) -> "KernelConfig":
        """The same config with other values on the named axes."""
        return replace(self, **axes)


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


def outside_space(spec: TargetSpec, cfg: KernelConfig) -> list[str]:
    """The parts of a tunable config's name the spec's tuning space does not hold (its dtype, head
    dim, tile, `wpe…`, `w…`, `s…`, `plv…`), or ['excluded'] when only an exclude rule removes it;
    [] for a config of the space (`expand_family` lists exactly those)."""
    space = spec.family_space(cfg.family)
    plv = list(space.pre_load_v) if space.pre_load_v is not None else [None]
    out = [part for part, inside in (
        (cfg.dtype, cfg.dtype in spec.dtypes),
        (f"d{cfg.head_dim}", cfg.head_dim in spec.head_dims),
        (cfg.tile, (cfg.block_m, cfg.block_n) in [tuple(t) for t in space.block_sizes]),
        (f"wpe{cfg.waves_per_eu}", cfg.waves_per_eu in space.waves_per_eu),
        (f"w{cfg.num_warps}", cfg.num_warps in space.num_warps),
        (f"s{cfg.num_stages}", cfg.num_stages in space.num_stages),
        ("plv" if cfg.pre_load_v is None else f"plv{int(cfg.pre_load_v)}", cfg.pre_load_v in plv),
    ) if not inside]
    return out or (["excluded"] if any(rule_matches(r, cfg) for r in space.exclude) else [])


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
