"""Pydantic models of a target spec (pure data: no I/O).

A spec describes one GPU target that upstream AOTriton ships no kernels for: its arch traits,
the hardware limits static analysis needs, what to build (head dims, dtypes, features), the
tuning space per kernel family, and where seeded tuning rows come from.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .dtypes import DTYPE_INFO

DType = Literal["fp16", "bf16", "fp32"]
Family = Literal["attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse"]
FAMILIES: tuple[str, ...] = ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse")
DTYPES: tuple[str, ...] = tuple(DTYPE_INFO)
DTYPE_BYTES = {k: d.bytes for k, d in DTYPE_INFO.items()}

ARCH_RE = re.compile(r"^gfx[0-9]{2,4}[a-z]?$")
GPU_RE = re.compile(r"^(gfx[0-9]{2,4}[a-z]?)_mod([0-9]+)$")


def gpu_arch(gpu: str) -> str:
    """'gfx90a_mod0' -> 'gfx90a' (the one parser of AOTriton's GPU names; ValueError otherwise)."""
    m = GPU_RE.match(gpu)
    if not m:
        raise ValueError(f"'{gpu}' is not a GPU name like 'gfx908_mod0'")
    return m.group(1)


def gpu_mod(gpu: str) -> int:
    """'gfx908_mod1' -> 1."""
    m = GPU_RE.match(gpu)
    if not m:
        raise ValueError(f"'{gpu}' is not a GPU name like 'gfx908_mod0'")
    return int(m.group(2))
RELEASE_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?b$")

PowerOfTwoTile = Annotated[int, Field(ge=16, le=256)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class Hardware(_Model):
    """Per-GPU limits used by static analysis (occupancy, LDS and register budgets)."""

    compute_units: int = Field(ge=1, le=1024, description="Compute units (CUs) of the GPU.")
    simds_per_cu: int = Field(4, ge=1, le=8, description="SIMDs per CU.")
    max_waves_per_simd: int = Field(ge=1, le=32, description="Hardware wave slots per SIMD.")
    lds_bytes_per_cu: int = Field(ge=1024, le=1 << 20, description="Local data share per CU (bytes).")
    vgprs_per_lane: int = Field(ge=32, le=1024, description="Architectural VGPRs per lane.")
    agprs_per_lane: int = Field(
        ge=0, le=1024, description="Accumulation VGPRs (AGPRs) per lane; 0 when the arch has none."
    )
    unified_register_file: bool = Field(
        description="True when VGPRs and AGPRs share one file (gfx90a+); False on gfx908."
    )
    vgpr_alloc_granule: int = Field(4, ge=1, le=16, description="VGPR allocation granule.")
    sgprs_per_wave: int = Field(ge=16, le=128, description="Addressable SGPRs per wave.")
    matrix_core_dtypes: list[DType] = Field(
        description="Dtypes with matrix-core (MFMA/WMMA) instructions; others run on plain ALUs."
    )

    @field_validator("matrix_core_dtypes")
    @classmethod
    def _unique_dtypes(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("duplicate dtype")
        return v


class Features(_Model):
    """Kernel features to build and tune for."""

    causal: bool = Field(True, description="Causal masking (CAUSAL_TYPE != 0).")
    dropout: bool = Field(True, description="Dropout (ENABLE_DROPOUT).")
    bias: bool = Field(True, description="Additive attention bias (BIAS_TYPE).")
    padded_head: bool = Field(
        True, description="Head dims that are not in the list, rounded up (PADDED_HEAD)."
    )


class ExcludeRule(_Model):
    """Removes every config of a family's space that matches *all* the given fields."""

    reason: str = Field(min_length=1, description="Why: shown in listings and the rendered module.")
    block_m: int | None = None
    block_n: int | None = None
    waves_per_eu: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    pre_load_v: bool | None = None
    dtype: DType | None = None
    head_dim: int | None = None
    min_tile_area: int | None = Field(None, ge=1, description="Matches when BLOCK_M*BLOCK_N >= this.")


class FamilySpace(_Model):
    """Candidate configs of one kernel family: the product of the axes minus the exclusions."""

    block_sizes: list[tuple[PowerOfTwoTile, PowerOfTwoTile]] = Field(
        min_length=1, description="(BLOCK_M, BLOCK_N) tiles. BLOCK_M >= BLOCK_N (M < N was faulty)."
    )
    waves_per_eu: list[Annotated[int, Field(ge=0, le=10)]] = Field(
        min_length=1, description="AMD occupancy hint; 0 = no hint."
    )
    num_warps: list[Literal[1, 2, 4, 8, 16]] = Field(min_length=1)
    num_stages: list[Annotated[int, Field(ge=1, le=4)]] = Field([1], min_length=1)
    pre_load_v: list[bool] | None = Field(
        None, description="attn_fwd only: load V before the softmax (PRE_LOAD_V)."
    )
    exclude: list[ExcludeRule] = Field(default_factory=list)


class TuningSpace(_Model):
    attn_fwd: FamilySpace
    bwd_kernel_dk_dv: FamilySpace
    bwd_kernel_dq: FamilySpace
    bwd_kernel_fuse: FamilySpace


class WavesCap(_Model):
    """Caps waves_per_eu of seeded rows whose tile matches (tiles that spill on the target)."""

    family: Family | None = None
    block_m: int
    block_n: int
    dtype: DType | None = None
    head_dim: int | None = None
    max_waves_per_eu: int = Field(ge=0, le=10)
    reason: str = Field(min_length=1)


class TileReplacement(_Model):
    """Seeded rows whose donor tile can't be made spill-free on the target get another tile."""

    family: Family
    block_m: int
    block_n: int
    dtype: DType | None = None
    head_dim: int | None = None
    to: tuple[PowerOfTwoTile, PowerOfTwoTile] = Field(description="[BLOCK_M, BLOCK_N] to use instead.")
    reason: str = Field(min_length=1)


class Rows(_Model):
    """Where the target's own tuning-database rows come from until measured rows exist."""

    donor_gpu: str = Field(description="Existing GPU whose tuned rows seed the target's rows.")
    waves_per_eu_caps: list[WavesCap] = Field(default_factory=list)
    default_max_waves_per_eu: int | None = Field(
        None, ge=0, le=10, description="Cap applied to every seeded row (after the specific caps)."
    )
    tile_replacements: list[TileReplacement] = Field(
        default_factory=list,
        description="Seeded rows with these tiles get another tile (before the waves_per_eu caps): "
        "for donor configs that spill on the target even at waves_per_eu=1.",
    )
    use_proxy_measurements: bool = Field(
        False,
        description="Let winners measured on a stand-in GPU (proxy column set, e.g. an NVIDIA "
        "GPU) replace seeded rows. Off by default: a proxy's fastest config says nothing about "
        "the target; measurements on the target itself are always used.",
    )

    @field_validator("donor_gpu")
    @classmethod
    def _gpu_name(cls, v: str) -> str:
        if not GPU_RE.match(v):
            raise ValueError(f"'{v}' is not a GPU name like 'gfx90a_mod0'")
        return v


class Registration(_Model):
    """How the arch is registered upstream: by cloning a neighbour arch's entries."""

    like: str = Field(description="Existing arch whose table entries are cloned (e.g. gfx90a).")
    experimental: bool = Field(
        False,
        description="List the arch in upstream's experimental list: PyTorch then also needs "
        "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1.",
    )

    @field_validator("like")
    @classmethod
    def _arch(cls, v: str) -> str:
        if not ARCH_RE.match(v):
            raise ValueError(f"'{v}' is not an arch name like 'gfx90a'")
        return v


class Upstream(_Model):
    releases: list[str] = Field(min_length=1, description="AOTriton release tags the spec is for.")

    @field_validator("releases")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        for tag in v:
            if not RELEASE_RE.match(tag):
                raise ValueError(f"'{tag}' is not a release tag like '0.11b'")
        if len(set(v)) != len(v):
            raise ValueError("duplicate release")
        return v


class TargetSpec(_Model):
    """One target GPU for mi100-codegen."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Short name of the target.")
    description: str = ""
    arch: str = Field(description="LLVM target name, e.g. gfx908.")
    gpus: list[str] = Field(min_length=1, description="AOTriton GPU names (arch + _modN).")
    warp_size: Literal[32, 64]
    production_line: Literal["CDNA", "RDNA"]
    hardware: Hardware
    head_dims: list[Annotated[int, Field(ge=16, le=512)]] = Field(min_length=1)
    dtypes: list[DType] = Field(min_length=1)
    features: Features = Features()
    tuning: TuningSpace
    rows: Rows
    registration: Registration
    upstream: Upstream

    @field_validator("arch")
    @classmethod
    def _arch(cls, v: str) -> str:
        if not ARCH_RE.match(v):
            raise ValueError(f"'{v}' is not an arch name like 'gfx908'")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[str]) -> list[str]:
        for g in v:
            if not GPU_RE.match(g):
                raise ValueError(f"'{g}' is not a GPU name like 'gfx908_mod0'")
        if len(set(v)) != len(v):
            raise ValueError("duplicate GPU")
        return v

    @field_validator("dtypes")
    @classmethod
    def _dtypes(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("duplicate dtype")
        return v

    @property
    def primary_gpu(self) -> str:
        return self.gpus[0]

    def family_space(self, family: str) -> FamilySpace:
        return getattr(self.tuning, family)
