#!/usr/bin/env python3
"""The bundle table of docs/measurements.md from `mi100-codegen bundle build --json` outputs.

    python scripts/bundle_table.py OUT.json [OUT.json ...]

One row per bundle: the file's name and size, the build's seconds (sysroot, build, check), the
kernels packed and how this run got them (compiled now / from the kernel cache / images taken with
--images), the Triton that compiled them, the emulated dispatch's figures, the tuning-row verdict,
the negative controls, the kernels left out as no dispatch table selects them (`--kernels
dispatched`) with the forced-fused-backend check, and the library's GLIBC/GLIBCXX needs. It reads only the JSON each build
printed (its manifest is the bundle's own); nothing is recomputed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HEAD = ("| bundle | MB | build s | check s | kernels packed | this run | Triton | dispatch (cases, code objects, "
        "launches) | tuning rows | controls | left out (forcing the fused backend) | needs |")


def row(out: dict) -> str:
    m, sec = out["manifest"], out["seconds"]
    v, bw, k = m.get("verified", {}), m.get("built_with", {}), m.get("kernels", {})
    d = v.get("dispatch") or {}
    rows = v.get("tuning_rows") or {}
    controls = v.get("negative_controls") or []
    path = Path(out["bundle"]) if out.get("bundle") else None
    size = f"{path.stat().st_size / 1e6:.1f}" if path and path.is_file() else "–"
    got = (f"{bw.get('kernels_compiled', 0)} compiled, {bw.get('kernels_cached', 0)} cached"
           if bw.get("kernels_compiled") or bw.get("kernels_cached") else
           "images taken (--images)" if str(bw.get("images", "")).startswith("taken") else "none (build folder up to date)")
    detail = rows.get("detail", "–").split(";")[0]
    return (f"| `{path.name if path else m.get('release')}` | {size} | {sec.get('build', '–')} | {sec.get('check', '–')} | "
            f"{k.get('kernels_packed', '–')} of {k.get('kernels_referenced', '–')} | {got} | "
            f"{(bw.get('toolchain') or {}).get('triton', '–')} | {d.get('cases_ok')}/{d.get('cases')}, "
            f"{d.get('code_objects_loaded')}, {d.get('launches')} | {'ok' if rows.get('ok') else 'FAIL'}: {detail} | "
            f"{sum(1 for c in controls if c.get('ok'))} of {len(controls)} fail as they must | {_left_out(m)} | "
            f"{m['library']['needs'].get('glibc')}, {m['library']['needs'].get('glibcxx')} |")


def _left_out(m: dict) -> str:
    reach = (m.get("built_with") or {}).get("reach")
    if not reach:
        return f"none (`--kernels {(m.get('built_with') or {}).get('kernels', 'all')}`)"
    forced = (m.get("verified") or {}).get("forced_fused")
    verdict = "–" if not forced else ("ok" if forced.get("ok") else "FAIL")
    return f"{reach.get('kernels_left_out', 0)} of {reach.get('fused_kernels', 0)} fused ({verdict})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outputs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    print(HEAD)
    print("|" + "---|" * (HEAD.count("|") - 1))
    for p in args.outputs:
        try:
            print(row(json.loads(p.read_text())))
        except (OSError, ValueError, KeyError) as exc:
            print(f"{p}: not a `bundle build --json` output ({exc})", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
