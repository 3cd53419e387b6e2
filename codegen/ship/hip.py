"""Which HIP runtime (`libamdhip64.so.N`) a library needs, and which one torch ships or loads.

A library's HIP runtime is its DT_NEEDED entry `libamdhip64.so.N`; N is the ROCm major it was
built against (ROCm 5 → .5, ROCm 6 → .6). torch's is what `libtorch_hip.so` needs: the copy its
wheel ships in torch/lib (its SONAME gives the major) or, when the wheel ships none, the system
library of that name. Two majors in one process cannot work: the loader either fails to find the
second runtime or loads two. Pure functions over `DynamicInfo` plus reading torch/lib's copy."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from codegen.formats.elf import DynamicInfo, ElfError, read_dynamic

_HIP_RE = re.compile(r"^libamdhip64(?:-[0-9a-f]{8,})?\.so(?:\.(\d+))?(?:\.[\d.]+)?$")


@dataclass(frozen=True)
class HipRuntime:
    name: str           # the DT_NEEDED (or SONAME) spelling
    major: int | None   # the ROCm major, when the name or SONAME carries it
    source: str         # how we know: "DT_NEEDED", "ships <path>", "torch.version.hip"
    # the version nodes the runtime defines, where a copy was read (torch's shipped one); None otherwise
    nodes: frozenset[str] | None = field(default=None, compare=False)


def _major(name: str | None) -> int | None:
    m = _HIP_RE.match(name or "")
    return int(m.group(1)) if m and m.group(1) else None


def needed_hip(dyn: DynamicInfo | None) -> str | None:
    """The HIP runtime a library's DT_NEEDED names (None when it needs none)."""
    return next((n for n in (dyn.needed if dyn else ()) if _HIP_RE.match(n)), None)


def library_hip(dyn: DynamicInfo) -> HipRuntime | None:
    name = needed_hip(dyn)
    return HipRuntime(name, _major(name), "DT_NEEDED") if name else None


def torch_hip(lib_dir: Path, hip_dyn: DynamicInfo | None, hip_version: str | None) -> HipRuntime | None:
    """The HIP runtime torch's libtorch_hip.so loads: the copy in torch/lib when the wheel ships
    one (its SONAME and the version nodes it defines), else the DT_NEEDED name, else the major of
    torch.version.hip."""
    name = needed_hip(hip_dyn)
    if name:
        shipped = Path(lib_dir) / name
        if shipped.is_file():
            try:
                copy = read_dynamic(shipped)
                soname, nodes = copy.soname, frozenset(copy.version_defs) or None
            except ElfError:
                soname = nodes = None
            major = _major(soname) if _major(soname) is not None else _major(name)
            return HipRuntime(soname or name, major, f"ships {shipped}", nodes)
        if _major(name) is not None:
            return HipRuntime(name, _major(name), "DT_NEEDED of libtorch_hip.so")
    m = re.match(r"^(\d+)\.", hip_version or "")
    if m:
        return HipRuntime(name or f"libamdhip64.so.{m[1]}", int(m[1]), f"torch.version.hip {hip_version}")
    return None


def hip_mismatch(ours: HipRuntime | None, theirs: HipRuntime | None) -> str | None:
    """Why a library with runtime `ours` cannot load into a torch with runtime `theirs` (None: it can)."""
    if ours is None or theirs is None or ours.major is None or theirs.major is None:
        return None
    if ours.major == theirs.major:
        return None
    return (f"needs the HIP runtime {ours.name} (built against ROCm {ours.major}), but torch loads "
            f"{theirs.name} (ROCm {theirs.major}; {theirs.source}): the loader cannot satisfy "
            f"{ours.name} with it, so import torch would fail or load two HIP runtimes")
