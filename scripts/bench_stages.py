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
archive `shared/upstream/aotriton-releases.tar.xz` of the nearest ancestor folder (or --archive);
every requested release is extracted once, then copied for each run.

    scripts/bench_stages.py                                 # all supported releases, 3 runs
    scripts/bench_stages.py --releases 0.11b,0.12b --runs 1 --out bench.md
    scripts/bench_stages.py --dry-run                       # what would run; runs nothing
    scripts/bench_stages.py --stages help,spec-check        # tree-free stages only (no extraction)

`--cli` picks the command measured: default this checkout's `python -m codegen.cli`; e.g.
`--cli mi100-codegen` measures the installed entry point. If `plan --json` reports how its time
splits between upstream's generator and our own code, the split is printed under the table.
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
        todo = [t for t in tags if not (self.cache / f"aotriton-{t}").is_dir()]
        if not todo:
            return
        t0 = time.monotonic()
        if self.git_dir:
            for tag in todo:
                dest = self.cache / f"aotriton-{tag}"
                dest.mkdir(parents=True)
                data = subprocess.run(["git", "-C", self.git_dir, "archive", tag], check=True,
                                      capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(dest)], input=data, check=True)
        else:
            members = [f"aotriton-{t}" for t in todo]
            proc = subprocess.run(["tar", "-xJf", str(self.archive), "-C", str(self.cache), *members],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"error: cannot extract {', '.join(members)} from {self.archive}: "
                                 f"{proc.stderr.strip()}")
        log(f"extracted {', '.join(todo)} in {time.monotonic() - t0:.1f} s")

    def fresh(self, tag: str, dest: Path) -> Path:
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(self.cache / f"aotriton-{tag}", dest, symlinks=True)
        return dest


@dataclass
class Result:
    times: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (release, stage) -> s
    failures: dict[tuple[str, str], str] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)  # release -> lines


def fill(argv: tuple[str, ...], tree: Path | None, work: Path) -> list[str]:
    return [a.replace("{tree}", str(tree)).replace("{work}", str(work)) for a in argv]


def run_one(cli: list[str], stage: Stage, tree: Path | None, work: Path, env: dict) -> tuple[int, float, str, str]:
    argv = cli + fill(stage.argv, tree, work)
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
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


def bench(args, cli: list[str], stages: list[Stage], releases: list[str], source: TreeSource | None,
          root: Path) -> Result:
    res = Result()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("MI100_CODEGEN_CACHE", str(root / "cache"))
    if source is not None:
        source.prepare(releases)
    for rel in releases:
        for run in range(args.runs):
            work = root / f"{rel}-run{run + 1}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            tree = source.fresh(rel, work / f"aotriton-{rel}") if source is not None else None
            ok: set[str] = set()
            for st in stages:
                tag = f"[{rel} run {run + 1}/{args.runs}] {st.key}"
                if st.needs and st.needs not in ok and st.needs in {s.key for s in stages}:
                    res.failures[(rel, st.key)] = f"skipped ({st.needs} failed)"
                    log(f"{tag}: skipped ({st.needs} failed)")
                    continue
                if st.key in ("plan", "precompile") and "revert" in ok:
                    rc, _, _, err = run_one(cli, BY_KEY["apply"], tree, work, env)  # untimed re-apply
                    if rc != 0:
                        res.failures[(rel, st.key)] = f"re-apply failed (exit {rc})"
                        log(f"{tag}: re-apply failed (exit {rc}): {err.strip()[-300:]}")
                        continue
                    ok.discard("revert")
                log(f"{tag} ...")
                rc, took, out, err = run_one(cli, st, tree, work, env)
                if rc != 0:
                    res.failures[(rel, st.key)] = f"exit {rc}"
                    log(f"{tag}: exit {rc} after {took:.1f} s: {err.strip()[-500:]}")
                    continue
                ok.add(st.key)
                res.times.setdefault((rel, st.key), []).append(took)
                log(f"{tag}: {took:.2f} s")
                if run == 0 and st.json_out:
                    try:
                        data = json.loads(out) if st.json_out == "stdout" else \
                            json.loads(Path(fill((st.json_out,), tree, work)[0]).read_text())
                    except (OSError, ValueError) as exc:
                        res.notes.setdefault(rel, []).append(f"{st.key}: no JSON report ({exc})")
                    else:
                        notes = plan_notes(data) if st.key == "plan" else precompile_notes(data)
                        res.notes.setdefault(rel, []).extend(notes)
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    return res


def table(res: Result, stages: list[Stage], releases: list[str], args, cli: list[str], source_desc: str) -> str:
    head = "| stage | " + " | ".join(releases) + " |"
    lines = [
        f"Median of {args.runs} run(s), wall seconds per process (start-up included); "
        f"command `{' '.join(cli)}`; trees: {source_desc}; {os.cpu_count()} CPUs; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        head,
        "|---|" + "---:|" * len(releases),
    ]
    for st in stages:
        cells = []
        for rel in releases:
            ts = res.times.get((rel, st.key))
            if ts and len(ts) == args.runs:
                cells.append(f"{statistics.median(ts):.2f}")
            elif ts:
                cells.append(f"{statistics.median(ts):.2f} ({len(ts)}/{args.runs} ok)")
            else:
                cells.append(res.failures.get((rel, st.key), "–"))
        lines.append(f"| {st.label} | " + " | ".join(cells) + " |")
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
    ap.add_argument("--cli", help="command to measure (default: this checkout's `python -m codegen.cli`)")
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
    cli = shlex.split(args.cli) if args.cli else [sys.executable, "-m", "codegen.cli"]

    need_tree = any(s.needs_tree for s in stages)
    git_dir = os.environ.get("AOTRITON_GIT")
    archive = args.archive or (None if git_dir else find_archive())
    if need_tree and not git_dir and (archive is None or not archive.is_file()):
        print("error: no release trees: set AOTRITON_GIT to a git dir of ROCm/aotriton, or pass --archive "
              "(shared/upstream/aotriton-releases.tar.xz)", file=sys.stderr)
        return 2
    source_desc = (f"git archive of {git_dir}" if git_dir else str(archive)) if need_tree else "none needed"

    if args.dry_run:
        print(f"releases: {', '.join(releases)}; runs: {args.runs}; trees: {source_desc}")
        for st in stages:
            print(f"{st.key:12} {' '.join(cli + fill(st.argv, Path('TREE') if st.needs_tree else None, Path('WORK')))}")
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
        res = bench(args, cli, stages, releases, source, root)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if tmp is not None and not args.keep:
            tmp.cleanup()
    text = table(res, stages, releases, args, cli, source_desc)
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    return 1 if res.failures else 0


if __name__ == "__main__":
    sys.exit(main())
