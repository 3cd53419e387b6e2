"""What a precompile run means for the spec and for the seeded tuning rows.

- `prune_spec`: the spec, with `exclude` rules for every config of its tuning space that failed
  to compile or spilled VGPRs for the target (the rewrite: codegen.formats.spec.with_exclude_rules).
- `compile_report`: config name -> resources and verdict, committed as
  tuning/<arch>/compile_report.json, so render can make seeded rows reference only configs that
  compile cleanly (`codegen.models.limits.largest_clean_waves_per_eu`).
"""

from __future__ import annotations

import json
from pathlib import Path

from codegen.core.fsutil import atomic_write, read_input, write_if_changed
from codegen.models import FAMILIES, expand_space
from codegen.models.limits import CompileReport
from codegen.plan.kernel_list import KernelEntry
from codegen.formats.spec import LoadedSpec, with_exclude_rules
from codegen.compile.report import VERDICTS, KernelResult, worst

PRUNED = ("failed", "spills")


def config_verdicts(results: list[KernelResult]) -> dict[str, tuple[str, list[KernelResult]]]:
    groups: dict[str, list[KernelResult]] = {}
    for r in results:
        groups.setdefault(r.config, []).append(r)
    return {c: (worst(v for r in rs for v in r.verdicts), rs) for c, rs in sorted(groups.items())}


def _where(arch: str | None, release: str | None) -> str:
    bits = [f"CPU cross-compile for {arch}" if arch else "CPU cross-compile"]
    if release:
        bits.append(f"AOTriton {release}")
    return " (" + ", ".join(bits) + ")"


def _reason_text(verdict: str, error: str | None, spills: int | None, triton: str, where: str = "") -> str:
    if verdict == "failed":
        return f"precompile: fails to compile with Triton {triton}{where} ({(error or 'compile error')[:120]})"
    return f"precompile: spills {spills} VGPRs with Triton {triton}{where}"


def _reason(verdict: str, rs: list[KernelResult], triton: str, where: str = "") -> str:
    err = next((r.error for r in rs if r.error), None)
    spills = max((r.resources.vgpr_spills for r in rs if r.resources), default=None)
    return _reason_text(verdict, err, spills, triton, where)


def _rule(cfg, reason: str) -> dict:
    rule = {"block_m": cfg.block_m, "block_n": cfg.block_n, "waves_per_eu": cfg.waves_per_eu,
            "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.family == "attn_fwd" and cfg.pre_load_v is not None:
        rule["pre_load_v"] = cfg.pre_load_v
    rule.update({"dtype": cfg.dtype, "head_dim": cfg.head_dim, "reason": reason})
    return rule


def prune_rules(loaded: LoadedSpec, entries: list[KernelEntry], results: list[KernelResult],
                triton: str, arch: str | None = None, release: str | None = None
                ) -> tuple[dict[str, list[dict]], list[str]]:
    """family -> new exclude rules; plus the pruned configs that are not in the spec's space."""
    space = {c.name for cfgs in expand_space(loaded.spec).values() for c in cfgs}
    by_config = {e.config.name: e.config for e in entries}
    rules: dict[str, list[dict]] = {}
    outside: list[str] = []
    for name, (verdict, rs) in config_verdicts(results).items():
        if verdict not in PRUNED:
            continue
        cfg = by_config[name]
        if cfg.family not in FAMILIES or name not in space:
            outside.append(name)
            continue
        rules.setdefault(cfg.family, []).append(_rule(cfg, _reason(verdict, rs, triton, _where(arch, release))))
    return rules, outside


def prune_spec(loaded: LoadedSpec, rules: dict[str, list[dict]], out: Path) -> int:
    """Write the spec with the extra exclude rules to `out`; return how many rules were added
    (none: the spec's own bytes, a rewrite would lose nothing but is not made)."""
    text, added = with_exclude_rules(loaded, {f: rules[f] for f in FAMILIES if rules.get(f)})
    if text is None:
        write_if_changed(Path(out), read_input(loaded.path, what="spec file"))
    else:
        atomic_write(Path(out), text)
    return added


def compile_report(results: list[KernelResult], *, arch: str, gpu: str, release: str, triton: str,
                   previous: CompileReport | None = None) -> CompileReport:
    """config -> resources and verdict (no timings: reviewable, deterministic).

    Merging into `previous` (same arch and Triton version, else it is dropped): a config this run
    compiled replaces the previous entry, unless the previous verdict is more severe (another
    kernel of that config, e.g. of a tuning build, spilled): then the previous entry stays, so a
    merge never turns a spilling config clean."""

    configs = {}
    if previous is not None and previous.triton == triton and previous.arch == arch:
        configs.update({name: entry.model_dump() for name, entry in previous.configs.items()})
    for name, (verdict, rs) in config_verdicts(results).items():
        old = configs.get(name)
        if old and VERDICTS.index(old.get("verdict", "ok")) > VERDICTS.index(verdict):
            continue
        ok = [r for r in rs if r.resources is not None]

        def mx(attr):
            return max((getattr(r.resources, attr) for r in ok), default=None)

        configs[name] = {
            "verdict": verdict,
            "kernels": len(rs),
            "vgprs": mx("vgprs"), "agprs": mx("agprs"), "sgprs": mx("sgprs"),
            "lds_bytes": mx("lds_bytes"), "scratch_bytes": mx("scratch_bytes"),
            "vgpr_spills": mx("vgpr_spills"), "sgpr_spills": mx("sgpr_spills"),
            "occupancy": min((r.occupancy for r in ok if r.occupancy is not None), default=None),
            "mfma": min((r.resources.mfma for r in ok), default=None),
            "error": next((r.error for r in rs if r.error), None),
        }
    return CompileReport.model_validate({
        "generated": "@generated by mi100-codegen precompile (static resources of a CPU cross-compile)",
        "arch": arch, "gpu": gpu, "release": release, "triton": triton,
        "configs": dict(sorted(configs.items())),
    })


def write_compile_report(path: Path, report: CompileReport) -> None:
    text = json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    atomic_write(path, text)  # committed and shared: 0644
