"""Per-kernel results, verdicts and summaries of a precompile run (pure, except the writers)."""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from typing import Literal


from codegen.models import FAMILIES
from codegen.models.limits import VERDICTS
from codegen.models.records import Record
from codegen.models.target import Hardware
from codegen.plan.kernel_list import KernelEntry
from codegen.compile.resources import Resources, occupancy

Status = Literal["ok", "failed", "timeout"]


class KernelResult(Record):
    id: str
    config: str
    family: str
    dtype: str
    head_dim: int | None
    waves_per_eu: int
    num_warps: int
    num_stages: int
    status: Status
    error: str | None = None
    resources: Resources | None = None
    occupancy: int | None = None          # achievable waves per SIMD under the spec's limits
    occupancy_limiter: str | None = None
    compile_s: float = 0.0
    cached: bool = False
    # the matrix instructions the spec expects for this kernel's dtype (hardware.matrix_instructions
    # when the dtype is in matrix_core_dtypes); None: the arch has none for it, nothing to flag
    expected_matrix: Literal["mfma", "wmma"] | None = "mfma"
    dispatched: bool = True  # False: rows.split_backward routes its pass to the split backend

    @property
    def verdict(self) -> str:
        return self.verdicts[-1] if self.verdicts else "ok"

    @property
    def verdicts(self) -> list[str]:
        """Every verdict that applies, in increasing severity ('ok' alone when none)."""
        if self.status != "ok" or self.resources is None:
            return ["failed"]
        if not self.dispatched:
            return ["not dispatched"]
        r = self.resources
        out = []
        if self.occupancy is not None and self.waves_per_eu > 0 and self.occupancy < self.waves_per_eu:
            out.append("low occupancy")
        if self.family in FAMILIES and self.expected_matrix and getattr(r, self.expected_matrix) == 0:
            out.append("no matrix cores")
        if r.vgpr_spills > 0:
            out.append("spills")
        return out or ["ok"]


def worst(verdicts) -> str:
    return max(verdicts, key=VERDICTS.index, default="ok")


def expected_matrix(hw: Hardware, dtype: str) -> str | None:
    """The matrix instructions a kernel of `dtype` should use on the target (None: no matrix cores)."""
    if hw.matrix_instructions == "none" or dtype not in hw.matrix_core_dtypes:
        return None
    return hw.matrix_instructions


def kernel_result(entry: KernelEntry, raw: dict, hw: Hardware, cached: bool) -> KernelResult:
    cfg = entry.config
    common = dict(id=entry.id, config=cfg.name, family=cfg.family, dtype=cfg.dtype,
                  head_dim=cfg.head_dim, waves_per_eu=cfg.waves_per_eu, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages, compile_s=round(float(raw.get("compile_s", 0.0)), 3),
                  cached=cached, expected_matrix=expected_matrix(hw, cfg.dtype))
    if not raw.get("ok"):
        status = "timeout" if raw.get("timeout") else "failed"
        return KernelResult(status=status, error=raw.get("error") or "unknown error", **common)
    res = Resources.model_validate(raw["resources"])
    waves, limiter = occupancy(hw, res, cfg.num_warps)
    return KernelResult(status="ok", resources=res, occupancy=waves, occupancy_limiter=limiter, **common)


def _dot_mix(results) -> str | None:
    counts = Counter(r.resources.dot_instruction for r in results)
    return " ".join(f"{k}:{n}" for k, n in sorted(counts.items())) or None


class GroupStats(Record):
    """A group of kernels (one family, head dim, dtype or config): counts, the resources' maxima
    (occupancy and MFMA count: minima; None where nothing compiled) and the worst verdict."""

    kernels: int
    compiled: int
    failed: int
    spilling: int
    not_dispatched: int
    low_occupancy: int
    no_matrix_cores: int
    max_vgprs: int | None
    max_agprs: int | None
    max_sgprs: int | None
    max_lds_bytes: int | None
    max_scratch_bytes: int | None
    max_vgpr_spills: int | None
    max_sgpr_spills: int | None
    min_occupancy: int | None
    min_mfma: int | None          # the matrix-product families only (not pre/postprocess)
    dot_instructions: str | None  # the instruction the products run on, per kernel (mfma, wmma, dot2, fma, none)
    mean_compile_s: float | None
    verdict: str


def _group_stats(results: list[KernelResult]) -> GroupStats:
    ok = [r for r in results if r.status == "ok" and r.resources is not None]

    def mx(attr):
        return max((getattr(r.resources, attr) for r in ok), default=None)

    return GroupStats(
        kernels=len(results), compiled=len(ok), failed=sum(r.status != "ok" for r in results),
        spilling=sum("spills" in r.verdicts for r in results), not_dispatched=sum(not r.dispatched for r in results),
        low_occupancy=sum("low occupancy" in r.verdicts for r in results),
        no_matrix_cores=sum("no matrix cores" in r.verdicts for r in results),
        max_vgprs=mx("vgprs"), max_agprs=mx("agprs"), max_sgprs=mx("sgprs"), max_lds_bytes=mx("lds_bytes"),
        max_scratch_bytes=mx("scratch_bytes"), max_vgpr_spills=mx("vgpr_spills"), max_sgpr_spills=mx("sgpr_spills"),
        min_occupancy=min((r.occupancy for r in ok if r.occupancy is not None), default=None),
        min_mfma=min((r.resources.mfma for r in ok if r.family in FAMILIES), default=None),
        dot_instructions=_dot_mix(r for r in ok if r.family in FAMILIES),
        mean_compile_s=round(statistics.fmean(r.compile_s for r in results if not r.cached), 2)
        if any(not r.cached for r in results) else None,
        verdict=worst(r.verdict for r in results),
    )


def summaries(results: list[KernelResult]) -> dict[str, dict[str, GroupStats]]:
    axes = {
        "by_family": lambda r: r.family,
        "by_head_dim": lambda r: str(r.head_dim) if r.head_dim is not None else "none",
        "by_dtype": lambda r: r.dtype,
        "by_config": lambda r: r.config,
    }
    out = {}
    for axis, key in axes.items():
        groups: dict[str, list[KernelResult]] = defaultdict(list)
        for r in results:
            groups[key(r)].append(r)
        out[axis] = {k: _group_stats(v) for k, v in sorted(groups.items())}
    return out


class RunInfo(Record):
    gpu: str
    arch: str
    release: str
    triton: str
    build: str
    planned: int
    sampled: int
    sample: int            # requested sample size (0 = all)
    jobs: int
    wall_s: float
    compiled_now: int
    from_cache: int


class RunSummary(RunInfo):
    kernels_per_min: float | None     # compiled now, per minute of the run's wall time


class Totals(GroupStats):
    configs: int
    config_verdicts: dict[str, int]   # verdict -> how many configs have it as their worst


class PrecompileReport(Record):
    """A precompile run: what ran, the totals, the groups by family, head dim, dtype and config,
    and every kernel (sorted) with its result; `precompile --json` writes `to_json()`."""

    run: RunSummary
    totals: Totals
    by_family: dict[str, GroupStats]
    by_head_dim: dict[str, GroupStats]
    by_dtype: dict[str, GroupStats]
    by_config: dict[str, GroupStats]
    kernels: list[KernelResult]

    def to_json(self) -> dict:
        out = self.model_dump(mode="json", exclude={"kernels"})
        out["kernels"] = [{**r.model_dump(mode="json"), "verdict": r.verdict, "verdicts": r.verdicts}
                          for r in self.kernels]
        return out


def precompile_report(info: RunInfo, results: list[KernelResult]) -> PrecompileReport:
    s = summaries(results)
    verdict_counts = Counter(cfg.verdict for cfg in s["by_config"].values())
    compiled_now = info.compiled_now
    return PrecompileReport(
        run=RunSummary(**info.model_dump(), kernels_per_min=round(compiled_now / info.wall_s * 60, 1)
                       if compiled_now and info.wall_s else None),
        totals=Totals(**_group_stats(results).model_dump(), configs=len(s["by_config"]),
                      config_verdicts=dict(sorted(verdict_counts.items()))),
        **s,
        kernels=sorted(results, key=lambda r: (r.family, r.dtype, r.head_dim or 0, r.config, r.id)),
    )


def report_json(report: PrecompileReport) -> str:
    return json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n"


def _cell(v) -> str:
    return "–" if v is None else str(v)


def report_markdown(report: PrecompileReport) -> str:
    run, tot = report.run, report.totals
    lines = [
        f"# precompile report: {run.gpu} ({run.arch}), AOTriton {run.release}, Triton {run.triton}",
        "",
        f"- kernels: {run.sampled} of {run.planned} planned ({run.build} build"
        + (f", stratified sample of {run.sample}" if run.sample else "") + ")",
        f"- compiled now: {run.compiled_now}, from cache: {run.from_cache}, jobs: {run.jobs}, "
        f"wall time: {run.wall_s:.1f} s"
        + (f", {run.kernels_per_min} kernels/min" if run.kernels_per_min else ""),
        f"- failed: {tot.failed}, spilling (VGPR spills): {tot.spilling}, low occupancy: "
        f"{tot.low_occupancy}, no matrix cores: {tot.no_matrix_cores}",
        "- config verdicts: " + ", ".join(f"{k} {v}" for k, v in tot.config_verdicts.items()),
        "",
        "Cross-compiled on a CPU with pip Triton; resources are static (code object metadata), "
        "not measured on a GPU.",
        "",
    ]
    cols = ["kernels", "failed", "spilling", "low_occupancy", "no_matrix_cores", "max_vgprs", "max_agprs",
            "max_sgprs", "max_lds_bytes", "max_scratch_bytes", "min_occupancy", "dot_instructions",
            "mean_compile_s", "verdict"]
    for axis, title in (("by_family", "family"), ("by_head_dim", "head dim"), ("by_dtype", "dtype"),
                        ("by_config", "config")):
        lines += [f"## By {title}", "", "| " + title + " | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
                  "|---" * (len(cols) + 1) + "|"]
        for k, st in getattr(report, axis).items():
            lines.append(f"| {k} | " + " | ".join(_cell(getattr(st, c)) for c in cols) + " |")
        lines.append("")
    failed = [k for k in report.kernels if k.status != "ok"]
    if failed:
        lines += ["## Failures", ""]
        for k in failed:
            lines.append(f"- `{k.id}` ({k.config}): {k.status}: {k.error}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
