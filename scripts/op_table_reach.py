#!/usr/bin/env python3
"""Which fused-backward kernels the backward op's dispatch table can select (issue 24, item 6),
next to precompile's `not dispatched` flag (which follows the spec's rows.split_backward rule only)
and with their code bytes and compile time: what `build --kernels dispatched` leaves out.

    python scripts/op_table_reach.py TREE=REPORT.json [TREE=REPORT.json ...] [--json OUT]

For each applied tree: the tree's own generator is run into a throwaway build dir (as `plan`
does), and `codegen.plan.run.generate_dispatched` (the build's own proof, from the backward op table
the generator wrote: codegen.formats.op_table) says which kernels it leaves out; they are joined
with the precompile --json REPORT of the same tree for their code bytes and compile time. Markdown
on stdout; the trees are not written to. Only what the op table selects is proven: callers that
force a backend (`attn_options.force_backend_index`) or call the v2 `attn_bwd_fused` reach every
fused kernel (docs/build.md). A release without an op table (0.10b) counts every fused kernel as
selectable: PyTorch calls its v2 `attn_bwd_fused` directly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codegen.apply.applied_spec import resolve_spec  # noqa: E402
from codegen.plan.run import generate_dispatched  # noqa: E402
from codegen.plan.tree import release_of  # noqa: E402
from codegen.upstream.knobs import ENABLE_FP32_ENV  # noqa: E402
from codegen.formats.op_table import FUSED_FAMILY  # noqa: E402


def reach(tree: Path, report: dict) -> dict:
    spec = resolve_spec(tree, None).spec
    env = {ENABLE_FP32_ENV: "1" if "fp32" in spec.dtypes else "0"}
    entries, kept, record = generate_dispatched(tree, spec, sys.executable, env)
    kept_ids = {e.id for e in kept}
    kernels = {k["id"]: k for k in report["kernels"]}
    out = {"release": release_of(tree).release, "spec": spec.name, "arch": spec.arch, "fused": 0, "picked": 0,
           "never": 0, "flagged": 0, "never_bytes": 0, "never_s": 0.0,
           "all_bytes": sum((k.get("resources") or {}).get("code_bytes") or 0 for k in report["kernels"]),
           "all_s": sum(k["compile_s"] or 0 for k in report["kernels"])}
    for e in entries:
        if e.config.family != FUSED_FAMILY:
            continue
        out["fused"] += 1
        if e.id in kept_ids:
            out["picked"] += 1
            continue
        k = kernels[e.id]
        out["never"] += 1
        out["flagged"] += not k["dispatched"]
        out["never_bytes"] += (k.get("resources") or {}).get("code_bytes") or 0
        out["never_s"] += k["compile_s"] or 0
    assert out["never"] == record.kernels_left_out
    return out


def _pct(n: float, total: float) -> str:
    return f"{100 * n / max(1, total):.0f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pairs", nargs="+", metavar="TREE=REPORT.json")
    ap.add_argument("--json", type=Path, help="also write the rows here (build_cost_table.py --reach)")
    a = ap.parse_args()
    pairs = [arg.split("=", 1) for arg in a.pairs]
    if any(len(p) != 2 for p in pairs):
        ap.error("each argument is TREE=REPORT.json")
    rows = [reach(Path(tree).resolve(), json.loads(Path(rep).read_text(encoding="utf-8"))) for tree, rep in pairs]
    print("| release | target (spec) | fused kernels | op table can pick | never picks (flagged `not dispatched`) "
          "| their code | their Σ compile_s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['release']} | {r['arch']} (`{r['spec']}`) | {r['fused']} | {r['picked']} | "
              f"{r['never']} ({r['flagged']}) | {r['never_bytes'] / 1e6:.1f} of {r['all_bytes'] / 1e6:.1f} MB "
              f"({_pct(r['never_bytes'], r['all_bytes'])}) | {r['never_s']:,.0f} of {r['all_s']:,.0f} s "
              f"({_pct(r['never_s'], r['all_s'])}) |")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
