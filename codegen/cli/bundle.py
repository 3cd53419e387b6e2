"""`mi100-codegen bundle build|check|verify|index|matrix`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from codegen.cli import SpecOpt, add_group

from codegen.cli.build import AITER_HELP, KERNELS_HELP, check_outputs
from codegen.cli.precompile import PYTHON_HELP, TRITON_HELP
from codegen.core import ui
from codegen.core.ui import printable
from codegen.core.preflight import path_option

stderr = ui.console()

bundle_app = typer.Typer(
    help="Drop-in bundles: the runtime built against a HIP major's headers, its images and a "
    "manifest, checked on a CPU (link identity, emulated dispatch); never run on a card.",
    no_args_is_help=True,
)


def _say(msg: str) -> None:
    """One line of progress or of a check: control characters escaped (what a bundle holds, an ELF
    string, a driver's output, is text we did not write)."""
    stderr.print(ui.printable(msg), markup=False)


def _print_check(rep) -> None:
    cover = rep.coverage.claims if rep.coverage is not None else []
    for c in rep.claims + cover + rep.controls + [x for x in (rep.rows_claim, rep.forced) if x]:
        _say(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
    if rep.rows_note:
        _say(f"--   tuning rows: {rep.rows_note}")
    d = rep.dispatch
    if d is not None:
        s = d.summary()
        _say(f"{'ok  ' if d.ok else 'FAIL'} emulated dispatch on {s['target']} (stub HIP {s['hip_major']}): "
             f"check_gpu {s['check_gpu']}, {s['cases_ok']} of {s['cases']} cases, "
             f"{s['code_objects_loaded']} code objects, {s['launches']} launches")
        for c in d.cases:
            if not c.ok:
                _say(f"     {c.case}: fwd {c.fwd} bwd {c.bwd}; {'; '.join(c.violations[:2])}")
        for m in rep.rows:   # the tuning row each tuned launch got
            other = f"  (same config: {', '.join(m.same_config_gpus)})" if m.same_config_gpus else ""
            _say(f"     {'row ' if m.ok else 'FAIL'} {m.case} {m.family}: {m.gpu} row "
                 f"{m.row_id if m.row_id is not None else (m.note or '(unnumbered)')} {m.want or m.got}{other}")
        if d.stderr_tail and not d.ok:
            _say(f"     driver: {d.stderr_tail.splitlines()[-1]}")
    _say(f"label: {rep.as_json()['label']}")


@bundle_app.command("build")
def build(
    aotriton_dir: Path = typer.Argument(..., help="AOTriton tree with the overlay applied."),
    hip: int = typer.Option(..., "--hip", help="HIP major of the torch wheels it is for (6 or 7)."),
    spec: Optional[Path] = SpecOpt,
    out: Path = typer.Option(Path("."), "--out", help="Folder the bundle file is written to."),
    images: Optional[Path] = typer.Option(None, "--images", help="Take the kernel images from this "
                                          "prefix, installed by build from the same tree (else build them)."),
    build_dir: Optional[Path] = typer.Option(None, "--build-dir", help="Build folder (default: "
                                             "build-hip<N> in the tree)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Parallel jobs."),
    python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
    triton_version: Optional[str] = typer.Option(None, "--triton-version", help=TRITON_HELP),
    no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the kernel cache."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", parser=path_option, metavar="PATH",
                                             help="Kernel cache (default: kernels/ under the cache folder)."),
    aiter_stand_in: bool = typer.Option(False, "--aiter-stand-in", help=AITER_HELP),
    kernels: str = typer.Option("dispatched", "--kernels", help=KERNELS_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON on stdout."),
) -> None:
    """Build the runtime against HIP N's headers, check it, write one bundle file."""
    # CLI start-up: the build stage loads when a bundle is built, not for `bundle check`
    from codegen.imagebuild.run import cpu_count
    from codegen.plan.reach import check_mode
    from codegen.ship.bundle import BundleBuildError, KernelBuild, build_bundle

    check_outputs(aotriton_dir, out, build_dir, python, images is not None, "workers", no_cache, cache_dir,
                  prefix_option="--out", default_build=f"build-hip{hip}")
    check_mode(kernels)
    res = build_bundle(aotriton_dir, hip, spec_path=spec, out_dir=out, images=images, build_dir=build_dir,
                       jobs=jobs or cpu_count(), console=stderr, progress=_say,
                       kernel_build=KernelBuild(python, triton_version, no_cache, cache_dir, show_progress=not as_json,
                                                aiter_stand_in=aiter_stand_in, kernels=kernels))
    _print_check(res.check)
    if as_json:
        sys.stdout.write(json.dumps({"bundle": str(res.path) if res.path else None, "seconds": res.seconds,
                                     "manifest": res.manifest.to_json()}, indent=2, sort_keys=True) + "\n")
    if res.path is None:
        raise BundleBuildError("the bundle's checks failed; no file written (see above)")
    stderr.print(f"[green]bundle:[/] {res.path} ({res.path.stat().st_size / 1e6:.1f} MB)")


@bundle_app.command("check")
def check(
    file: Path = typer.Argument(..., help="A bundle file (.mi100-bundle.zip)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    tree: Optional[Path] = typer.Option(None, "--tree", help="The applied tree it was built from: check "
                                        "each tuned launch against its tuning database (default: the rows the "
                                        "bundle carries) and name other GPUs' rows with the same configuration."),
    execute: bool = typer.Option(False, "--execute", help="Also execute the library's forward and backward of "
                                 "every dtype, head dim and variant on an emulated GPU and compare with fp64 "
                                 "(`mi100-codegen emulate BUNDLE --case GLOB` runs chosen cases)."),
) -> None:
    """Integrity, link identity, emulated dispatch, tuning rows and negative controls of a bundle."""
    # CLI start-up: the check loads when a bundle is checked, not for `bundle build`
    from codegen.cli.emulate import print_executed
    from codegen.ship.bundle import BundleBuildError
    from codegen.ship.check import check_bundle

    rep = check_bundle(file, progress=_say, tree=tree, execute=execute)
    if as_json:
        sys.stdout.write(json.dumps(rep.as_json(), indent=2, sort_keys=True) + "\n")
    _print_check(rep)
    if rep.executed is not None:
        print_executed(rep.executed)
    if not rep.ok:
        raise BundleBuildError(f"{file}: the bundle fails its checks (see above)")
    ran = f", kernels executed on an emulated {rep.executed.arch} ISA" if rep.executed is not None else ""
    stderr.print(f"[green]ok:[/] every check passed (CPU-built, dispatch emulated{ran}; never run on a card)")


@bundle_app.command("verify")
def verify(
    file: Path = typer.Argument(..., help="A bundle file (.mi100-bundle.zip)."),
    rebuild: int = typer.Option(..., "--rebuild", min=1, metavar="N",
                                help="Recompile N kernels sampled over families, dtypes and head dims."),
    seed: int = typer.Option(0, "--seed", min=0, help="Which sample: the same seed, the same kernels."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Parallel compiles (default: one per CPU)."),
    python: Optional[str] = typer.Option(None, "--python", help="Compile with this interpreter; its Triton must be "
                                         "the version the bundle records (default: a build venv of it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Rebuild sampled kernels from the release, spec and Triton the bundle records and compare what a GPU loads."""
    # CLI start-up: the verify stage (apply, plan, the compile engine) loads when a bundle is verified
    from codegen.ship.verify import BundleDiffers, VerifyOptions, verify_bundle

    rep = verify_bundle(VerifyOptions(file, rebuild, seed=seed, jobs=jobs or 0, python=python), stderr)
    if as_json:
        sys.stdout.write(json.dumps(rep.as_json(), indent=2, sort_keys=True) + "\n")
    style = {"same": "green", "differs": "bold red", "missing": "bold red", "failed": "yellow"}
    for k in rep.kernels:
        why = f": {', '.join(k.sections)}" if k.sections else (f": {k.detail}" if k.detail else "")
        stderr.print(Text.assemble((f"{k.verdict:8}", style[k.verdict]), f" {k.kernel} ({k.package}){why}"))
    for what, names in (("planned, not in the bundle", rep.not_packed), ("in the bundle, not planned", rep.not_planned)):
        if names:   # names read from the bundle's packages: printed escaped
            stderr.print(Text.assemble((f"{len(names)} kernel(s) {what}:", "bold red"),
                                       " " + printable(", ".join(names[:3])) + (" …" if len(names) > 3 else "")))
    for note in rep.notes:
        stderr.print(f"note: {note}", style="yellow", markup=False)
    counts = ", ".join(f"{rep.count(v)} {v}" for v in ("same", "differs", "missing", "failed"))
    stderr.print(f"{len(rep.kernels)} of {rep.planned} planned kernels rebuilt from AOTriton {rep.release}, spec "
                 f"{rep.spec}, Triton {rep.triton} (seed {rep.seed}): {counts}; the bundle packs {rep.packed}",
                 markup=False)
    if not rep.ok:
        raise BundleDiffers(f"{file}: not what its recorded release, spec and Triton build (see above)")
    stderr.print("[green]ok:[/] the sampled kernels are what the recorded inputs compile to")


@bundle_app.command("index")
def index(
    folder: Path = typer.Argument(..., help="A folder of bundle files (*.mi100-bundle.zip)."),
    as_json: bool = typer.Option(False, "--json", help="Print the index as JSON on stdout."),
) -> None:
    """Write FOLDER/index.json listing the bundles in FOLDER (URLs relative to it: serve the folder as it is)."""
    # CLI start-up: the index module loads when an index is written
    from codegen.models.records import write_json
    from codegen.ship.index import write_index

    dest, idx, changed = write_index(folder, progress=_say)
    if as_json:
        sys.stdout.write(write_json(idx).decode())
    for e in idx.bundles:
        _say(f"  {e.file}: AOTriton {e.release}, {e.target or e.arch}, HIP {e.hip_major}, "
             f"torch {', '.join(e.torch_lines) or '?'}, {e.size / 1e6:.1f} MB")
    stderr.print(f"[green]index:[/] {printable(str(dest))} ({len(idx.bundles)} bundles"
                 f"{'' if changed else ', unchanged'})")


@bundle_app.command("matrix")
def matrix(
    specs: Optional[list[Path]] = typer.Argument(None, help="Specs to build (default: every card spec at the top "
                                                 "of rules/: mi100, mi50, rdna2)."),
    as_json: bool = typer.Option(False, "--json", help="Print the matrix as one line of JSON on stdout "
                                 "(`bundles`: one per bundle, `kernels`: one per release and arch)."),
) -> None:
    """List the bundles a release publishes: each release a torch line links x each card's spec x the HIP majors of its wheels."""
    # CLI start-up: the matrix (spec loading) loads when it is listed
    from codegen.ship.matrix import matrix_json, release_matrix

    rows = release_matrix(specs or None)
    if as_json:
        sys.stdout.write(json.dumps(matrix_json(rows), sort_keys=True, separators=(",", ":")) + "\n")
        return
    for r in rows:
        sys.stdout.write(f"{r.bundle}  spec {r.spec_name}  torch {', '.join(r.torch)}\n")


def register(app: typer.Typer, guarded) -> None:
    add_group(app, bundle_app, "bundle", guarded)
