"""waves_per_eu limits per config, from a compile report (pure: render, apply and precompile
share it; the one answer to "the largest waves_per_eu that compiled clean").

A compile report (`tuning/<arch>/compile_report.json`, written by `precompile --tuning-report`)
maps config names (`attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0`) to a verdict. Render
groups them by the config without its `waves_per_eu` (the *limit key*,
`attn_fwd.gfx908.fp16.d64.M64N32.w4.s1.plv0`) into a table:

    {"max_waves_per_eu": 2, "clean": [1, 2], "spills": [3, 4], "failed": []}

`max_waves_per_eu` is the largest waves_per_eu measured clean (compiled, no VGPR spill), or
None when every measured variant spills or fails. Apply lowers a seeded row's waves_per_eu to
it (`cap_waves_per_eu`). waves_per_eu=0 means "no hint": Triton passes
`amdgpu-waves-per-eu=0`, i.e. LLVM's default, which budgets registers like 1 wave per EU (the
cross-compile gave byte-identical resources at 0 and 1 for the kernels compared); it is ordered
below 1, never changed, and judged by its own verdict or, when unmeasured, by the one of 1.
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from codegen.models.space import KernelConfig

# increasing severity; "not dispatched": a fused-backward kernel the spec's rows.split_backward
# routes away (compiled because upstream compiles every backend, never run)
VERDICTS = ("ok", "not dispatched", "low occupancy", "no matrix cores", "spills", "failed")
Verdict = Literal[VERDICTS]     # type: ignore[valid-type]
# compiled and no VGPR spill, or never dispatched (rows.split_backward)
CLEAN_VERDICTS = ("ok", "not dispatched", "low occupancy", "no matrix cores")

_Count = Optional[Annotated[int, Field(ge=0, le=1 << 40)]]


class CompileReportEntry(BaseModel):
    """One config of a compile report: the worst verdict of its kernels and their resources
    (maxima; occupancy and MFMA count: minima). None where no kernel compiled."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    verdict: Verdict
    kernels: Annotated[int, Field(ge=0, le=1 << 40)]
    vgprs: _Count = None
    agprs: _Count = None
    sgprs: _Count = None
    lds_bytes: _Count = None
    scratch_bytes: _Count = None
    vgpr_spills: _Count = None
    sgpr_spills: _Count = None
    occupancy: _Count = None
    mfma: _Count = None
    error: Optional[str] = None


class CompileReport(BaseModel):
    """`tuning/<arch>/compile_report.json` (`precompile --tuning-report`): config name ->
    entry. Every key is a kernel config name (`KernelConfig.parse`); the reader is
    `codegen.render.inputs.read_compile_report`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    generated: str = ""
    arch: str
    gpu: str
    release: str
    triton: str
    configs: dict[str, CompileReportEntry]

    @field_validator("configs")
    @classmethod
    def _names(cls, v: dict) -> dict:
        bad = [k for k in v if KernelConfig.try_parse(k) is None]
        if bad:
            raise ValueError(f"{len(bad)} key(s) are not kernel config names, e.g. {bad[0]!r}")
        return v


def waves_per_eu_limits(report: CompileReport | None, arch: str, dtypes=None, head_dims=None) -> dict | None:
    """The table render puts into rows/<arch>.json (None without a report for `arch`)."""
    if report is None or report.arch != arch:
        return None
    groups: dict[str, dict[str, set]] = {}
    for name, entry in report.configs.items():
        cfg = KernelConfig.try_parse(name)
        if cfg is None or not cfg.tunable or cfg.arch != arch:
            continue
        if (dtypes is not None and cfg.dtype not in dtypes) or (head_dims is not None and cfg.head_dim not in head_dims):
            continue
        verdict = entry.verdict
        kind = "clean" if verdict in CLEAN_VERDICTS else ("spills" if verdict == "spills" else "failed")
        g = groups.setdefault(cfg.limit_key, {"clean": set(), "spills": set(), "failed": set()})
        g[kind].add(cfg.waves_per_eu)
    configs = {}
    for key in sorted(groups):
        g = groups[key]
        configs[key] = {
            "max_waves_per_eu": max(g["clean"]) if g["clean"] else None,
            "clean": sorted(g["clean"]), "spills": sorted(g["spills"]), "failed": sorted(g["failed"]),
        }
    return {
        "source": f"tuning/{arch}/compile_report.json",
        "release": report.release,
        "triton": report.triton,
        "configs": configs,
    }


def cap_waves_per_eu(limits: dict | None, key: str, waves_per_eu: int) -> tuple[int, str]:
    """(new waves_per_eu, status) for a row of config `key` asking for `waves_per_eu`.

    status: 'clean' (the resulting variant was measured clean), 'unclean' (it spills or fails and
    no clean variant <= the request exists: kept as is), 'unmeasured' (the report does not know the
    resulting variant) or 'no-report'. The value only ever goes down; 0 (no hint) is never changed."""
    if limits is None:
        return waves_per_eu, "no-report"
    entry = limits.get("configs", {}).get(key)
    if entry is None:
        return waves_per_eu, "unmeasured"
    clean, bad = set(entry["clean"]), set(entry["spills"]) | set(entry["failed"])
    w = waves_per_eu
    if w > 0:
        top = entry["max_waves_per_eu"]
        if top is not None and w > top:
            w = top
        if w in bad:
            lower = [c for c in clean if c < w]
            if lower:
                w = max(lower)
    return w, variant_status(entry, w)


def variant_status(entry: dict | None, waves_per_eu: int) -> str:
    """'clean', 'unclean' or 'unmeasured' for one waves_per_eu of a limits-table entry
    (0, "no hint", takes the verdict of 1 when it was not measured itself)."""
    if entry is None:
        return "unmeasured"
    clean, bad = set(entry["clean"]), set(entry["spills"]) | set(entry["failed"])
    w = waves_per_eu
    if w == 0 and w not in clean | bad:
        w = 1
    if w in clean:
        return "clean"
    if w in bad:
        return "unclean"
    return "unmeasured"


def largest_clean_waves_per_eu(limits: dict | None, cfg: KernelConfig) -> int | None:
    """The largest waves_per_eu (<= cfg.waves_per_eu, >= 1) whose variant of `cfg` was measured
    clean; None when the limits table knows no such variant."""
    entry = (limits or {}).get("configs", {}).get(cfg.limit_key)
    if entry is None:
        return None
    clean = [w for w in entry["clean"] if 1 <= w <= cfg.waves_per_eu]
    return max(clean) if clean else None
