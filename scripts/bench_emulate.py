"""Speed of executed dispatch (codegen.ship.execute): the library's forward and backward run on
the emulated GPU, per case: wall time, emulated instructions and instructions per second, and
per kernel. docs/measurements.md holds dated figures (say where they ran and under what load).

    PYTHONPATH=$PWD python scripts/bench_emulate.py BUNDLE [--case GLOB]... [--cold] [--json FILE]

Without --case: one case, the fp16 forward and backward of the spec's largest head dim, no
variant (the issue's "d64 fp16 fwd+bwd" target). `--case '*'` runs the whole executed matrix.
The emulator compiles each new instruction once and keeps it in the user cache across runs
(codegen.emulate.icache); `--cold` leaves that cache out (every instruction compiled again, as on a
machine's first run). Within a run the first cases pay for compiling: the table lists cases in
the order they ran."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

from codegen.core.errors import CodegenError
from codegen.ship.execute import execute_bundle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--case", action="append", default=[], metavar="GLOB", help="cases to run (default: one)")
    ap.add_argument("--cold", action="store_true", help="without the emulator's cache of compiled instructions")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args(argv)

    def pick(cases):
        if args.case:
            return [c for c in cases if any(fnmatch.fnmatchcase(c.name, g) for g in args.case)]
        top = max(c.head_dim for c in cases)
        return [c for c in cases if c.dtype == "fp16" and c.head_dim == top and not (c.causal or c.bias or c.dropout)][:1]

    try:
        rep = execute_bundle(args.bundle, pick=pick, icache=not args.cold, progress=lambda s: print(s, file=sys.stderr))
    except CodegenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        args.json.write_text(json.dumps(rep.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    print(f"{rep.label}; {len(rep.cases)} case(s), {rep.seconds:.1f} s in all, "
          f"instruction cache {'off' if args.cold else 'on'}\n")
    print(f"{'case':48} {'ok':>4} {'wall s':>8} {'instructions':>13} {'emulated s':>11} {'instr/s':>9}")
    for c in rep.cases:
        emu = sum(k.seconds for k in c.kernels)
        rate = f"{c.instructions / emu:,.0f}" if emu else "-"
        print(f"{c.case:48} {'yes' if c.ok else 'NO':>4} {c.seconds:>8.1f} {c.instructions:>13,} {emu:>11.1f} {rate:>9}")
    print(f"\n{'kernel (phase)':80} {'launches':>8} {'waves':>7} {'instructions':>13} {'s':>7} {'instr/s':>9}")
    for c in rep.cases:
        for k in c.kernels:
            name = k.kernel.rsplit("/", 1)[-1].split("--Arch_", 1)[0][:72]
            rate = f"{k.instructions / k.seconds:,.0f}" if k.seconds else "-"
            print(f"{name + ' (' + k.phase + ')':80} {k.launches:>8} {k.waves:>7} {k.instructions:>13,} "
                  f"{k.seconds:>7.1f} {rate:>9}")
    return 0 if rep.ok else 3


if __name__ == "__main__":
    sys.exit(main())
