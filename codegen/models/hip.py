"""The HIP majors mi100-codegen builds bundles for, the one table of them (`HIP_SOURCES`: where
Debian keeps each), and the record of a private HIP sysroot (`<cache>/hip-sysroot/hip<N>/
sysroot.json`, written and read by `codegen.ship.sysroot`; read as possibly hostile: its runtime
path stays inside the sysroot)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt

from codegen.core.contain import RelPath
from codegen.models.records import Name, Record, Sha256


@dataclass(frozen=True)
class HipSource:
    """Where Debian keeps one HIP major."""

    major: int
    suite: str
    packages: tuple[str, ...]   # the first one's version must start with f"{major}."


# the runtime and its headers, and the two packages its CMake config loads (find_dependency):
# AOTriton's CMake finds HIP through that config
_CMAKE_DEPS = ("libamd-comgr-dev", "libamd-comgr3", "libhsa-runtime-dev", "libhsa-runtime64-1")
HIP_SOURCES: dict[int, HipSource] = {
    6: HipSource(6, "sid", ("libamdhip64-dev", "libamdhip64-6", *_CMAKE_DEPS)),
    7: HipSource(7, "experimental", ("libamdhip64-dev", "libamdhip64-7", *_CMAKE_DEPS)),
}
HIP_MAJORS: tuple[int, ...] = tuple(sorted(HIP_SOURCES))


def _known_major(value: int) -> int:
    if value not in HIP_SOURCES:
        raise ValueError(f"HIP {value} is not a major mi100-codegen builds for "
                         f"({', '.join(map(str, HIP_MAJORS))})")
    return value


HipMajor = Annotated[StrictInt, Field(ge=0, le=999), AfterValidator(_known_major)]
"""A HIP major of `HIP_SOURCES` (an integer: never a string, a float or a bool)."""

SYSROOT_FORMAT = 2
SYSROOT_RECORD = "sysroot.json"


class DebPackage(Record):
    version: Name
    file: Annotated[Name, Field(pattern=r"^[^/]+\.deb$")]
    sha256: Sha256


class SysrootRecord(Record):
    """`sysroot.json`: the suite, each .deb (version, file name, sha256) and the runtime library
    (`usr/lib/<triplet>/libamdhip64.so.<N>.…`, relative to the sysroot)."""

    format: Literal[2]
    major: HipMajor
    suite: Name
    packages: dict[Name, DebPackage]
    runtime: RelPath
