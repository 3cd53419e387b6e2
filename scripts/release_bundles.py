#!/usr/bin/env python3
"""Build, check and index the release matrix here: the bundles .github/workflows/bundles.yml
publishes (the table: `mi100-codegen bundle matrix`, codegen.ship.matrix), for a list of specs.

    python scripts/release_bundles.py --out dist                  # every card spec (rules/*.yaml)
    python scripts/release_bundles.py rules/examples/smoke.yaml --out dist --only 0.11b-gfx908-hip6
    python scripts/release_bundles.py --list                      # the rows, nothing built

For each row, every step is skipped when it is done already, so an interrupted run goes on where
it stopped when run again:

1. the tree, `WORK/<release>-<arch>/tree`: a pristine tree of the release (codegen.upstream.trees:
   `AOTRITON_SRC`, `AOTRITON_GIT` or the release archive, made whole or not at all); then
   `apply --spec` (a no-op on an applied tree);
2. with `--stage kernels` only `precompile TREE --kernels dispatched`: it fills the kernel cache
   with the bundle's kernels (the workflow's first stage, once per release and arch);
3. `bundle build TREE --hip N --out OUT`, unless OUT holds the bundle, built from this spec (the
   build folder and the kernel cache make an interrupted build go on);
4. `bundle check OUT/FILE`, unless `WORK/<id>.checked` holds the file's sha256;

then `bundle index OUT` (not with `--no-index` or `--stage kernels`). WORK defaults to OUT's
sibling `OUT.work`. Progress and each step's time on stderr; the exit status is the first failing
step's (2: a user error, 3: a failed build or check)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from codegen.core import processes, ui  # noqa: E402
from codegen.core.errors import CodegenError  # noqa: E402
from codegen.formats.bundle_zip import open_bundle  # noqa: E402
from codegen.core.fsutil import sha256_file  # noqa: E402
from codegen.ship.matrix import MatrixRow, release_matrix  # noqa: E402
from codegen.upstream.trees import release_tree  # noqa: E402

err = ui.console()


class StepFailed(Exception):
    def __init__(self, what: str, code: int):
        super().__init__(what)
        self.code = code


def _say(text: str) -> None:
    err.print(ui.printable(text), markup=False)


def _cli(*args: str) -> None:
    """One mi100-codegen command, its output passed through; StepFailed with its exit status."""
    cmd = [sys.executable, "-m", "codegen.cli", *args]
    _say("$ mi100-codegen " + " ".join(args))
    rc = processes.run(cmd, timeout=None).returncode
    if rc:
        raise StepFailed(f"mi100-codegen {args[0]} {args[1] if len(args) > 1 else ''} exited {rc}", rc)


def tree_for(row: MatrixRow, work: Path) -> Path:
    """The applied tree of the row's release and spec (step 1)."""
    home = work / f"{row.release}-{row.arch}"
    tree = home / "tree"
    if not tree.is_dir():
        where = release_tree(row.release, tree)
        _say(f"tree: AOTriton {row.release} from {where}")
    _cli("apply", str(tree), "--spec", str(row.spec))
    return tree


def run_row(row: MatrixRow, out: Path, work: Path, opts: argparse.Namespace) -> str:
    """Steps 1-4 of one row (module doc); what was done, in a few words."""
    tree = tree_for(row, work)
    jobs = ["--jobs", str(opts.jobs)] if opts.jobs else []
    if opts.stage == "kernels":
        _cli("precompile", str(tree), "--kernels", "dispatched", *jobs)
        return "kernels compiled"
    bundle = out / row.bundle
    done, sha = [], None
    if bundle.is_file():
        there = open_bundle(bundle)   # every member verified, the file hashed once
        if there.manifest.spec.sha256 == row.spec_sha256:
            sha = there.sha256
            done.append("bundle there")
        else:
            _say(f"{bundle.name}: built from another spec than {row.spec}: building it again")
            bundle.unlink()
    if sha is None:
        _cli("bundle", "build", str(tree), "--hip", str(row.hip), "--spec", str(row.spec), "--out", str(out),
             *jobs, *(["--aiter-stand-in"] if opts.aiter_stand_in else []))
        done.append("built")
        sha = sha256_file(bundle)
    mark = work / f"{row.id}.checked"
    if mark.is_file() and mark.read_text(encoding="utf-8").strip() == sha:
        done.append("checked before")
    else:
        _cli("bundle", "check", str(bundle))
        mark.write_text(sha + "\n", encoding="utf-8")
        done.append("checked")
    return ", ".join(done)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="*", type=Path, help="specs (default: every card spec of rules/)")
    ap.add_argument("--out", type=Path, default=Path("dist"), help="folder of the bundles and index.json")
    ap.add_argument("--work", type=Path, help="trees and step records (default: OUT.work)")
    ap.add_argument("--only", action="append", default=[], metavar="ID", help="only this row (e.g. 0.11b-gfx908-hip6)")
    ap.add_argument("--stage", choices=("bundles", "kernels"), default="bundles",
                    help="kernels: only fill the kernel cache (precompile)")
    ap.add_argument("--jobs", "-j", type=int, default=0, help="parallel jobs (default: one per CPU)")
    ap.add_argument("--aiter-stand-in", action="store_true", help="offline builds of 0.12b+ (bundle build's option)")
    ap.add_argument("--no-index", action="store_true", help="do not write OUT/index.json")
    ap.add_argument("--list", action="store_true", help="print the rows and exit")
    args = ap.parse_args(argv)
    try:
        rows = release_matrix(args.specs or None)
    except CodegenError as exc:
        _say(f"error: {exc}")
        return exc.exit_code
    unknown = sorted(set(args.only) - {r.id for r in rows})
    if unknown:
        _say(f"error: --only {', '.join(unknown)}: not a row of the matrix ({', '.join(r.id for r in rows)})")
        return 2
    rows = [r for r in rows if not args.only or r.id in args.only]
    if args.list:
        for r in rows:
            print(f"{r.id}\t{r.spec}\ttorch {', '.join(r.torch)}")
        return 0
    out = args.out.resolve()
    work = (args.work or out.parent / f"{out.name}.work").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    for n, row in enumerate(rows, 1):
        start = time.monotonic()
        _say(f"[{n}/{len(rows)}] {row.id} (spec {row.spec_name}, torch {', '.join(row.torch)})")
        try:
            what = run_row(row, out, work, args)
        except StepFailed as exc:
            _say(f"[{n}/{len(rows)}] {row.id}: failed: {exc} (run again to go on from here)")
            return exc.code
        except CodegenError as exc:
            _say(f"[{n}/{len(rows)}] {row.id}: error: {exc}" + (f"\n  hint: {exc.hint}" if exc.hint else ""))
            return exc.exit_code
        _say(f"[{n}/{len(rows)}] {row.id}: {what} in {time.monotonic() - start:.0f} s")
    if args.stage == "bundles" and not args.no_index:
        try:
            _cli("bundle", "index", str(out))
        except StepFailed as exc:
            return exc.code
    _say(f"done: {len(rows)} rows in {time.monotonic() - t0:.0f} s; bundles in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
