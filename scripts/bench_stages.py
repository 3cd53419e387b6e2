#!/usr/bin/env python3
"""Wall time of every CPU stage of mi100-codegen, per supported AOTriton release.

For each release and each run: a fresh copy of the pristine release tree, then, each as its own
process (so start-up is included): `--help`, `spec check`, `render`, the first `apply`, the second
`apply` (all identical), `revert`, `plan --json` (after re-applying, untimed) and a fixed 8-kernel
`precompile --sample 8 --no-cache`. The table holds the median of --runs runs (default 3); progress
goes to stderr, the Markdown table to stdout (and to --out). precompile compiles with the build
venv of the spec's Triton (docs/toolchain.md): when it is not cached yet, the first run creates it
(minutes, pip), which the median of three runs leaves out; create it beforehand for --runs 1.

Trees come from AOTRITON_GIT (a git dir of ROCm/aotriton, `git archive TAG`) or the shared release
archive `shared/upstream/aotriton-releases.tar.xz` of the nearest ancestor folder (or --archive;
a snapshot of main, e.g. 0.14.0-dev, from `aotriton-main-<yyyymmdd>.tar.xz` beside it);
every requested release is extracted once, then copied for each run.

    scripts/bench_stages.py                                 # all supported releases, 3 runs
    scripts/bench_stages.py --releases 0.11b,0.12b --runs 1 --out bench.md
    scripts/bench_stages.py --dry-run                       # what would run; runs nothing
    scripts/bench_stages.py --stages help,spec-check        # tree-free stages only (no extraction)

`--cli` picks the command measured. The default runs this checkout's `codegen.cli:main` the way
the `mi100-codegen` console script that pip installs runs it (`python -c`, ENTRY_POINT below),
which is what a user types; `python -m codegen.cli` would add runpy's ~10 ms. `--cli
mi100-codegen` measures an installed entry point. If `plan --json` reports how its time
splits between upstream's generator and our own code, the split is printed under the table.

`--baseline REF` (a git ref of this repository, or a folder holding another checkout) measures
that code side by side with this checkout in the same run: every stage runs once for each, on
its own fresh tree copy, alternating which goes first, so both see the same machine. Cells then
read `before → after (ratio)`. Each checkout's Python files are byte-compiled before timing, as
pip does at install, so no run pays for compiling them. The `bar` column holds issue 12's
targets; a median over its bar is marked ✗.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARCHIVE_REL = Path("shared", "upstream", "aotriton-releases.tar.xz")
SAMPLE = 8
# what pip's console script for `mi100-codegen = codegen.cli:main` does
ENTRY_POINT = "import sys; from codegen.cli import main; sys.argv[0] = 'mi100-codegen'; sys.exit(main())"
# issue 12's targets, seconds (median, idle 2-core machine); stages without one have none
BARS = {"help": 0.3, "spec-check": 0.5, "render": 0.5, "apply": 3.0, "apply-again": 1.0, "revert": 1.0}


@dataclass(frozen=True)
class Stage:
    key: str  # option name for --stages
    label: str  # table row
    argv: tuple[str, ...]  # after the CLI; {tree} {work} are filled in
    needs_tree: bool = True
    needs: str | None = None  # a stage that must have succeeded in this run
    json_out: str | None = None  # file (in {work}) the stage writes JSON to, or 'stdout'


STAGES: tuple[Stage, ...] = (
    Stage("help", "CLI start (`--help`)", ("--help",), needs_tree=False),
    Stage("spec-check", "`spec check`", ("spec", "check"), needs_tree=False),
    Stage("render", "`render`", ("render", "--out", "{work}/overlay"), needs_tree=False),
    Stage("apply", "`apply` (first)", ("apply", "{tree}")),
    Stage("apply-again", "`apply` (again, all identical)", ("apply", "{tree}"), needs="apply"),
    Stage("revert", "`revert`", ("revert", "{tree}"), needs="apply"),
    Stage("plan", "`plan`", ("plan", "{tree}", "--json"), needs="apply", json_out="stdout"),
    Stage("precompile", f"`precompile --sample {SAMPLE}`",
          ("precompile", "{tree}", "--sample", str(SAMPLE), "--no-cache", "--json", "{work}/precompile.json"),
          needs="apply", json_out="{work}/precompile.json"),
)
BY_KEY = {s.key: s for s in STAGES}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def supported_releases() -> tuple[str, ...]:
    sys.path.insert(0, str(REPO))
    from codegen.upstream import SUPPORTED_RELEASES

    return SUPPORTED_RELEASES


def find_archive() -> Path | None:
    for parent in REPO.parents:
        if (parent / ARCHIVE_REL).is_file():
            return parent / ARCHIVE_REL
    return None


class TreeSource:
    """Pristine release trees, extracted once into `cache`."""

    def __init__(self, cache: Path, archive: Path | None, git_dir: str | None):
        self.cache, self.archive, self.git_dir = cache, archive, git_dir

    def describe(self) -> str:
        return f"git archive from {self.git_dir}" if self.git_dir else f"{self.archive}"

    def prepare(self, tags: list[str]) -> None:
        from codegen.upstream import by_release

        todo = [t for t in tags if not (self.cache / f"aotriton-{t}").is_dir()]
        if not todo:
            return
        t0 = time.monotonic()
        snapshots = [t for t in todo if by_release(t).snapshot]
        if self.git_dir:
            for tag in todo:
                dest = self.cache / f"aotriton-{tag}"
                dest.mkdir(parents=True)
                ref = by_release(tag).commit if tag in snapshots else tag
                data = subprocess.run(["git", "-C", self.git_dir, "archive", ref], check=True,
                                      capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(dest)], input=data, check=True)
        else:
            # a snapshot of main is its own archive beside the releases' (aotriton-main-<yyyymmdd>,
            # top folder aotriton-main/): tests/conftest.py reads the same TAGS convention
            jobs = [(self.archive, [f"aotriton-{t}" for t in todo if t not in snapshots], None)]
            jobs += [(self.archive.parent / f"aotriton-main-{by_release(t).date.replace('-', '')}.tar.xz",
                      ["aotriton-main"], t) for t in snapshots]
            for archive, members, rename in jobs:
                if not members:
                    continue
                proc = subprocess.run(["tar", "-xJf", str(archive), "-C", str(self.cache), *members],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"error: cannot extract {', '.join(members)} from {archive}: "
                                     f"{proc.stderr.strip()}")
                if rename is not None:
                    (self.cache / "aotriton-main").rename(self.cache / f"aotriton-{rename}")
        log(f"extracted {', '.join(todo)} in {time.monotonic() - t0:.1f} s")

    def fresh(self, tag: str, dest: Path) -> Path:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(self.cache / f"aotriton-{tag}", dest, symlinks=True)
        return dest


@dataclass(frozen=True)
class Variant:
    """One code base measured: this checkout ('after') or the --baseline ('before')."""

    name: str
    cli: tuple[str, ...]
    cwd: Path
    env: dict


@dataclass
class Result:
    times: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)  # (variant, release, stage) -> s
    failures: dict[tuple[str, str, str], str] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)  # release -> lines


def variant(name: str, cli: list[str], code: Path, root: Path) -> Variant:
    """`cli` run from `code` (a checkout) with that checkout first on PYTHONPATH and a cache of its own."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(code)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["MI100_CODEGEN_CACHE"] = os.environ.get("MI100_CODEGEN_CACHE") or str(root / f"cache-{name}")
    return Variant(name, tuple(cli), code, env)


def byte_compile(code: Path) -> None:
    """Compile a checkout's Python files once, as pip does at install (PYTHONDONTWRITEBYTECODE
    or a fresh clone would otherwise make every timed run compile them)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(code / "codegen")],
                   check=True, stdout=subprocess.DEVNULL)


def baseline_checkout(ref: str, root: Path) -> tuple[Path, str]:
    """(folder holding the baseline code, its description): a folder as given, or `git archive REF`."""
    given = Path(ref)
    if (given / "codegen" / "cli.py").is_file():
        return given.resolve(), str(given)
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if rev.returncode != 0:
        raise SystemExit(f"error: --baseline {ref}: neither a checkout folder nor a commit of {REPO}")
    dest = root / "baseline"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    data = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=data, check=True)
    return dest, f"commit {rev.stdout.strip()}"


def fill(argv: tuple[str, ...], tree: Path | None, work: Path) -> list[str]:
    return [a.replace("{tree}", str(tree)).replace("{work}", str(work)) for a in argv]


def run_one(v: Variant, stage: Stage, tree: Path | None, work: Path) -> tuple[int, float, str, str]:
    argv = list(v.cli) + fill(stage.argv, tree, work)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=v.cwd, env=v.env, capture_output=True, text=True)
    return proc.returncode, time.monotonic() - t0, proc.stdout, proc.stderr


def plan_notes(plan: dict) -> list[str]:
    out = [f"plan: {plan.get('total', '?')} kernels for {plan.get('gpu', '?')}, head dims "
           f"{sorted(k for k in plan.get('by_head_dim', {}) if k != 'none')}"]
    split = {}
    for k, v in plan.items():  # whatever timing plan reports (e.g. generator vs ours)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                k.endswith("_s") or "time" in k or "second" in k):
            split[k] = v
        elif isinstance(v, dict) and ("tim" in k or k.endswith("_s")):
            split.update({f"{k}.{kk}": vv for kk, vv in v.items() if isinstance(vv, (int, float))})
    if split:
        out.append("plan time split: " + ", ".join(f"{k} {v:.2f} s" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in sorted(split.items())))
    else:
        out.append("plan time split: not reported by `plan --json`")
    return out


def precompile_notes(report: dict) -> list[str]:
    t = report.get("totals", {})
    return [f"precompile sample: {t.get('kernels', '?')} kernels, {t.get('failed', '?')} failed, "
            f"{t.get('spilling', '?')} spilling, mean compile {t.get('mean_compile_s', '?')} s"]


def bench(args, variants: list[Variant], stages: list[Stage], releases: list[str],
          source: TreeSource | None, root: Path) -> Result:
    res = Result()
    if source is not None:
        source.prepare(releases)
    for rel in releases:
        for run in range(args.runs):
            # alternate which code base goes first, so neither always runs on a warmer machine
            order = variants if run % 2 == 0 else variants[::-1]
            works, trees, ok = {}, {}, {v.name: set() for v in variants}
            for v in variants:
                works[v.name] = work = root / f"{rel}-run{run + 1}" / v.name
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                trees[v.name] = source.fresh(rel, work / f"aotriton-{rel}") if source is not None else None
            for st in stages:
                for v in order:
                    bench_one(res, v, st, stages, rel, run, args.runs, works[v.name], trees[v.name], ok[v.name],
                              label=f"{v.name} " if len(variants) > 1 else "")
            if not args.keep:
                shutil.rmtree(root / f"{rel}-run{run + 1}", ignore_errors=True)
    return res


def bench_one(res: Result, v: Variant, st: Stage, stages: list[Stage], rel: str, run: int, runs: int,
              work: Path, tree: Path | None, ok: set[str], label: str) -> None:
    key = (v.name, rel, st.key)
    tag = f"[{rel} run {run + 1}/{runs}] {label}{st.key}"
    if st.needs and st.needs not in ok and st.needs in {s.key for s in stages}:
        res.failures[key] = f"skipped ({st.needs} failed)"
        log(f"{tag}: skipped ({st.needs} failed)")
        return
    if st.key in ("plan", "precompile") and "revert" in ok:
        rc, _, _, err = run_one(v, BY_KEY["apply"], tree, work)  # untimed re-apply
        if rc != 0:
            res.failures[key] = f"re-apply failed (exit {rc})"
            log(f"{tag}: re-apply failed (exit {rc}): {err.strip()[-300:]}")
            return
        ok.discard("revert")
    log(f"{tag} ...")
    rc, took, out, err = run_one(v, st, tree, work)
    if rc != 0:
        res.failures[key] = f"exit {rc}"
        log(f"{tag}: exit {rc} after {took:.1f} s: {err.strip()[-500:]}")
        return
    ok.add(st.key)
    res.times.setdefault(key, []).append(took)
    log(f"{tag}: {took:.2f} s")
    if run == 0 and st.json_out:
        try:
            data = json.loads(out) if st.json_out == "stdout" else \
                json.loads(Path(fill((st.json_out,), tree, work)[0]).read_text())
        except (OSError, ValueError) as exc:
            notes = [f"{st.key}: no JSON report ({exc})"]
        else:
            notes = plan_notes(data) if st.key == "plan" else precompile_notes(data)
        res.notes.setdefault(rel, []).extend(f"{label}{n}" for n in notes)


def describe(cli: tuple[str, ...]) -> str:
    return "mi100-codegen (this checkout, as the console script runs it)" if cli[1:] == ("-c", ENTRY_POINT) \
        else shlex.join(cli)


def _median(res: Result, key: tuple[str, str, str], runs: int) -> tuple[float | None, str]:
    """(median, its text) of one cell; a failure's text when no run succeeded."""
    ts = res.times.get(key)
    if not ts:
        return None, res.failures.get(key, "–")
    m = statistics.median(ts)
    return m, f"{m:.2f}" + ("" if len(ts) == runs else f" ({len(ts)}/{runs} ok)")


def table(res: Result, stages: list[Stage], releases: list[str], args, variants: list[Variant],
          source_desc: str, baseline_desc: str | None) -> str:
    bars = any(st.key in BARS for st in stages)
    head = "| stage | " + " | ".join(releases) + (" | bar |" if bars else " |")
    after = variants[0]
    what = (f"before = {baseline_desc}, after = this checkout, side by side in one run (cells: before → after "
            f"(after/before))" if baseline_desc else f"command `{describe(after.cli)}`")
    lines = [
        f"Median of {args.runs} run(s), wall seconds per process (start-up included); {what}; "
        f"trees: {source_desc}; {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        head,
        "|---|" + "---:|" * (len(releases) + bars),
    ]
    for st in stages:
        bar = BARS.get(st.key)
        cells = []
        for rel in releases:
            m, text = _median(res, (after.name, rel, st.key), args.runs)
            if bar is not None and m is not None and m > bar:
                text += " ✗"
            if baseline_desc:
                b, btext = _median(res, ("before", rel, st.key), args.runs)
                ratio = f" ({m / b:.2f}×)" if m is not None and b else ""
                text = f"{btext} → {text}{ratio}"
            cells.append(text)
        lines.append(f"| {st.label} | " + " | ".join(cells) + (f" | {bar:g} |" if bar is not None else " | |" if bars else " |"))
    notes = [f"- {rel}: {n}" for rel in releases for n in res.notes.get(rel, [])]
    if notes:
        lines += [""] + notes
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--releases", help="comma-separated AOTriton tags (default: every supported release)")
    ap.add_argument("--runs", type=int, default=3, help="runs per release; the table shows the median (default 3)")
    ap.add_argument("--out", type=Path, help="also write the Markdown table here")
    ap.add_argument("--stages", help="comma-separated subset of: " + ", ".join(s.key for s in STAGES))
    ap.add_argument("--cli", help="command to measure (default: this checkout's codegen.cli:main, run as the "
                                  "console script runs it)")
    ap.add_argument("--baseline", metavar="REF",
                    help="also measure this git ref of the repository (or a checkout folder), side by side")
    ap.add_argument("--archive", type=Path, help="release archive (default: shared/upstream/ of the nearest ancestor)")
    ap.add_argument("--workdir", type=Path, help="where trees are extracted and copied (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep each run's tree and outputs")
    ap.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    supported = supported_releases()
    releases = args.releases.split(",") if args.releases else list(supported)
    unknown = [r for r in releases if r not in supported]
    if unknown:
        ap.error(f"not a supported release: {', '.join(unknown)} (supported: {', '.join(supported)})")
    keys = args.stages.split(",") if args.stages else [s.key for s in STAGES]
    bad = [k for k in keys if k not in BY_KEY]
    if bad:
        ap.error(f"unknown stage: {', '.join(bad)} (stages: {', '.join(BY_KEY)})")
    stages = [s for s in STAGES if s.key in keys]
    if args.baseline and args.cli:
        ap.error("--baseline compares two checkouts run as the console script runs them; leave out --cli")
    cli = shlex.split(args.cli) if args.cli else [sys.executable, "-c", ENTRY_POINT]

    need_tree = any(s.needs_tree for s in stages)
    git_dir = os.environ.get("AOTRITON_GIT")
    archive = args.archive or (None if git_dir else find_archive())
    if need_tree and not git_dir and (archive is None or not archive.is_file()):
        print("error: no release trees: set AOTRITON_GIT to a git dir of ROCm/aotriton, or pass --archive "
              "(shared/upstream/aotriton-releases.tar.xz)", file=sys.stderr)
        return 2
    source_desc = (f"git archive of {git_dir}" if git_dir else str(archive)) if need_tree else "none needed"

    if args.dry_run:
        print(f"releases: {', '.join(releases)}; runs: {args.runs}; trees: {source_desc}"
              + (f"; baseline: {args.baseline}" if args.baseline else ""))
        for st in stages:
            print(f"{st.key:12} {shlex.join(cli + fill(st.argv, Path('TREE') if st.needs_tree else None, Path('WORK')))}")
        return 0

    tmp = None
    if args.workdir:
        root = args.workdir
        root.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="mi100-bench-")
        root = Path(tmp.name)
    try:
        source = TreeSource(root / "pristine", archive, git_dir) if need_tree else None
        if source is not None:
            (root / "pristine").mkdir(exist_ok=True)
        variants = [variant("after", cli, REPO, root)]
        baseline_desc = None
        if args.baseline:
            code, baseline_desc = baseline_checkout(args.baseline, root)
            variants.append(variant("before", cli, code, root))
        for v in variants if not args.cli else []:
            byte_compile(v.cwd)
        res = bench(args, variants, stages, releases, source, root)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if tmp is not None and not args.keep:
            tmp.cleanup()
    text = table(res, stages, releases, args, variants, source_desc, baseline_desc)
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if res.failures else 0


if __name__ == "__main__":
    sys.exit(main())
