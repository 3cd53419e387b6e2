"""Wall time of `tune` over one fixed slice of the grid with 1 and with several GPUs, side by
side in one run, where each entry's time goes, and whether the winners agree (docs/tune.md,
issues 32 and 38).

    PYTHONPATH=$PWD python scripts/bench_tune_devices.py AOTRITON_DIR [--layout 0 --layout 0,1]
        [--base N] [--family F]... [--dtype T]... [--head-dim D]... [--seqlen S]... [--json FILE]

Each --layout is the device indices of one run (the same index twice: two workers share that
GPU, a smoke test on a one-GPU machine, not a speed-up; the same layout twice: the noise of two
runs). Triton's compile cache is filled once first (not timed); then each layout measures the
same entries as `tune` does (handed out by Dispatch, results written to a scratch folder after
each entry). Its workers' start is timed apart: `tune` starts them while it fills the compile
cache. Per layout: the measuring wall time and the speed-up over the base layout (--base, 1:
the first; the first run on a fresh machine also loads what later runs find ready), each
device's busy time and entries, the winners as the base layout's; then the mean seconds per
entry of each phase (compile-cache load: a kernel's first launch in a worker; launches; the
fp64 reference and the checks; timing; writing the results), the kernels the workers loaded,
the milliseconds timing took per kernel (do_bench runs about 60 ms of GPU time on each: more
is host-bound) and the median ratio of the kernel times to the base layout's (a shared
bottleneck shows there). Winners that differ are listed with the base layout's margin between
its winner and the other layout's choice."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from codegen.formats.spec import load_spec
from codegen.gpu.tune import runner
from codegen.gpu.tune.estimate import cost_model, schedule
from codegen.gpu.tune.grid import GridFilter, plan_tuning
from codegen.gpu.tune.store import ResultStore, pick_winner

PHASES = ("inputs", "reference", "cache load", "launch", "check", "timing", "other", "write")


def _layout(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _measure(tree: Path, sp, plan, sched, s, devices: list[int], scratch: Path) -> dict:
    rows_of, where, marks = {}, {}, {}
    write_s = [0.0]

    with ResultStore(scratch) as store:
        def on_result(entry, rows, err, device):
            t = time.perf_counter()
            rows_of[entry.name] = rows
            where[entry.name] = device
            if err:
                print(f"  {entry.name}: failed: {err}", file=sys.stderr)
            elif rows:
                store.record(entry, rows, len(rows))
            marks["last"] = time.perf_counter()
            write_s[0] += marks["last"] - t

        def meanwhile(pool):
            pool.wait_ready()
            marks["ready"] = time.perf_counter()

        t0 = time.perf_counter()
        stats = runner.run_entries(tree, sp.arch, sp.primary_gpu, [(e, plan.configs_for(e)) for e in sched.order],
                                   s, devices, on_result, cost=sched.costs.get, meanwhile=meanwhile)
        end = time.perf_counter()
    winners = {}
    for name, rows in rows_of.items():
        w = pick_winner(rows)
        winners[name] = (w["config"], float(w["time_ms"])) if w else None
    phases = {k: sum(st.phases.get(k, 0.0) for st in stats) for k in PHASES[:-1]}
    phases["write"] = write_s[0]
    return {"devices": devices, "start_s": marks["ready"] - t0, "wall_s": marks["last"] - marks["ready"],
            "stop_s": end - marks["last"], "winners": winners, "rows": rows_of, "phases": phases,
            "launches": sum(st.phases.get("timing launches", 0) for st in stats),
            "timed": sum(st.phases.get("timed", 0) for st in stats),
            "loads": sum(st.phases.get("cache loads", 0) for st in stats),
            "per_device": [{"slot": st.slot, "info": {k: v for k, v in st.info.items() if k != "prov"}, "entries": st.jobs,
                            "kernels": st.steps, "busy_s": round(st.busy_s, 2), "start_s": round(st.start_s, 2),
                            "timeouts": st.timeouts, "crashes": st.crashes, "phases": st.phases} for st in stats]}


def _time_of(rows: list[dict], config: str) -> float | None:
    for r in rows:
        if r["config"] == config and r["status"] == "ok":
            return float(r["time_ms"])
    return None


def _time_ratio(base: dict, run: dict) -> float:
    """Median over every candidate timed in both of this run's kernel time over the base's."""
    ratios = []
    for name, rows in run["rows"].items():
        for r in rows:
            if r["status"] == "ok" and r["same_kernel_as"] == "":
                t0 = _time_of(base["rows"].get(name, []), r["config"])
                if t0:
                    ratios.append(float(r["time_ms"]) / t0)
    return statistics.median(ratios) if ratios else float("nan")


def _print(runs: list[dict], n_entries: int, base_i: int = 0) -> None:
    base = runs[base_i]
    print(f"| devices | start s | wall s | speed-up | per device: entries / busy s | winners as layout {base_i + 1} |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        same = sum(r["winners"].get(n) is not None and base["winners"].get(n) is not None
                   and r["winners"][n][0] == base["winners"][n][0] for n in base["winners"])
        per = "; ".join(f"{d['slot']}: {d['entries']} / {d['busy_s']:.1f}" for d in r["per_device"])
        print(f"| {','.join(map(str, r['devices']))} | {r['start_s']:.1f} | {r['wall_s']:.1f} | "
              f"{base['wall_s'] / r['wall_s']:.2f}x | {per} | {same}/{len(base['winners'])} |")
    print()
    print("| devices | " + " | ".join(PHASES) + " | sum | kernels loaded | ms per kernel timed | kernel times / base |")
    print("|---|" + "---|" * (len(PHASES) + 4))
    for r in runs:
        ph = r["phases"]
        per_kernel = ph["timing"] / r["timed"] * 1e3 if r["timed"] else float("nan")
        print(f"| {','.join(map(str, r['devices']))} | "
              + " | ".join(f"{ph[k] / n_entries:.3f}" for k in PHASES)
              + f" | {sum(ph.values()) / n_entries:.3f} | {r['loads']:.0f} | {per_kernel:.1f} | "
              f"{_time_ratio(base, r):.3f} |")
    for r in runs[:base_i] + runs[base_i + 1:]:
        for name, w in sorted(base["winners"].items()):
            other = r["winners"].get(name)
            if w and other and other[0] != w[0]:
                t_other = _time_of(base["rows"][name], other[0])
                margin = f"{(t_other / w[1] - 1) * 100:.1f}%" if t_other else "?"
                print(f"differs ({','.join(map(str, r['devices']))}): {name}: {w[0]} vs {other[0]} "
                      f"(layout {base_i + 1}'s margin {margin})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path)
    ap.add_argument("--layout", action="append", default=[], help="device indices of one run, e.g. 0,1")
    ap.add_argument("--family", action="append", default=[])
    ap.add_argument("--dtype", action="append", default=[])
    ap.add_argument("--head-dim", action="append", type=int, default=[])
    ap.add_argument("--seqlen", action="append", type=int, default=[])
    ap.add_argument("--features", choices=("plain", "all"), default="all",
                    help="plain: no dropout, no bias; all: every combination the spec has")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rep-ms", type=int, default=50)
    ap.add_argument("--compile-jobs", type=int, default=runner.default_compile_workers())
    ap.add_argument("--base", type=int, default=1, help="the layout (1: the first) speed-ups and winners are "
                    "compared with; the first run on a fresh machine also loads what later runs find ready")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    layouts = [_layout(x) for x in a.layout] or [[0], [0, 1]]
    sp = load_spec(None).spec
    plain = a.features == "plain"
    flt = GridFilter(tuple(a.family), tuple(a.dtype) or ("fp16",), tuple(a.head_dim) or (64,),
                     tuple(a.seqlen) or (1024, 2048, 4096), True, None, False if plain else None,
                     False if plain else None)
    plan = plan_tuning(sp, flt)
    s = runner.Settings(batch=a.batch, heads=a.heads, rep_ms=a.rep_ms)
    model = cost_model([], [], "", warmup_ms=s.warmup_ms, rep_ms=s.rep_ms, batch_heads=a.batch * a.heads)
    sched = schedule(plan.entries, lambda e: model.entry_s(e, len(plan.configs_for(e))), 1)
    print(f"{len(plan.entries)} entries, {plan.total_measurements} candidates; layouts: "
          f"{' | '.join(','.join(map(str, lay)) for lay in layouts)}", file=sys.stderr)
    t0 = time.perf_counter()
    jobs = runner.warm_jobs(sched.order, plan.configs_for, runner.backend_name())
    runner.warm_compile(a.tree, jobs, s, a.compile_jobs, lambda name, err: None)
    print(f"compile cache filled: {len(jobs)} kernels in {time.perf_counter() - t0:.1f} s with {a.compile_jobs} "
          "jobs (not timed below)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as tmp:
        runs = []
        for i, lay in enumerate(layouts):
            runs.append(_measure(a.tree, sp, plan, sched, s, lay, Path(tmp) / str(i)))
            print(f"layout {','.join(map(str, lay))}: {runs[-1]['wall_s']:.1f} s", file=sys.stderr)
    _print(runs, len(plan.entries), a.base - 1)
    if a.json:
        doc = [{k: v for k, v in r.items() if k != "rows"} for r in runs]
        a.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
