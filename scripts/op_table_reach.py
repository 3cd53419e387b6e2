#!/usr/bin/env python3
"""Which fused-backward kernels the backward op's dispatch table can select (issue 24, item 6):
the proof from the dispatch tables themselves, next to precompile's `not dispatched` flag (which
follows the spec's rows.split_backward rule only).

    python scripts/op_table_reach.py TREE=REPORT.json [TREE=REPORT.json ...] [--json OUT]

For each applied tree: the tree's own generator is run into a throwaway build dir (as `plan`
does); its op table for the backward (`flash/iface.op_attn_bwd.cc`: one entry per functional,
numbered by the generated `godel_number`) is read entry by entry: a trivial entry names one
backend, a tuned entry's lookup table (`flash/optune.op_attn_bwd/*.cc`) lists the backend per
sequence-length bin. A functional whose entry never names the fused backend (`kShim_BwdKernelFuse`,
index 1 in the tables) never launches its fused kernels through the table. Each planned
`bwd_kernel_fuse` kernel is placed on its functional from its Triton signature, and joined with
the precompile --json REPORT of the same tree for its code bytes and compile time. Markdown on
stdout; the trees are not written to. Only what the op table selects is proven here: callers
that force a backend (`attn_options.force_backend_index`) or call the v2 `attn_bwd_fused` reach
every fused kernel (docs/build.md). A release without an op database (0.10b) counts every fused
kernel as selectable: PyTorch calls its v2 `attn_bwd_fused` directly.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from codegen.apply.applied_spec import resolve_spec  # noqa: E402
from codegen.plan.kernel_list import generate_kernel_list, kernel_arg_names  # noqa: E402
from codegen.plan.tree import release_of  # noqa: E402
from codegen.upstream.knobs import ENABLE_FP32_ENV  # noqa: E402

FUSED = "BwdKernelFuse"
FUSED_INDEX = "1"  # the fused backend's index in the tuned lookup tables (split 0, fused 1, aiter 2)
_FIELD_RE = re.compile(r"if \(args\.(\w+)(?:->dtype\(\))? == (?:DType::)?(\w+)\) number = (\d+)")
_MULT_RE = re.compile(r"sum \+= number \* (\d+)")
_ENTRY_RE = re.compile(r"&(\S+?),?\n")
_LUT_VALUE_RE = re.compile(r"(?<![\w\[])(-?\d+)(?=[,}])")
# a kernel signature's spelling of the op's field values
_DTYPE = {"fp16": "kFloat16", "bf16": "kBFloat16", "fp32": "kFloat32"}
_BOOL = {"True": "true", "False": "false", "1": "true", "0": "false"}


@dataclass(frozen=True)
class OpTable:
    """The backward op table of one GPU: the functional's fields (name, value -> digit, weight) and,
    per functional number, whether any entry can name the fused backend."""

    fields: tuple[tuple[str, dict[str, int], int], ...]
    fused: tuple[bool, ...]

    def number(self, values: dict[str, str]) -> int:
        return sum(digits[values[name]] * weight for name, digits, weight in self.fields)


def read_op_table(flash: Path) -> OpTable | None:
    """None for a tree whose generator writes no backward op (its fused kernels count as selectable)."""
    if not (flash / "iface.op_attn_bwd.cc").is_file():
        return None
    iface = (flash / "iface.op_attn_bwd.cc").read_text(encoding="utf-8")
    body = iface[iface.index("godel_number() const"):]
    body = body[:body.index("\n}\n")]
    fields = []
    for block in body.split("int64_t number = -1;")[1:]:
        found = _FIELD_RE.findall(block)
        fields.append((found[0][0], {v: int(n) for _, v, n in found}, int(_MULT_RE.search(block).group(1))))
    table = iface[iface.index("optune_table[]"):]
    entries = _ENTRY_RE.findall(table[:table.index("};")])
    tuned = {}
    for path in sorted((flash / "optune.op_attn_bwd").glob("*.cc")):
        text = path.read_text(encoding="utf-8")
        m = re.search(r"#define CURRENT_ENTRY_PUBLIC (\w+)", text)
        if m:
            lut = text[text.index("lut["):text.index("End of GPU")].split("=", 1)[1]
            tuned[m.group(1)] = FUSED_INDEX in set(_LUT_VALUE_RE.findall(lut))
    fused = tuple(FUSED in e if "Trivial_" in e else tuned[e.split("::")[-1]] for e in entries)
    return OpTable(tuple(fields), fused)


def reach(tree: Path, report: dict) -> dict:
    loaded = resolve_spec(tree, None)
    spec = loaded.spec
    env = {ENABLE_FP32_ENV: "1" if "fp32" in spec.dtypes else "0"}
    with tempfile.TemporaryDirectory(prefix="mi100-op-reach-") as tmp:
        build = Path(tmp) / "build"
        entries = generate_kernel_list(tree, list(spec.gpus), sys.executable, arch=spec.arch, env=env,
                                       keep_build_dir=build)
        # no op database (0.10b): PyTorch's v2 path calls attn_bwd_fused itself; as precompile's flag
        table = read_op_table(build / "flash") if release_of(tree).adapter.op_db is not None else None
    kernels = {k["id"]: k for k in report["kernels"]}
    out = {"release": release_of(tree).release, "spec": spec.name, "arch": spec.arch, "fused": 0, "picked": 0,
           "never": 0, "flagged": 0, "never_bytes": 0, "never_s": 0.0,
           "all_bytes": sum((k.get("resources") or {}).get("code_bytes") or 0 for k in report["kernels"]),
           "all_s": sum(k["compile_s"] or 0 for k in report["kernels"])}
    for e in entries:
        if e.config.family != "bwd_kernel_fuse":
            continue
        names = kernel_arg_names(str(tree / e.source), e.kernel_name)
        sig = dict(zip(names, (v.strip() for v in e.signature.split(","))))
        values = {name: _DTYPE[e.config.dtype] if name == "Q" else
                  _BOOL.get(sig[name], sig[name]) if "false" in digits else sig[name]
                  for name, digits, _ in (table.fields if table else ())}
        k = kernels[e.id]
        out["fused"] += 1
        if table is None or table.fused[table.number(values)]:
            out["picked"] += 1
            continue
        out["never"] += 1
        out["flagged"] += not k["dispatched"]
        out["never_bytes"] += (k.get("resources") or {}).get("code_bytes") or 0
        out["never_s"] += k["compile_s"] or 0
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
