#!/usr/bin/env python3
"""The image-build cost table of docs/build.md (issue 24, items 4 and 6), from what was measured:
`precompile --json` reports (the build's kernel-compile phase: the same kernels, warm workers and
kernel cache as `build`), the logs of the shell's `time` around each of them, and the reuse
matrices of `scripts/bench_build_compile.py --reuse-matrix --json`.

    python scripts/build_cost_table.py REPORT.json ... [--log LOG ...] [--reuse REUSE.json ...] [--reach REACH.json ...]
    python scripts/build_cost_table.py REPORT.json ... [--log LOG ...] --runs    # one line per report

One row per (release, target). A report is the row's cold run when its kernel cache served at most
1 % of its kernels (what another release's entries can serve), its warm run when every kernel that
compiled came from the cache; any other report (a resumed run) is neither. CPU-s are user+sys of
the `time` block that follows the report's run in a log, matched by release, GPU, kernels planned
and kernels cached (the `AOTriton R: N kernels planned for GPU` line and the progress line's
`cached N`); without one, the sum of the kernels' own compile_s (a cached kernel keeps the
compile_s of the run that compiled it), marked `Σ compile_s`. Releases of a reuse matrix that no
report measured get a row of their own (kernels and reuse only). Kernel counts carry the
`<!-- kernels RELEASE SPEC -->` mark that tests/test_docs.py checks where docs/kernel-counts.json
has the pair. The last column counts the fused-backward kernels the backward op table never
selects, with their code bytes: from `scripts/op_table_reach.py --json` (`--reach`), read from the
generated tables, else from the reports' `dispatched` flags (marked `(flag)`: precompile sets them
from the spec's split_backward rule only). Markdown on stdout; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[1]
COUNTS = REPO / "docs" / "kernel-counts.json"
HEADER = re.compile(r"^AOTriton (\S+): (\d+) kernels planned for (\S+);")
CACHED = re.compile(r"^precompile .*\bcached (\d+)\b")
TIME = re.compile(r"^(real|user|sys)\s+(?:(\d+)m)?([\d.]+)s$")
COLD_SHARE = 0.01


@dataclass(frozen=True)
class Timed:
    """One `time` block of a log: real, user and sys seconds."""

    real: float
    user: float
    sys: float


@dataclass
class Row:
    release: str
    arch: str
    spec: str = ""
    kernels: int | None = None
    cold: dict | None = None
    warm: dict | None = None
    other: list = field(default_factory=list)
    reuse: dict | None = None


def read_logs(paths: list[Path]) -> dict[tuple, set[Timed]]:
    """(release, gpu, planned, cached) -> the `time` blocks found after such a run's lines."""
    out: dict[tuple, set[Timed]] = {}
    for path in paths:
        head, cached, clock = None, None, {}
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if m := HEADER.match(line):
                head, cached, clock = (m.group(1), m.group(3), int(m.group(2))), None, {}
            elif m := CACHED.match(line):
                cached = int(m.group(1))
            elif (m := TIME.match(line)) and head is not None and cached is not None:
                clock[m.group(1)] = 60 * int(m.group(2) or 0) + float(m.group(3))
                if len(clock) == 3:
                    out.setdefault((*head, cached), set()).add(Timed(clock["real"], clock["user"], clock["sys"]))
                    head, cached, clock = None, None, {}
    return out


def kind(report: dict) -> str:
    run, kernels = report["run"], report["kernels"]
    failed = sum(k["status"] == "failed" for k in kernels)
    if run["from_cache"] and run["compiled_now"] <= failed:
        return "warm"
    return "cold" if run["from_cache"] <= COLD_SHARE * run["planned"] else "other"


def timed(report: dict, logs: dict[tuple, set[Timed]]) -> Timed | None:
    run = report["run"]
    found = logs.get((run["release"], run["gpu"], run["planned"], run["from_cache"]), set())
    if len(found) > 1:
        print(f"warning: {run['release']} {run['gpu']}: {len(found)} different `time` blocks match; "
              "none used", file=sys.stderr)
    return next(iter(found)) if len(found) == 1 else None


def _version(release: str):
    try:
        return Version(release)
    except InvalidVersion:
        return Version("0")


def gather(reports: list[Path], logs: dict, reuse_docs: list[dict]) -> list[Row]:
    rows: dict[tuple[str, str], Row] = {}
    order: list[str] = []
    for path in reports:
        rep = json.loads(path.read_text(encoding="utf-8"))
        run = rep["run"]
        rep["_time"], rep["_file"] = timed(rep, logs), path.name
        row = rows.setdefault((run["arch"], run["release"]), Row(run["release"], run["arch"]))
        order.append(run["arch"]) if run["arch"] not in order else None
        row.kernels = run["planned"]
        k = kind(rep)
        if k in ("cold", "warm") and getattr(row, k) is None:
            setattr(row, k, rep)
        else:
            row.other.append(rep)
    for doc in reuse_docs:
        spec = doc["spec"]  # "mi100 (gfx908)"
        arch = spec.rsplit("(", 1)[1].rstrip(")")
        order.append(arch) if arch not in order else None
        for release, m in doc["releases"].items():
            row = rows.setdefault((arch, release), Row(release, arch))
            row.spec, row.reuse = spec.split(" (")[0], m
            row.kernels = row.kernels if row.kernels is not None else m["kernels"]
    return sorted(rows.values(), key=lambda r: (order.index(r.arch), _version(r.release)))


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _wall(s: float) -> str:
    return f"{s:.1f} s"


def _pct(n: int, total: int) -> str:
    """As bench_build_compile.py's reuse matrix prints a share."""
    share = 100 * n / max(1, total)
    return f"{share:.0f} %" if share >= 10 or n in (0, total) else f"{share:.1f} %"


def _mb(b: int) -> str:
    return f"{b / 1e6:.1f} MB"


def _any(row: Row) -> dict | None:
    return row.cold or row.warm or (row.other[0] if row.other else None)


def _same_kernels(row: Row, by_release: dict[str, Row], cold: bool = False) -> str | None:
    """A measured release (with a cold run: `cold`) of the same target whose cache holds every kernel of
    this one, and this one's every kernel: the same kernel set, so the same compile work."""
    if not row.reuse:
        return None
    for other, n in row.reuse["served_by"].items():
        o = by_release.get(other)
        if o and (o.cold if cold else _any(o)) and n == row.reuse["kernels"] == o.kernels:
            return other
    return None


def cells(row: Row, counts: dict, by_release: dict[str, Row], reach: dict | None = None) -> list[str]:
    rep = _any(row)
    mark = f"<!-- kernels {row.release} {row.spec} -->" if counts.get(row.release, {}).get(row.spec) == row.kernels else ""
    kernels = f"{row.kernels:,}{mark}" if row.kernels is not None else "–"
    target = f"{row.arch} (`{row.spec}`)" if row.spec else row.arch
    share = ""
    if row.reuse and row.reuse["best"]:
        best = row.reuse["best"]
        share = f"{', '.join(best)}: {_pct(row.reuse['served_by'][best[0]], row.reuse['kernels'])}"
    elif row.reuse:
        share = "none"
    if rep is None:
        same = _same_kernels(row, by_release)
        if same:
            return [row.release, target, kernels, "–", "–", f"= {same} (same kernels)", f"= {same}", f"= {same}",
                    share, "–"]
        return [row.release, target, kernels, "–", "–", "not measured", "not measured", "not measured", share, "–"]
    ks = rep["kernels"]
    failed = str(sum(k["status"] == "failed" for k in ks))
    cold_t = row.cold["_time"] if row.cold else None
    if cold_t:
        cpu = _n(cold_t.user + cold_t.sys)
    else:
        cpu = f"≈ {_n(sum(k['compile_s'] or 0 for k in ks))} (Σ compile_s)"
    if row.cold:
        wall = _wall(cold_t.real) if cold_t else f"{_wall(row.cold['run']['wall_s'])} (compile phase)"
        if row.cold["run"]["from_cache"]:
            wall += f" ({row.cold['run']['from_cache']} cached)"
    elif row.other:
        o, same = row.other[0], _same_kernels(row, by_release, cold=True)
        t = o["_time"]
        wall = ((f"= {same} (same kernels); " if same else "not measured; ")
                + f"resumed here: {o['run']['compiled_now']:,} compiled" + (f" in {_wall(t.real)}" if t else "")
                + f", {o['run']['from_cache']:,} cached")
    else:
        wall = "not measured"
    warm = "not measured"
    if row.warm:
        t = row.warm["_time"]
        warm = _wall(t.real) if t else "not timed"
        if row.warm["run"]["compiled_now"]:
            warm += f" ({row.warm['run']['compiled_now']} failed ones again)"
    code = sum((k.get("resources") or {}).get("code_bytes") or 0 for k in ks)
    r = (reach or {}).get((row.arch, row.release))
    if r is not None:  # read from the op table (op_table_reach.py)
        n, n_code, flag = r["never"], r["never_bytes"], ""
    else:  # precompile's flag (the spec's split_backward rule)
        nd = [k for k in ks if not k["dispatched"]]
        n, n_code, flag = len(nd), sum((k.get("resources") or {}).get("code_bytes") or 0 for k in nd), " (flag)"
    undispatched = (f"{n}{flag}: {_mb(n_code)} of {_mb(code)} ({_pct(n_code, code)})" if n
                    else f"0{flag} (of {_mb(code)})")
    how = f"{rep['run']['triton']}, -j {rep['run']['jobs']}"
    return [row.release, target, kernels, failed, how, cpu, wall, warm, share, undispatched]


def table(rows: list[Row], counts: dict, reach: dict | None = None) -> list[str]:
    head = ["release", "target (spec)", "kernels", "failed", "Triton, jobs", "CPU-s cold", "wall cold", "wall warm",
            "reused from (best other release: share)", "op table never selects: code"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        by_release = {r.release: r for r in rows if r.arch == row.arch}
        out.append("| " + " | ".join(cells(row, counts, by_release, reach)) + " |")
    return out


def runs_table(reports: list[Path], logs: dict) -> list[str]:
    """--runs: one line per report, as measured (the raw figures behind the table)."""
    out = ["| report | release | GPU | Triton, jobs | kernels | compiled | cached | failed | run | "
           "precompile's wall | `time` real / user / sys | Σ compile_s |", "|" + "---|" * 12]
    for path in reports:
        rep = json.loads(path.read_text(encoding="utf-8"))
        run, ks = rep["run"], rep["kernels"]
        t = timed(rep, logs)
        clock = f"{t.real:.1f} / {t.user:.1f} / {t.sys:.1f} s" if t else "–"
        out.append(f"| `{path.name}` | {run['release']} | {run['gpu']} | {run['triton']}, -j {run['jobs']} | "
                   f"{run['planned']:,} | {run['compiled_now']:,} | {run['from_cache']:,} | "
                   f"{sum(k['status'] == 'failed' for k in ks)} | {kind(rep)} | {run['wall_s']:.1f} s | {clock} | "
                   f"{_n(sum(k['compile_s'] or 0 for k in ks))} s |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", type=Path, nargs="+", help="precompile --json reports")
    ap.add_argument("--log", type=Path, nargs="*", default=[], help="logs with the `time` output of those runs")
    ap.add_argument("--reuse", type=Path, nargs="*", default=[],
                    help="bench_build_compile.py --reuse-matrix --json outputs, one per spec")
    ap.add_argument("--reach", type=Path, nargs="*", default=[],
                    help="op_table_reach.py --json outputs: the last column from the op tables")
    ap.add_argument("--runs", action="store_true", help="print one line per report instead (the raw figures)")
    a = ap.parse_args()
    if a.runs:
        print("\n".join(runs_table(a.reports, read_logs(a.log))))
        return
    counts = json.loads(COUNTS.read_text(encoding="utf-8"))["kernels"] if COUNTS.is_file() else {}
    docs = [json.loads(p.read_text(encoding="utf-8")) for p in a.reuse]
    reach = {(r["arch"], r["release"]): r for p in a.reach for r in json.loads(p.read_text(encoding="utf-8"))}
    print("\n".join(table(gather(a.reports, read_logs(a.log), docs), counts, reach)))


if __name__ == "__main__":
    main()
