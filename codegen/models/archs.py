"""AMDGPU processors LLVM knows (`-mcpu=`/`--offload-arch=` names, GCN and later): data, so a
spec's arch can be checked before anything is generated for it. Extend when LLVM adds one.
`Arch`: a record's field holding one of them.

Also the two spellings ROCm uses for a processor besides its name: the KFD topology's
`gfx_target_version` (major * 10000 + minor * 100 + stepping: 90008 is gfx908, 90010 gfx90a,
100300 gfx1030) and `HSA_OVERRIDE_GFX_VERSION`'s `major.minor.stepping` (10.3.0), and which
processors run another's code objects when the runtime is told to take them for it (`RUNS_AS`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, TypeAdapter, ValidationError

from codegen.core.errors import UserError

LLVM_AMDGPU_TARGETS: tuple[str, ...] = (
    "gfx600", "gfx601", "gfx602",
    "gfx700", "gfx701", "gfx702", "gfx703", "gfx704", "gfx705",
    "gfx801", "gfx802", "gfx803", "gfx805", "gfx810",
    "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909", "gfx90a", "gfx90c",
    "gfx940", "gfx941", "gfx942", "gfx950",
    "gfx1010", "gfx1011", "gfx1012", "gfx1013",
    "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
    "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153",
    "gfx1200", "gfx1201", "gfx1250",
)


def _known(value: str) -> str:
    if value not in LLVM_AMDGPU_TARGETS:
        raise ValueError(f"{ascii(value)} is not an AMDGPU processor LLVM knows (e.g. gfx908, gfx90a)")
    return value


Arch = Annotated[str, Field(max_length=16), AfterValidator(_known)]
"""One of LLVM_AMDGPU_TARGETS (a name, never a path)."""


def arch_option(arch: str) -> str:
    """`--arch ARCH`, checked as a record's `Arch` is (it names a folder: a processor, never a
    path); UserError (exit 2) otherwise."""
    try:
        return TypeAdapter(Arch).validate_python(arch)
    except ValidationError as exc:
        raise UserError(f"--arch: {exc.errors(include_url=False)[0]['msg'].removeprefix('Value error, ')}") from None

# The environment variable that makes ROCm's runtime take every GPU for the processor it names.
HSA_OVERRIDE_ENV = "HSA_OVERRIDE_GFX_VERSION"
# processor -> the processor whose code objects it runs under HSA_OVERRIDE_GFX_VERSION (the RDNA2
# family runs gfx1030's; ROCm ships code for gfx1030 only)
RUNS_AS: dict[str, str] = {a: "gfx1030" for a in ("gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036")}


def arch_of_target_version(value: int) -> str | None:
    """KFD's `gfx_target_version` as a processor name (90008 -> 'gfx908', 90010 -> 'gfx90a',
    100300 -> 'gfx1030'); None for 0 (a CPU node) and for a value no processor name can spell
    (minor or stepping above 15). The name may be one LLVM does not know yet (a newer GPU)."""
    if not 0 < value < 1_000_000:
        return None
    major, minor, stepping = value // 10000, value // 100 % 100, value % 100
    if major == 0 or minor > 15 or stepping > 15:
        return None
    return f"gfx{major}{minor:x}{stepping:x}"


def hsa_version(arch: str) -> str:
    """`HSA_OVERRIDE_GFX_VERSION`'s spelling of a processor: 'gfx1030' -> '10.3.0', 'gfx90a' -> '9.0.10'."""
    digits = arch.removeprefix("gfx")
    return f"{int(digits[:-2])}.{int(digits[-2], 16)}.{int(digits[-1], 16)}"
