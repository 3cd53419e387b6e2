"""Pydantic models of a target spec (pure data: no I/O).

A spec describes one GPU target that upstream AOTriton ships no kernels for: its arch traits,
the hardware limits static analysis needs, what to build (head dims, dtypes, features), the
tuning space per kernel family, and where seeded tuning rows come from.
"""

import re
from typing import Annotated, ClassVar, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_serializer

from codegen.models.dtypes import DTYPE_INFO

FAMILIES: tuple[str, ...] = ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse")
DTYPES: tuple[str, ...] = tuple(DTYPE_INFO)
Family = Literal[FAMILIES]     # type: ignore[valid-type]
DType = Literal[DTYPES]        # type: ignore[valid-type]
DTYPE_BYTES = {k: d.bytes for k, d in DTYPE_INFO.items()}

# \Z, not $: `$` also matches before a trailing newline, and these names are written into
# upstream's C++ enums and Python tables. The mod number has at most two digits (upstream's are 0-9).
ARCH_RE = re.compile(r"^gfx[0-9]{2,4}[a-z]?\Z")
GPU_RE = re.compile(r"^(gfx[0-9]{2,4}[a-z]?)_mod(0|[1-9][0-9]?)\Z")
# the target string ROCm reports for a device (hipDeviceProp_t::gcnArchName): arch, then target
# features each on (+) or off (-), e.g. gfx908:sramecc+:xnack-
DEVICE_TARGET_PATTERN = r"^gfx[0-9]{2,4}[a-z]?(:(sramecc|xnack)[+-])*$"  # pydantic (Rust regex): $ is the very end
# the default of `device_target`: the archs LLVM gives the sramecc feature (all also have xnack)
# run as ROCm's Instinct cards do, SRAM ECC on and XNACK off; other archs report the arch alone
SRAMECC_ARCHS = frozenset({"gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"})


def _gpu(gpu: str) -> re.Match:
    """The one parser of AOTriton's GPU names; ValueError otherwise."""
    m = GPU_RE.match(gpu)
    if not m:
        raise ValueError(f"'{gpu}' is not a GPU name like 'gfx908_mod0' (arch, '_mod', 0-99)")
    return m


def gpu_arch(gpu: str) -> str:
    """'gfx90a_mod0' -> 'gfx90a'."""
    return _gpu(gpu).group(1)


def gpu_mod(gpu: str) -> int:
    """'gfx908_mod1' -> 1."""
    return int(_gpu(gpu).group(2))


RELEASE_RE = re.compile(r"^[0-9]+\.[0-9]+(\.[0-9]+)?b$|^[0-9]+\.[0-9]+\.[0-9]+-dev$")  # a tag, or a snapshot of main

TILE_MIN, TILE_MAX = 16, 256
PowerOfTwoTile = Annotated[int, Field(ge=TILE_MIN, le=TILE_MAX)]


def tile_problems(block_m: int, block_n: int) -> list[str]:
    """Why (BLOCK_M, BLOCK_N) is not a tile the attention kernels take (the one rule: powers of
    two from 16 to 256, BLOCK_M >= BLOCK_N); [] when it is one."""
    out = []
    for v, axis in ((block_m, "BLOCK_M"), (block_n, "BLOCK_N")):
        if v & (v - 1) or v < 1:
            out.append(f"{axis}={v} is not a power of two")
        elif not TILE_MIN <= v <= TILE_MAX:
            out.append(f"{axis}={v} is outside {TILE_MIN}..{TILE_MAX}")
    if block_m < block_n:
        out.append(f"BLOCK_M={block_m} < BLOCK_N={block_n}: upstream treats M < N as faulty or duplicate")
    return out
NumWarps = Literal[1, 2, 4, 8, 16]  # the num_warps a tuning space may hold (powers of two)


def _arch_name(v: str) -> str:
    if not ARCH_RE.match(v):
        raise ValueError(f"'{v}' is not an arch name like 'gfx908'")
    return v


def _unique(what: str) -> AfterValidator:
    """A list without repeats; else 'duplicate <what>'."""
    def check(v: list) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"duplicate {what}")
        return v
    return AfterValidator(check)


GpuName = Annotated[str, AfterValidator(lambda v: _gpu(v).string)]
ArchName = Annotated[str, AfterValidator(_arch_name)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)
    # fields left out of a dump while empty: a spec that does not use a field added later keeps its
    # meaning hash (`spec_sha256`) and the committed overlay, which records it
    _omit_empty: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler):
        out = handler(self)
        if isinstance(out, dict):
            for name in self._omit_empty:
                if not getattr(self, name):
                    out.pop(name, None)
        return out


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
    matrix_core_dtypes: Annotated[list[DType], _unique("dtype")] = Field(
        description="Dtypes with matrix-core (MFMA/WMMA) instructions; others run on plain ALUs."
    )
    matrix_instructions: Literal["mfma", "wmma", "none"] = Field(
        "mfma",
        description="The matrix-core instruction family tl.dot should lower to for "
        "matrix_core_dtypes (v_mfma* on CDNA, v_wmma* on RDNA3+); 'none' when the arch has no "
        "matrix cores (tl.dot then runs on v_dot2*/v_fma* ALU instructions).",
    )
    max_vgprs_per_wave: int | None = Field(
        None, ge=32, le=1024,
        description="VGPRs one wave can address, when smaller than the file (vgprs_per_lane): "
        "256 on gfx10+ in wave32, whose file holds 1024 per lane. Default: vgprs_per_lane.",
    )
    sgpr_occupancy: list[tuple[Annotated[int, Field(ge=1, le=128)], Annotated[int, Field(ge=1, le=32)]]] | None = Field(
        None,
        description="Waves per SIMD as the SGPR count allows, as [max_sgprs, waves] steps in "
        "ascending SGPR order (more SGPRs than the last step: its waves), as LLVM's "
        "getOccupancyWithNumSGPRs. gfx9: [[80, 10], [88, 9], [100, 8], [128, 7]]. "
        "Unset: SGPRs do not limit occupancy (gfx10+ have a per-wave SGPR file).",
    )
    lds_bytes_per_workgroup: int | None = Field(
        None, ge=1024, le=1 << 20,
        description="LDS one workgroup can allocate. Default: lds_bytes_per_cu.",
    )

    @field_validator("sgpr_occupancy")
    @classmethod
    def _sgpr_steps(cls, v):
        if v is None:
            return v
        if not v:
            raise ValueError("empty table (leave it out when SGPRs do not limit occupancy)")
        sg = [s for s, _ in v]
        wv = [w for _, w in v]
        if sg != sorted(set(sg)) or wv != sorted(wv, reverse=True):
            raise ValueError("steps must rise in SGPRs and fall in waves")
        return v

    @property
    def vgprs_per_wave(self) -> int:
        """VGPRs one wave can address (the per-wave register budget at one wave per SIMD)."""
        return min(self.max_vgprs_per_wave or self.vgprs_per_lane, self.vgprs_per_lane)

    @property
    def workgroup_lds_bytes(self) -> int:
        return self.lds_bytes_per_workgroup or self.lds_bytes_per_cu

    def sgpr_waves(self, sgprs: int) -> int | None:
        """Waves per SIMD the SGPR count allows (None: SGPRs do not limit occupancy)."""
        if not self.sgpr_occupancy:
            return None
        return next((w for most, w in self.sgpr_occupancy if sgprs <= most), self.sgpr_occupancy[-1][1])


class Features(_Model):
    """Kernel features to build and tune for."""

    causal: bool = Field(True, description="Causal masking (CAUSAL_TYPE != 0).")
    dropout: bool = Field(True, description="Dropout (ENABLE_DROPOUT).")
    bias: bool = Field(True, description="Additive attention bias (BIAS_TYPE).")


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
    num_warps: list[NumWarps] = Field(min_length=1)
    num_stages: list[Annotated[int, Field(ge=1, le=4)]] = Field([1], min_length=1)
    pre_load_v: list[bool] | None = Field(
        None, description="attn_fwd only: load V before the softmax (PRE_LOAD_V)."
    )
    exclude: list[ExcludeRule] = Field([])


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
    block_m: int | None = Field(None, description="Donor BLOCK_M to replace (unset: any).")
    block_n: int | None = Field(None, description="Donor BLOCK_N to replace (unset: any).")
    dtype: DType | None = None
    head_dim: int | None = None
    to: tuple[PowerOfTwoTile, PowerOfTwoTile] = Field(description="[BLOCK_M, BLOCK_N] to use instead.")
    # not `num_warps`: that is a matcher axis (codegen.models.match), and this is a value set, not matched
    min_num_warps: NumWarps | None = Field(
        None, description="At least this many warps for the matched rows (raises, never lowers; after "
        "rows.min_num_warps): for a tile that only fits the target's registers with more threads. One of "
        "the family's tuning num_warps.")
    reason: str = Field(min_length=1)

    _omit_empty = ("min_num_warps",)


class SplitBackward(_Model):
    """Backward passes (dtype and/or head dim) that must use the split backend (bwd_kernel_dk_dv +
    bwd_kernel_dq), never the fused bwd_kernel_fuse: the seeded `op_attn_bwd` rows that pick the
    fused kernel for them are rewritten to the split backend. For a fused kernel that spills on the
    target at every tile and warp count the space allows. Releases without an op database (0.10b)
    have nothing to route."""

    dtype: DType | None = None
    head_dim: int | None = None
    reason: str = Field(min_length=1)


class MinNumWarps(_Model):
    """Per kernel family: the fewest warps a seeded row may have (donor rows with fewer spill on
    the target). Each value must be one of the family's `tuning.<family>.num_warps`."""

    attn_fwd: NumWarps | None = None
    bwd_kernel_dk_dv: NumWarps | None = None
    bwd_kernel_dq: NumWarps | None = None
    bwd_kernel_fuse: NumWarps | None = None

    def as_dict(self) -> dict[str, int]:
        """family -> floor, for the families that have one."""
        return {f: n for f in FAMILIES if (n := getattr(self, f)) is not None}

    def __bool__(self) -> bool:   # some family has a floor
        return bool(self.as_dict())


class Rows(_Model):
    """Where the target's own tuning-database rows come from until measured rows exist."""

    donor_gpu: GpuName = Field(description="Existing GPU whose tuned rows seed the target's rows.")
    waves_per_eu_caps: list[WavesCap] = Field([])
    default_max_waves_per_eu: int | None = Field(
        None, ge=0, le=10, description="Cap applied to every seeded row (after the specific caps)."
    )
    tile_replacements: list[TileReplacement] = Field(
        default=[],
        description="Seeded rows with these tiles get another tile (before the waves_per_eu caps): "
        "for donor configs that spill on the target even at waves_per_eu=1.",
    )
    min_num_warps: MinNumWarps = Field(
        default_factory=MinNumWarps,
        description="Seeded rows of a family with fewer warps get this many (after the tile "
        "replacements, before the waves_per_eu caps): for donor rows whose num_warps spill on "
        "the target at any tile. One of the family's tuning num_warps.",
    )
    split_backward: list[SplitBackward] = Field(
        default=[],
        description="Backward passes routed to the split backend instead of the fused kernel "
        "(op_attn_bwd rows, 0.11b and later).",
    )
    use_proxy_measurements: bool = Field(
        False,
        description="Let winners measured on a stand-in GPU (proxy column set, e.g. an NVIDIA "
        "GPU) replace seeded rows. Off by default: a proxy's fastest config says nothing about "
        "the target; measurements on the target itself are always used.",
    )

    _omit_empty = ("min_num_warps", "split_backward")


class Registration(_Model):
    """How the arch is registered upstream: by cloning a neighbour arch's entries."""

    like: ArchName = Field(description="Existing arch whose table entries are cloned (e.g. gfx90a).")
    experimental: bool = Field(
        False,
        description="List the arch in upstream's experimental list: PyTorch then also needs "
        "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1.",
    )


class Toolchain(_Model):
    """The compiler versions that compile for the arch (checked by precompile, build and tune)."""

    triton: str | None = Field(
        None,
        description="pip Triton versions that compile AOTriton's kernels for the arch, as a "
        "version specifier set (PEP 440), e.g. '>=3.8.0,<3.9'. Unset: not checked.",
    )

    @field_validator("triton")
    @classmethod
    def _specifier(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            SpecifierSet(v)
        except InvalidSpecifier:
            raise ValueError(f"'{v}' is not a version specifier set like '>=3.8.0,<3.9'") from None
        return v


class Upstream(_Model):
    releases: Annotated[list[str], _unique("release")] = Field(min_length=1, description="AOTriton release tags the spec is for.")

    @field_validator("releases")
    @classmethod
    def _tags(cls, v: list[str]) -> list[str]:
        for tag in v:
            if not RELEASE_RE.match(tag):
                raise ValueError(f"'{tag}' is not a release tag like '0.11b' (or a snapshot like '0.14.0-dev')")
        return v


class TargetSpec(_Model):
    """One target GPU for mi100-codegen."""

    schema_version: Literal[1] = 1
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$", description="Short name of the target.")
    description: str = ""
    arch: ArchName = Field(description="LLVM target name, e.g. gfx908.")
    gpus: Annotated[list[GpuName], _unique("GPU")] = Field(min_length=1, description="AOTriton GPU names (arch + _modN).")
    warp_size: Literal[32, 64]
    production_line: Literal["CDNA", "RDNA"]
    device_target: str | None = Field(
        None, pattern=DEVICE_TARGET_PATTERN,
        description="The full target string ROCm reports for the card (hipDeviceProp_t::gcnArchName): "
        "the arch and its target features as the card runs, e.g. 'gfx908:sramecc+:xnack-' (MI100), "
        "'gfx1030' (RDNA2: no such features). Default: '<arch>:sramecc+:xnack-' for the archs "
        "with SRAM ECC (gfx906, gfx908, gfx90a, gfx94x, gfx950), else the arch alone; set it for a "
        "card that runs otherwise (e.g. Radeon VII: 'gfx906:sramecc-:xnack-').",
    )
    hardware: Hardware
    head_dims: list[Annotated[int, Field(ge=16, le=512)]] = Field(min_length=1)
    dtypes: Annotated[list[DType], _unique("dtype")] = Field(min_length=1)
    features: Features = Features()
    tuning: TuningSpace
    rows: Rows
    registration: Registration
    upstream: Upstream
    toolchain: Toolchain = Toolchain()

    @field_validator("device_target")
    @classmethod
    def _device_target(cls, v: str | None, info) -> str | None:
        if v is None:
            return v
        feats = [f[:-1] for f in v.split(":")[1:]]
        if len(set(feats)) != len(feats):
            raise ValueError(f"'{v}': a target feature named twice")
        arch = info.data.get("arch")
        if arch is not None and v.split(":")[0] != arch:
            raise ValueError(f"'{v}' is not a target string of arch '{arch}'")
        return v

    @property
    def primary_gpu(self) -> str:
        return self.gpus[0]

    _omit_empty = ("device_target",)

    @property
    def target_string(self) -> str:
        """The device's full target string: `device_target`, else the default (see the field)."""
        if self.device_target:
            return self.device_target
        return f"{self.arch}:sramecc+:xnack-" if self.arch in SRAMECC_ARCHS else self.arch

    def family_space(self, family: str) -> FamilySpace:
        return getattr(self.tuning, family)
