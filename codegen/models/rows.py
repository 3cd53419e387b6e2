"""What tuning-database rows a target gets, and why (pure data: no I/O).

`RowsPlan` is built once, by render, from the spec and from inputs the stage that reads disk
loaded (measured winners, the compile report's limits table). Apply turns it into rows with
small pure functions (`codegen.apply.dbrows`); `to_json()` is what `rows/<arch>.json` holds and
`RowsPlan.from_json` reads it back.
"""

from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, create_model, field_validator

from codegen.models.functional import Functional, row_fields
from codegen.models.match import rule_matches
from codegen.models.target import SplitBackward, TargetSpec, TileReplacement, WavesCap

TRUE_SPELLINGS = ("1", "true", "yes")


def _empty_to_none(v: Any) -> Any:
    return None if v is None or (isinstance(v, str) and v.strip() == "") else v


class Winner(create_model("KeyedRow", __config__=ConfigDict(frozen=True, extra="ignore"), gpu=(str, ...),
                          family=(str, ...), **row_fields())):
    """One measured winner (a row of tuning/<arch>/winners.csv, as `mi100-codegen tune` wrote
    it): the config measured fastest for one tuning-grid entry (its GPU, family and functional
    key: codegen.models.functional). Optional axes are None when the CSV cell is empty (e.g.
    pre_load_v of a backward kernel)."""

    block_m: int | None = None
    block_n: int | None = None
    waves_per_eu: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    pre_load_v: bool | None = None
    config: str = ""
    time_ms: float | None = None
    device: str = ""
    proxy: str = ""

    @field_validator("block_m", "block_n", "waves_per_eu", "num_warps", "num_stages", "time_ms", mode="before")
    @classmethod
    def _optional(cls, v: Any) -> Any:
        return _empty_to_none(v)

    @field_validator("pre_load_v", mode="before")
    @classmethod
    def _flag(cls, v: Any) -> Any:
        v = _empty_to_none(v)
        return None if v is None else str(v).strip().lower() in TRUE_SPELLINGS

    @field_validator("config", "device", "proxy", mode="before")
    @classmethod
    def _text(cls, v: Any) -> str:
        return "" if v is None else str(v)

    @property
    def functional(self) -> Functional:
        return Functional.of(self)

    def to_json(self) -> dict:
        """The CSV's spelling: empty cells as '', booleans as 0/1."""
        return {k: "" if v is None else int(v) if isinstance(v, bool) else v for k, v in self.model_dump().items()}


@dataclass(frozen=True)
class RowTile:
    """What the rules of `rows` look at in a seeded row (the rule matcher's view of it)."""

    family: str
    dtype: str
    head_dim: int
    block_m: int | None
    block_n: int | None


def splits_backward(rules, dtype: str, head_dim: int | None) -> bool:
    """Whether a `rows.split_backward` rule sends this backward pass (dtype, head dim) to the split
    backend, so that the fused kernel's configs for it are never dispatched (op database releases)."""
    return any(rule_matches(r, RowTile("bwd_kernel_fuse", dtype, head_dim, None, None)) for r in rules)


@dataclass(frozen=True)
class RowsPlan:
    arch: str                # the target (spec.arch); every GPU of `gpus` is one of its
    gpus: tuple[str, ...]
    donor_gpu: str
    head_dims: tuple[int, ...]
    dtypes: tuple[str, ...]  # sorted
    waves_per_eu_caps: tuple[WavesCap, ...] = ()
    default_max_waves_per_eu: int | None = None
    tile_replacements: tuple[TileReplacement, ...] = ()
    waves_per_eu_limits: dict | None = None  # codegen.models.limits.waves_per_eu_limits (a JSON table)
    measured: tuple[Winner, ...] = field(default_factory=tuple)
    min_num_warps: dict[str, int] = field(default_factory=dict)  # family -> floor (spec rows.min_num_warps)
    split_backward: tuple[SplitBackward, ...] = ()

    @classmethod
    def build(cls, spec: TargetSpec, measured: list[Winner], limits: dict | None) -> "RowsPlan":
        r = spec.rows
        return cls(spec.arch, tuple(spec.gpus), r.donor_gpu, tuple(spec.head_dims), tuple(sorted(spec.dtypes)),
                   tuple(r.waves_per_eu_caps), r.default_max_waves_per_eu, tuple(r.tile_replacements),
                   limits, tuple(measured), r.min_num_warps.as_dict(), tuple(r.split_backward))

    def to_json(self) -> dict:
        """What rows/<arch>.json holds (the arch is its file name); `min_num_warps` only when
        the spec sets one (rows files of specs without it stay as they were)."""
        out = {
            "gpus": list(self.gpus),
            "donor_gpu": self.donor_gpu,
            "head_dims": list(self.head_dims),
            "dtypes": list(self.dtypes),
            "waves_per_eu_caps": [c.model_dump(mode="json") for c in self.waves_per_eu_caps],
            "default_max_waves_per_eu": self.default_max_waves_per_eu,
            "tile_replacements": [t.model_dump(mode="json") for t in self.tile_replacements],
            "waves_per_eu_limits": self.waves_per_eu_limits,
            "measured": [m.to_json() for m in self.measured],
        }
        if self.min_num_warps:
            out["min_num_warps"] = dict(sorted(self.min_num_warps.items()))
        if self.split_backward:
            out["split_backward"] = [r.model_dump(mode="json") for r in self.split_backward]
        return out

    @classmethod
    def from_json(cls, d: dict, arch: str) -> "RowsPlan":
        return cls(
            arch, tuple(d["gpus"]), d["donor_gpu"], tuple(d["head_dims"]), tuple(sorted(d["dtypes"])),
            tuple(WavesCap(**c) for c in d.get("waves_per_eu_caps", [])), d.get("default_max_waves_per_eu"),
            tuple(TileReplacement(**t) for t in d.get("tile_replacements", [])), d.get("waves_per_eu_limits"),
            tuple(Winner(**m) for m in d.get("measured", [])), dict(d.get("min_num_warps", {})),
            tuple(SplitBackward(**r) for r in d.get("split_backward", [])),
        )

    # -- the rules, each a small pure function around the one matcher --

    def replacement_for(self, tile: RowTile) -> TileReplacement | None:
        """The first tile replacement whose rule matches (family is required on those)."""
        return next((t for t in self.tile_replacements if rule_matches(t, tile)), None)

    def splits_backward(self, dtype: str, head_dim: int) -> bool:
        """Whether the spec routes this backward pass to the split backend (rows.split_backward)."""
        return splits_backward(self.split_backward, dtype, head_dim)

    def cap_for(self, tile: RowTile) -> int | None:
        """The smallest matching waves_per_eu cap, then the default cap."""
        caps = [c.max_waves_per_eu for c in self.waves_per_eu_caps if rule_matches(c, tile)]
        cap = min(caps) if caps else None
        default = self.default_max_waves_per_eu
        if default is not None:
            cap = default if cap is None else min(cap, default)
        return cap

    def num_warps_for(self, family: str, num_warps: int, replacement: TileReplacement | None = None) -> int:
        """A seeded row's num_warps raised to the family's floor (rows.min_num_warps), then to
        its tile replacement's num_warps."""
        floors = [f for f in (self.min_num_warps.get(family), replacement.min_num_warps if replacement else None)
                  if f is not None]
        return max([num_warps, *floors])

    def measured_for(self, family: str) -> list[Winner]:
        return [m for m in self.measured if m.family == family]


@dataclass(frozen=True)
class OverlayInputs:
    """What render needs besides the spec, already loaded by the caller: the measured winners
    (tuning/<arch>/winners.csv, filtered to the spec) and the compile report's limits table."""

    measured: tuple[Winner, ...] = ()
    waves_per_eu_limits: dict | None = None
