"""`mi100-codegen build AOTRITON_DIR --prefix PREFIX …` (registered by codegen.cli)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from codegen.cli import SpecOpt
from codegen.core import preflight, ui
from codegen.core.preflight import path_option
from codegen.cli.precompile import PYTHON_HELP, TRITON_HELP

AITER_HELP = ("Offline 0.12b+ builds: an empty repository, tagged as third_party/aiter.txt says, in "
              "place of the ROCm/aiter clone (refused for the archs whose kernels come from aiter).")
KERNELS_HELP = ("'dispatched' (default): leave out the fused backward kernels the backward op table "
                "never selects (PyTorch's calls); 'all': build them too, for callers that force a "
                "backend (see docs/build.md).")


def _print_summary(console: Console, rep) -> None:
    # CLI start-up: `bundle` imports this module too; the build stage loads when a build ran
    from codegen.imagebuild.gpu_check import describe
    from codegen.imagebuild.verify import LIST_LIMIT

    v = rep.verification
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("tree", f"{rep.tree} (AOTriton {rep.release})")
    t.add_row("spec", f"{rep.spec} ({rep.spec_sha256[:12]}…), arch {rep.arch}, mode {rep.mode}")
    t.add_row("library", v.library)
    t.add_row("symbols", ", ".join(f"{k.split('::', 1)[1]} {'ok' if ok else 'MISSING'}"
                                   for k, ok in sorted(v.symbols.items())))
    gc = rep.gpu_check
    if gc is not None:
        t.add_row("gpu check", "check_gpu on a stand-in device: " + ", ".join(
            f"{a} {describe(c)}" for a, c in gc.results.items())
            + (" (ok: only the spec's arch is accepted)" if gc.ok else ""))
    if rep.mode != "noimage":
        t.add_row("images", f"{v.images_dir}: {v.packages} packages")
        t.add_row("kernels", f"{v.kernels_packed} of {v.kernels_referenced} referenced kernels packed"
                             f" (missing {len(v.missing)}, empty {len(v.empty)}"
                             + (f", left out {v.left_out}: no dispatch table selects them" if v.left_out else "")
                             + ")")
        if v.by_kernel:
            t.add_row("by family", ", ".join(f"{k} {n}" for k, n in sorted(v.by_kernel.items())))
    t.add_row("this run", f"{rep.kernels_compiled} kernels compiled"
                          + (f", {rep.kernels_cached} from the kernel cache" if rep.kernels_cached else "")
                          + f" in {rep.build_seconds / 60:.1f} min via {rep.compile_via}"
                          + (f" ({rep.kernels_per_minute} kernels/min)" if rep.kernels_per_minute else "")
                          + (f", configure {rep.configure_seconds:.0f} s" if rep.configured else ", configure skipped (up to date)"))
    t.add_row("wall time", f"{rep.wall_seconds / 60:.1f} min")
    t.add_row("log", rep.log)
    console.print(t)
    for p in v.problems:
        console.print(f"[red]problem:[/] {p}")
    for m in v.missing[:LIST_LIMIT]:
        console.print(f"  missing {m}", markup=False)
    for m in v.empty[:LIST_LIMIT]:
        console.print(f"  empty {m}", markup=False)


def check_outputs(aotriton_dir: Path, prefix: Path, build_dir: Path | None, python: str | None, noimage: bool,
                  compile_via: str, no_cache: bool, cache_dir: Path | None, *, prefix_option: str = "--prefix",
                  default_build: str = "build") -> None:
    """Every output `build` (and `bundle build`: its `--out`, its `build-hip<N>`) writes, checked
    before any work (no venv, no CMake, no image build)."""
    preflight.output_dir(prefix, prefix_option)
    if build_dir is not None or aotriton_dir.is_dir():  # no tree: detect() says so
        preflight.output_dir(build_dir if build_dir is not None else aotriton_dir / default_build, "--build-dir")
    if python is None:
        preflight.cache_folder("toolchain")  # the build venv
    if not noimage and compile_via == "workers" and not no_cache:  # the kernel cache
        # CLI start-up: the kernel cache's module (with its models and the ELF reader) loads
        # when a command that builds checks its outputs, not for `--help` or `bundle check`
        from codegen.compile.cache import check_cache_dir, default_cache_dir

        if cache_dir is not None:
            preflight.output_dir(cache_dir, "--cache-dir")
        else:
            preflight.cache_folder("kernels")  # codegen.compile.cache.default_cache_dir
        check_cache_dir(cache_dir if cache_dir is not None else default_cache_dir())  # trusted storage


def register(app: typer.Typer, guarded) -> None:
    @app.command("build")
    @guarded
    def build(
        aotriton_dir: Path = typer.Argument(..., help="AOTriton source tree with the overlay applied."),
        prefix: Path = typer.Option(..., "--prefix", parser=path_option, metavar="PATH", help="Install prefix (lib/libaotriton_v2.so.*, lib/aotriton.images/)."),
        build_dir: Optional[Path] = typer.Option(None, "--build-dir", parser=path_option, metavar="PATH", help="Build directory (default: AOTRITON_DIR/build)."),
        jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Parallel jobs (default: CPUs available)."),
        noimage: bool = typer.Option(False, "--noimage", help="Build the C++ runtime only (no kernel images, no Triton)."),
        for_tuning: bool = typer.Option(False, "--for-tuning", help="Tuning build: every config of the spec's tuning space."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
        spec: Optional[Path] = SpecOpt,
        python: Optional[str] = typer.Option(None, "--python", help=PYTHON_HELP),
        triton_version: Optional[str] = typer.Option(None, "--triton-version", help=TRITON_HELP),
        python_binding: bool = typer.Option(False, "--python-binding", help="Also build upstream's Python "
                                            "binding (AOTRITON_NO_PYTHON=OFF)."),
        reconfigure: bool = typer.Option(False, "--reconfigure", help="Run CMake even when the configuration is unchanged."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (logs only)."),
        compile_via: str = typer.Option("workers", "--compile-via", help="How kernels compile: 'workers' (warm "
                                        "workers and the kernel cache) or 'upstream' (compile.py per kernel)."),
        no_cache: bool = typer.Option(False, "--no-cache", help="Neither read nor write the kernel cache."),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", parser=path_option, metavar="PATH",
                                                 help="Kernel cache (default: kernels/ under the cache folder)."),
        dask: Optional[str] = typer.Option(None, "--dask", help="Compile on a Dask cluster: its scheduler "
                                           "address, or 'local' (needs the [dask] extra)."),
        aiter_stand_in: bool = typer.Option(False, "--aiter-stand-in", help=AITER_HELP),
        kernels: str = typer.Option("dispatched", "--kernels", help=KERNELS_HELP),
    ) -> None:
        """Configure, build and install AOTriton for the spec's GPU; verify the install.

        Re-running continues an interrupted build. Exit 3 when the build fails or the install is
        incomplete; 2 when the tree or the environment is not ready (the message says what to do)."""
        # CLI start-up: the build stage loads when the command runs, not for its --help
        from codegen.imagebuild.builder import BuildOptions, build_tree
        from codegen.imagebuild.run import cpu_count
        from codegen.imagebuild.verify import VerifyError

        check_outputs(aotriton_dir, prefix, build_dir, python, noimage, compile_via, no_cache, cache_dir)
        console = ui.console()
        rep = build_tree(BuildOptions(aotriton_dir, prefix, build_dir, jobs or cpu_count(), noimage, for_tuning,
                                      python_binding, python, spec, not no_progress and not json_out,
                                      reconfigure, triton_version, compile_via, no_cache, cache_dir, dask,
                                      aiter_stand_in=aiter_stand_in, kernels=kernels),
                         console)
        if json_out:
            sys.stdout.write(json.dumps(rep.as_json(), indent=2, sort_keys=True) + "\n")
        _print_summary(console, rep)
        if rep.verification.problems:
            raise VerifyError(f"the install in {rep.prefix} is incomplete",
                              hint="re-run the same build command (it resumes); the log names failing steps")
        console.print("[green]ok:[/] install verified")
