"""AMDGPU processors LLVM knows (`-mcpu=`/`--offload-arch=` names, GCN and later): data, so a
spec's arch can be checked before anything is generated for it. Extend when LLVM adds one.
`Arch`: a record's field holding one of them."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

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

__all__ = ["Arch", "LLVM_AMDGPU_TARGETS"]
