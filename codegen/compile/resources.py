"""Resources of a compiled kernel, read from its code object (pure).

Registers, LDS, scratch and spills come from the code object's AMDGPU metadata note (a msgpack
map, `amdhsa.kernels[]`: `.vgpr_count`, `.agpr_count`, `.sgpr_count`, `.group_segment_fixed_size`,
`.private_segment_fixed_size`, `.vgpr_spill_count`, `.sgpr_spill_count`, `.wavefront_size`), read
with the one ELF reader (`codegen.formats.elf`); code size is the `.text` section. An arch without an AGPR file
(gfx906) has no `.agpr_count`: 0. Triton allocates its LDS dynamically: the static group segment
is 0 and the real size is Triton's `metadata.shared`.

Two things only the compiler's text carries: the dot instruction counts (MFMA, WMMA, v_dot2,
v_fma: the assembly) and the
`amdgpu-waves-per-eu` attribute Triton put on the kernel (its LLVM IR), which LLVM's occupancy
estimate (the `; Occupancy: N` kernel-info comment, kept as `llvm_occupancy`) is capped by.
"""

from __future__ import annotations

import re

from codegen.formats.elf import ElfError, amdgpu_metadata, text_size
from codegen.models.kernel import Resources
from codegen.models.target import Hardware

_NOTE_KEYS = {
    "vgprs": ".vgpr_count",
    "sgprs": ".sgpr_count",
    "group_segment": ".group_segment_fixed_size",
    "scratch_bytes": ".private_segment_fixed_size",
    "vgpr_spills": ".vgpr_spill_count",
    "sgpr_spills": ".sgpr_spill_count",
}
_OPTIONAL_KEYS = {"agprs": ".agpr_count"}  # absent on archs without an AGPR file
_MFMA_RE = re.compile(r"^\s*v_mfma\w*", re.M)
# the instructions tl.dot lowers to: matrix cores (MFMA on CDNA, WMMA on RDNA3+), else packed
# dot products (v_dot2*: fp16 on gfx906/gfx10+) or plain fused multiply-adds (v_fma*, v_fmac*,
# v_pk_fma*: bf16 and fp32 without matrix cores)
_DOT_RES = {
    "wmma": re.compile(r"^\s*v_wmma\w*", re.M),
    "dot2": re.compile(r"^\s*v_dot2\w*", re.M),
    "fma": re.compile(r"^\s*v_(?:pk_)?fmac?_\w*", re.M),
}
_OCC_RE = re.compile(r"; Kernel info:.*?; Occupancy: (\d+)", re.S)
_WPE_ATTR_RE = re.compile(r'"amdgpu-waves-per-eu"="\s*(\d+)\s*(?:,\s*(\d+)\s*)?"')


def code_object_metadata(image: bytes, kernel_name: str | None = None) -> dict:
    """The AMDGPU metadata of one kernel of a code object (its `amdhsa.kernels` entry)."""
    try:
        meta = amdgpu_metadata(image)
    except ElfError as exc:
        why = str(exc)
        raise ValueError("the code object is not an ELF file" if "not an ELF file" in why else why) from None
    kernels = [k for k in meta.get("amdhsa.kernels", []) if isinstance(k, dict)]
    if not kernels:
        raise ValueError("no AMDGPU metadata note (amdhsa.kernels) in the code object")
    if kernel_name is not None:
        for k in kernels:
            if k.get(".name") == kernel_name:
                return k
    return kernels[0]


def text_section_size(image: bytes) -> int:
    """Size of the .text section of a code object (0 if unreadable)."""
    return text_size(image)


def waves_per_eu_bound(llir: str) -> int | None:
    """Upper bound of the kernel's `amdgpu-waves-per-eu` attribute, as LLVM reads it.

    `"min,max"` bounds it by max; `"min"` alone leaves the maximum at the hardware's; an invalid
    pair (0, or min > max) is ignored by LLVM. Triton 3.5 writes `"N,10"` or `"N"`, 3.8 `"N,N"`.
    """
    m = _WPE_ATTR_RE.search(llir or "")
    if m is None or m.group(2) is None:
        return None
    lo, hi = int(m.group(1)), int(m.group(2))
    if lo < 1 or hi < lo:
        return None
    return hi


def note_resources(meta: dict, shared: int, code_bytes: int) -> dict[str, int | None]:
    """The fields of `Resources` a code object decides: those its metadata note gives (one
    kernel's `amdhsa.kernels` entry, `meta`), LDS with Triton's dynamic allocation (`shared`, from
    its metadata sidecar) and the `.text` size. The kernel cache compares a record with them."""
    values = {}
    for k, key in _NOTE_KEYS.items():
        if not isinstance(meta.get(key), int):
            raise ValueError(f"no {key} in the kernel's metadata note")
        values[k] = int(meta[key])
    for k, key in _OPTIONAL_KEYS.items():
        values[k] = int(meta.get(key) or 0)
    wave = meta.get(".wavefront_size")
    group = values.pop("group_segment")
    return {**values, "lds_bytes": max(group, int(shared or 0)), "code_bytes": code_bytes,
            "wavefront_size": int(wave) if isinstance(wave, int) else None}


def parse_resources(amdgcn: str, hsaco: bytes, shared: int, llir: str = "",
                    kernel_name: str | None = None) -> Resources:
    meta = code_object_metadata(hsaco, kernel_name)
    occ = _OCC_RE.findall(amdgcn)
    return Resources(
        **note_resources(meta, shared, text_section_size(hsaco)),
        mfma=len(_MFMA_RE.findall(amdgcn)),
        **{k: len(rx.findall(amdgcn)) for k, rx in _DOT_RES.items()},
        llvm_occupancy=int(occ[-1]) if occ else None,
        max_waves_per_eu=waves_per_eu_bound(llir),
    )


def _round_up(x: int, granule: int) -> int:
    return -(-max(x, 1) // granule) * granule


def occupancy(hw: Hardware, r: Resources, num_warps: int, wavefront_size: int = 64) -> tuple[int, str]:
    """Achievable waves per SIMD under the target's limits, and what limits it.

    The rule of LLVM's own estimate (GCNSubtarget::computeOccupancy), every limit from the spec's
    traits: the register files (VGPRs and AGPRs separately, or one unified file; the VGPR file and
    granule of the arch), SGPRs (`hardware.sgpr_occupancy`; none on gfx10+), LDS, the wave slots,
    and the upper bound of the kernel's `amdgpu-waves-per-eu` attribute. LDS counts Triton's dynamic allocation too (LLVM
    sees only the static segment, 0 for Triton kernels).
    """
    g = hw.vgpr_alloc_granule
    limits: dict[str, int] = {"wave slots": hw.max_waves_per_simd}
    if hw.unified_register_file:
        limits["VGPRs"] = hw.vgprs_per_lane // _round_up(_round_up(r.vgprs, 4) + r.agprs, g)
    else:
        limits["VGPRs"] = hw.vgprs_per_lane // _round_up(r.vgprs, g)
        if r.agprs:
            limits["AGPRs"] = (hw.agprs_per_lane // _round_up(r.agprs, g)) if hw.agprs_per_lane else 0
    sgpr = hw.sgpr_waves(r.sgprs)
    if sgpr is not None:
        limits["SGPRs"] = min(sgpr, hw.max_waves_per_simd)
    if r.lds_bytes:
        # 0 when one workgroup's LDS exceeds what a workgroup may allocate
        groups = hw.lds_bytes_per_cu // r.lds_bytes if r.lds_bytes <= hw.workgroup_lds_bytes else 0
        # a workgroup's waves are spread over the CU's SIMDs; 0 when one workgroup does not fit
        limits["LDS"] = -(-groups * max(num_warps, 1) // hw.simds_per_cu)
    if r.max_waves_per_eu is not None:
        limits["waves_per_eu"] = r.max_waves_per_eu
    waves = min(limits.values())
    limiter = min(limits, key=lambda k: (limits[k], k != "wave slots"))
    return waves, limiter
