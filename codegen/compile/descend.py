"""`precompile --descend`: measure the waves_per_eu that apply will lower spilling configs to.

A normal build compiles only the donor's configs, so a config that spills at its donor
waves_per_eu often has no measured lower variant: apply could not cap its rows (it only ever
caps to a waves_per_eu the compile report measured clean). For every spilling config of a
tuning-row family, descend compiles *all* of that config's kernels (every functional the plan
holds for it) again at a lower waves_per_eu:

- the one apply will choose when the report already knows a clean lower variant
  (`limits.cap_waves_per_eu`), so the capped kernels are measured as well;
- else the largest waves_per_eu whose per-wave VGPR budget (`vgprs_per_lane / w`, at most
  the VGPRs one wave addresses, rounded down to the allocation granule) holds the kernel's VGPRs plus its spills.

The new variant's verdict covers every kernel apply will move there; if it still spills, the
next round goes lower, down to 1. Kernels already compiled (same source, signature, options)
come from the persistent cache, and so do the capped kernels of a later `apply` + `precompile`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.models.image_name import Spelling
from codegen.models.limits import CompileReport, cap_waves_per_eu, waves_per_eu_limits
from codegen.models.target import Hardware
from codegen.plan.kernel_list import KernelEntry
from codegen.compile.report import KernelResult, worst


def vgpr_budget(hw: Hardware, waves_per_eu: int) -> int:
    # the file shared by `waves_per_eu` waves, but never more than one wave can address
    # (gfx10+ wave32: a 1024-VGPR file, 256 per wave)
    per_wave = min(hw.vgprs_per_wave, hw.vgprs_per_lane // max(1, waves_per_eu))
    return per_wave - per_wave % hw.vgpr_alloc_granule


@dataclass
class DescendPlan:
    entries: list[KernelEntry] = field(default_factory=list)
    moves: dict[str, str] = field(default_factory=dict)   # spilling config -> config compiled instead


def plan_round(entries: list[KernelEntry], results: list[KernelResult], hw: Hardware, report: CompileReport | None,
               arch: str, names: Spelling) -> DescendPlan:
    """Kernels to compile next: every spilling config (of `results`) moved one step down (`names`:
    how the release names its images, codegen.models.image_name)."""
    by_config: dict[str, list[KernelResult]] = {}
    for r in results:
        by_config.setdefault(r.config, []).append(r)
    limits = waves_per_eu_limits(report, arch) if report else None
    have = {e.id for e in entries}
    plan = DescendPlan()
    seen: set[str] = set()
    for e in sorted(entries, key=lambda e: (e.config.name, e.id)):
        cfg = e.config
        rs = by_config.get(cfg.name)
        if (not rs or not cfg.tunable or cfg.waves_per_eu <= 1
                or worst(v for r in rs for v in r.verdicts) != "spills"):
            continue
        w, status = cap_waves_per_eu(limits, cfg.limit_key, cfg.waves_per_eu)
        if status != "clean" or w >= cfg.waves_per_eu:
            demand = max(r.resources.vgprs + r.resources.vgpr_spills for r in rs if r.resources)
            w = next((x for x in range(cfg.waves_per_eu - 1, 0, -1) if vgpr_budget(hw, x) >= demand), 1)
        new = e.with_waves(w, names)
        plan.moves.setdefault(cfg.name, new.config.name)
        if new.id not in have and new.id not in seen:
            seen.add(new.id)
            plan.entries.append(new)
    return plan
