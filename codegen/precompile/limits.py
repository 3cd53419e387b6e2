"""waves_per_eu limits per config, from a committed compile report (light: render and apply
import this).

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

import re

from ..models import FAMILIES

CLEAN_VERDICTS = ("ok", "low occupancy", "no matrix cores")  # compiled and no VGPR spill

_NAME_RE = re.compile(
    r"^(?P<family>[a-z_]+)\.(?P<arch>[a-z0-9]+)\.(?P<dtype>[a-z0-9]+)\.d(?P<head_dim>\d+)"
    r"\.M(?P<block_m>\d+)N(?P<block_n>\d+)\.wpe(?P<waves_per_eu>\d+)\.w(?P<num_warps>\d+)"
    r"\.s(?P<num_stages>\d+)(?:\.plv(?P<pre_load_v>[01]))?$"
)


def parse_config_name(name: str) -> dict | None:
    """The axes of a tunable family's config name; None for other names."""
    m = _NAME_RE.match(name)
    if not m or m.group("family") not in FAMILIES:
        return None
    d = m.groupdict()
    out = {k: (v if k in ("family", "arch", "dtype") else (None if v is None else int(v))) for k, v in d.items()}
    return out


def limit_key(family: str, arch: str, dtype: str, head_dim: int, block_m: int, block_n: int,
              num_warps: int, num_stages: int, pre_load_v=None) -> str:
    """The config without waves_per_eu (pre_load_v only for attn_fwd)."""
    key = f"{family}.{arch}.{dtype}.d{head_dim}.M{block_m}N{block_n}.w{num_warps}.s{num_stages}"
    if family == "attn_fwd" and pre_load_v is not None:
        key += f".plv{int(bool(pre_load_v))}"
    return key


def config_name(key: str, waves_per_eu: int) -> str:
    """limit key + waves_per_eu -> the config name the report and plan use."""
    parts = key.split(".")
    return ".".join(parts[:5] + [f"wpe{waves_per_eu}"] + parts[5:])


def waves_per_eu_limits(report: dict | None, arch: str, dtypes=None, head_dims=None) -> dict | None:
    """The table render puts into rows/<arch>.json (None without a report for `arch`)."""
    if not report or report.get("arch") != arch:
        return None
    groups: dict[str, dict[str, set]] = {}
    for name, entry in report.get("configs", {}).items():
        p = parse_config_name(name)
        if p is None or p["arch"] != arch:
            continue
        if (dtypes is not None and p["dtype"] not in dtypes) or (head_dims is not None and p["head_dim"] not in head_dims):
            continue
        key = limit_key(p["family"], arch, p["dtype"], p["head_dim"], p["block_m"], p["block_n"],
                        p["num_warps"], p["num_stages"], p["pre_load_v"])
        verdict = entry.get("verdict")
        kind = "clean" if verdict in CLEAN_VERDICTS else ("spills" if verdict == "spills" else "failed")
        g = groups.setdefault(key, {"clean": set(), "spills": set(), "failed": set()})
        g[kind].add(p["waves_per_eu"])
    configs = {}
    for key in sorted(groups):
        g = groups[key]
        configs[key] = {
            "max_waves_per_eu": max(g["clean"]) if g["clean"] else None,
            "clean": sorted(g["clean"]), "spills": sorted(g["spills"]), "failed": sorted(g["failed"]),
        }
    return {
        "source": f"tuning/{arch}/compile_report.json",
        "release": report.get("release"),
        "triton": report.get("triton"),
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


__all__ = ["CLEAN_VERDICTS", "cap_waves_per_eu", "config_name", "limit_key", "parse_config_name",
           "variant_status", "waves_per_eu_limits"]
