"""The tuning grid and its candidate configs (pure: no I/O, no GPU).

Upstream's tuning database holds one row per GPU and functional key (codegen.models.functional's
`Functional`: dtype, head dim, causal, dropout, bias and the (seqlen_q, seqlen_k) bins), for each
kernel family (`attn_fwd`, `bwd_kernel_dk_dv`, `bwd_kernel_dq`, `bwd_kernel_fuse`). A grid
entry is one such key of one family and arch; `tune` measures every candidate config of the spec's space for it and
records the fastest one whose numerics pass. Listing (`--dry-run`) and running share
`plan_tuning`, so they cannot drift.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from codegen.formats.tuning_db import SEQLEN_BINS
from codegen.models import FAMILIES, KernelConfig, TargetSpec, expand_family
from codegen.models.functional import Functional


@dataclass(frozen=True, order=True)
class _Kernel:
    family: str
    arch: str


@dataclass(frozen=True, order=True)
class GridEntry(Functional, _Kernel):
    """One row of upstream's tuning database for one kernel family: its functional key, after the
    family and arch (fields and order: family, arch, dtype, head_dim, causal, dropout, bias,
    seqlen_q, seqlen_k)."""

    @property
    def name(self) -> str:
        return (
            f"{self.family}.{self.arch}.{self.dtype}.d{self.head_dim}."
            f"causal{int(self.causal)}.drop{int(self.dropout)}.bias{int(self.bias)}."
            f"sq{self.seqlen_q}.sk{self.seqlen_k}"
        )

    def to_json(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class GridFilter:
    """Restrictions of the grid; None keeps the spec's choice."""

    families: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    head_dims: tuple[int, ...] = ()
    seqlens: tuple[int, ...] = ()  # restrict seqlen_q and seqlen_k to these bins
    square_only: bool = False
    causal: bool | None = None
    dropout: bool | None = None
    bias: bool | None = None


@dataclass
class TuningPlan:
    entries: list[GridEntry]
    candidates: dict[tuple[str, str, int], list[KernelConfig]]  # (family, dtype, hd) -> configs

    def configs_for(self, entry: GridEntry) -> list[KernelConfig]:
        return self.candidates[(entry.family, entry.dtype, entry.head_dim)]

    @property
    def total_measurements(self) -> int:
        return sum(len(self.configs_for(e)) for e in self.entries)

    def to_json(self) -> dict:
        return {
            "entries": [
                {**e.to_json(), "candidates": [c.name for c in self.configs_for(e)]}
                for e in self.entries
            ],
            "counts": {"entries": len(self.entries), "measurements": self.total_measurements},
        }


def _check_subset(kind: str, kinds: str, wanted: tuple, allowed: tuple) -> list[str]:
    bad = [w for w in wanted if w not in allowed]
    if bad:
        return [f"{kind} {', '.join(map(str, bad))} not in the spec's {kinds} "
                f"({', '.join(map(str, allowed))})"]
    return []


def validate_filter(spec: TargetSpec, flt: GridFilter) -> list[str]:
    """Errors for filter values outside the spec (empty list: fine)."""
    errs: list[str] = []
    errs += _check_subset("family", "families", flt.families, FAMILIES)
    errs += _check_subset("dtype", "dtypes", flt.dtypes, tuple(spec.dtypes))
    errs += _check_subset("head dim", "head dims", flt.head_dims, tuple(spec.head_dims))
    errs += _check_subset("seqlen", "seqlens", flt.seqlens, SEQLEN_BINS)
    for feat in ("causal", "dropout", "bias"):
        if getattr(flt, feat) and not getattr(spec.features, feat):
            errs.append(f"--{feat} asked for, but the spec's features leave {feat} out")
    return errs


def build_grid(spec: TargetSpec, flt: GridFilter = GridFilter()) -> list[GridEntry]:
    """Every database row the spec needs, restricted by `flt`, sorted."""
    families = flt.families or FAMILIES
    dtypes = flt.dtypes or tuple(spec.dtypes)
    head_dims = flt.head_dims or tuple(spec.head_dims)
    seqlens = tuple(sorted(flt.seqlens)) if flt.seqlens else SEQLEN_BINS

    def axis(feat: str) -> tuple[bool, ...]:
        want = getattr(flt, feat)
        if want is not None:
            return (want,)
        return (False, True) if getattr(spec.features, feat) else (False,)

    out = []
    for fam, dt, hd, causal, drop, bias, sq, sk in itertools.product(
        families, dtypes, head_dims, axis("causal"), axis("dropout"), axis("bias"), seqlens, seqlens
    ):
        if causal and bias:  # upstream has no causal+bias rows
            continue
        if flt.square_only and sq != sk:
            continue
        out.append(GridEntry(fam, spec.arch, dt, hd, causal, drop, bias, sq, sk))
    return sorted(out)


def plan_tuning(spec: TargetSpec, flt: GridFilter = GridFilter()) -> TuningPlan:
    """The grid entries and each one's candidate configs (every entry is measurable: dropout
    entries against the kernels' own dropout mask, bias entries with the bias gradient)."""
    entries = build_grid(spec, flt)
    candidates: dict[tuple[str, str, int], list[KernelConfig]] = {}
    for e in entries:
        key = (e.family, e.dtype, e.head_dim)
        if key not in candidates:
            candidates[key] = expand_family(spec, e.family, e.dtype, e.head_dim)
    return TuningPlan(entries, candidates)


def effective_key(cfg: KernelConfig, backend: str) -> tuple:
    """The part of a config the backend's compiler sees. On NVIDIA `waves_per_eu` is an AMD-only
    launch option that is dropped, so configs differing only there are one kernel."""
    key = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.pre_load_v)
    if backend == "hip":
        key = key + (cfg.waves_per_eu,)
    return key


def group_effective(configs: list[KernelConfig], backend: str) -> list[list[KernelConfig]]:
    """Configs grouped by effective kernel, each group sorted (the first is the representative:
    the lowest waves_per_eu, the spill-safe choice on gfx908)."""
    groups: dict[tuple, list[KernelConfig]] = {}
    for c in sorted(configs, key=lambda c: (c.waves_per_eu, c.name)):
        groups.setdefault(effective_key(c, backend), []).append(c)
    return [groups[k] for k in sorted(groups, key=lambda k: tuple(str(x) for x in k))]


# Upstream's untuned kernels (no database rows): 16x16 tiles, waves 2, warps 4, stages 1.
def aot_default_config(spec: TargetSpec, family: str, dtype: str, head_dim: int) -> KernelConfig:
    return KernelConfig(family, spec.arch, dtype, head_dim, 16, 16, 2, 4, 1,
                        False if family == "attn_fwd" else None)
