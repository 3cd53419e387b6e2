"""Wall time of `tune` over one fixed slice of the grid with 1 and with several GPUs, side by
side in one run, and whether the winners agree (docs/tune.md, issue 32).

    PYTHONPATH=$PWD python scripts/bench_tune_devices.py AOTRITON_DIR [--layout 0 --layout 0,1]
        [--family F]... [--dtype T]... [--head-dim D]... [--seqlen S]... [--json FILE]

Each --layout is the device indices of one run (the same index twice: two workers share that
GPU, a smoke test on a one-GPU machine, not a speed-up). Triton's compile cache is filled once
first (not timed); then each layout measures the same entries, handed out longest first, and
its wall time, each device's busy time and entries, and its winners are printed. Winners that
differ between layouts are listed with the first layout's margin between its winner and the
other layout's choice (timing noise flips candidates closer than it)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from codegen.formats.spec import load_spec
from codegen.gpu.tune import runner
from codegen.gpu.tune.estimate import cost_model, schedule
from codegen.gpu.tune.grid import GridFilter, plan_tuning
from codegen.gpu.tune.store import pick_winner


def _layout(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _measure(tree: Path, sp, plan, order, s, devices: list[int]) -> dict:
    rows_of, where = {}, {}

    def on_result(entry, rows, err, device):
        rows_of[entry.name] = rows
        where[entry.name] = device
        if err:
            print(f"  {entry.name}: failed: {err}", file=sys.stderr)

    t0 = time.perf_counter()
    stats = runner.run_entries(tree, sp.arch, sp.primary_gpu, ((e, plan.configs_for(e)) for e in order), s,
                               devices, on_result)
    wall = time.perf_counter() - t0
    winners = {}
    for name, rows in rows_of.items():
        w = pick_winner(rows)
        winners[name] = (w["config"], float(w["time_ms"])) if w else None
    return {"devices": devices, "wall_s": wall, "winners": winners, "rows": rows_of,
            "per_device": [{"slot": st.slot, "device": st.info.get("device"), "entries": st.jobs,
                            "kernels": st.steps, "busy_s": round(st.busy_s, 2), "timeouts": st.timeouts,
                            "crashes": st.crashes} for st in stats]}


def _time_of(rows: list[dict], config: str) -> float | None:
    for r in rows:
        if r["config"] == config and r["status"] == "ok":
            return float(r["time_ms"])
    return None


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
    order = schedule(plan.entries, lambda e: model.entry_s(e, len(plan.configs_for(e))), 1).order
    print(f"{len(plan.entries)} entries, {plan.total_measurements} candidates; layouts: "
          f"{' | '.join(','.join(map(str, lay)) for lay in layouts)}", file=sys.stderr)
    t0 = time.perf_counter()
    jobs = runner.warm_jobs(order, plan.configs_for, runner.backend_name())
    runner.warm_compile(a.tree, jobs, s, a.compile_jobs, lambda name, err: None)
    print(f"compile cache filled: {len(jobs)} kernels in {time.perf_counter() - t0:.1f} s (not timed below)",
          file=sys.stderr)
    runs = [_measure(a.tree, sp, plan, order, s, lay) for lay in layouts]

    base = runs[0]
    print("| devices | workers | entries | wall s | speed-up | per device: entries / busy s | winners as first |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        same = sum(r["winners"].get(n) is not None and base["winners"].get(n) is not None
                   and r["winners"][n][0] == base["winners"][n][0] for n in base["winners"])
        per = "; ".join(f"{d['slot']}: {d['entries']} / {d['busy_s']:.1f}" for d in r["per_device"])
        print(f"| {','.join(map(str, r['devices']))} | {len(r['devices'])} | {len(r['winners'])} | "
              f"{r['wall_s']:.1f} | {base['wall_s'] / r['wall_s']:.2f}x | {per} | {same}/{len(base['winners'])} |")
    for r in runs[1:]:
        for name, w in sorted(base["winners"].items()):
            other = r["winners"].get(name)
            if w and other and other[0] != w[0]:
                t_other = _time_of(base["rows"][name], other[0])
                margin = f"{(t_other / w[1] - 1) * 100:.1f}%" if t_other else "?"
                print(f"differs ({','.join(map(str, r['devices']))}): {name}: {w[0]} vs {other[0]} "
                      f"(first layout's margin {margin})")
    if a.json:
        doc = [{k: v for k, v in r.items() if k != "rows"} for r in runs]
        a.json.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
