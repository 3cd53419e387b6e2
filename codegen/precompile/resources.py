"""Resources of a compiled kernel, read from its AMDGCN assembly and code object (pure).

The assembly Triton returns (`asm['amdgcn']`) carries the code object's metadata notes
(`.vgpr_count`, `.agpr_count`, `.sgpr_count`, `.group_segment_fixed_size`,
`.private_segment_fixed_size`, `.vgpr_spill_count`, `.sgpr_spill_count`) and LLVM's kernel-info
comment (`; Occupancy: N`). Triton allocates its LDS dynamically: the static group segment is 0
and the real size is Triton's `metadata.shared`. Code size is the `.text` section of the ELF.
"""

from __future__ import annotations

import re
import struct

from pydantic import BaseModel, ConfigDict

from ..models.target import Hardware

_NOTE_KEYS = {
    "vgprs": ".vgpr_count",
    "agprs": ".agpr_count",
    "sgprs": ".sgpr_count",
    "group_segment": ".group_segment_fixed_size",
    "scratch_bytes": ".private_segment_fixed_size",
    "vgpr_spills": ".vgpr_spill_count",
    "sgpr_spills": ".sgpr_spill_count",
}
_MFMA_RE = re.compile(r"^\s*v_mfma\w*", re.M)
_OCC_RE = re.compile(r"; Kernel info:.*?; Occupancy: (\d+)", re.S)


class Resources(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    vgprs: int
    agprs: int
    sgprs: int
    lds_bytes: int
    scratch_bytes: int
    vgpr_spills: int
    sgpr_spills: int
    mfma: int
    code_bytes: int
    llvm_occupancy: int | None = None


def _note(text: str, key: str) -> int:
    block = text
    start = text.find(".amdgpu_metadata")
    if start >= 0:
        block = text[start:]
    m = re.search(re.escape(key) + r":\s+(\d+)", block)
    if m is None:
        raise ValueError(f"no {key} in the kernel's metadata notes")
    return int(m.group(1))


def text_section_size(elf: bytes) -> int:
    """Size of the .text section of an ELF64 little-endian code object (0 if unreadable)."""
    if len(elf) < 64 or elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return 0
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if not shoff or shstrndx >= shnum or shoff + shnum * shentsize > len(elf):
        return 0

    def header(i: int) -> tuple[int, int, int]:
        name, _typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize)
        return name, off, size

    _, str_off, str_size = header(shstrndx)
    names = elf[str_off:str_off + str_size]
    for i in range(shnum):
        name, _off, size = header(i)
        end = names.find(b"\0", name)
        if names[name:end] == b".text":
            return size
    return 0


def parse_resources(amdgcn: str, hsaco: bytes, shared: int) -> Resources:
    values = {k: _note(amdgcn, key) for k, key in _NOTE_KEYS.items()}
    occ = _OCC_RE.findall(amdgcn)
    return Resources(
        vgprs=values["vgprs"],
        agprs=values["agprs"],
        sgprs=values["sgprs"],
        lds_bytes=max(values["group_segment"], int(shared or 0)),
        scratch_bytes=values["scratch_bytes"],
        vgpr_spills=values["vgpr_spills"],
        sgpr_spills=values["sgpr_spills"],
        mfma=len(_MFMA_RE.findall(amdgcn)),
        code_bytes=text_section_size(hsaco),
        llvm_occupancy=int(occ[-1]) if occ else None,
    )


def _round_up(x: int, granule: int) -> int:
    return -(-max(x, 1) // granule) * granule


def _sgpr_waves(sgprs: int) -> int:
    # LLVM AMDGPUBaseInfo getOccupancyWithNumSGPRs for GFX8/GFX9 (800 SGPRs per SIMD).
    if sgprs <= 80:
        return 10
    if sgprs <= 88:
        return 9
    if sgprs <= 100:
        return 8
    return 7


def occupancy(hw: Hardware, r: Resources, num_warps: int) -> tuple[int, str]:
    """Achievable waves per SIMD under the target's limits, and what limits it."""
    g = hw.vgpr_alloc_granule
    limits: dict[str, int] = {"wave slots": hw.max_waves_per_simd}
    if hw.unified_register_file:
        limits["VGPRs"] = hw.vgprs_per_lane // _round_up(_round_up(r.vgprs, 4) + r.agprs, g)
    else:
        limits["VGPRs"] = hw.vgprs_per_lane // _round_up(r.vgprs, g)
        if r.agprs:
            limits["AGPRs"] = (hw.agprs_per_lane // _round_up(r.agprs, g)) if hw.agprs_per_lane else 0
    limits["SGPRs"] = min(_sgpr_waves(r.sgprs), hw.max_waves_per_simd)
    if r.lds_bytes:
        groups = hw.lds_bytes_per_cu // r.lds_bytes
        # a workgroup's waves are spread over the CU's SIMDs; 0 when one workgroup does not fit
        limits["LDS"] = -(-groups * max(num_warps, 1) // hw.simds_per_cu)
    waves = min(limits.values())
    limiter = min(limits, key=lambda k: (limits[k], k != "wave slots"))
    return waves, limiter
