"""`mi100-codegen torch status|install|restore|rebuild-recipe`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from codegen.cli import SpecOpt, add_group
from codegen.core import ui
from codegen.core.errors import EXIT_UPSTREAM, UserError

stderr = ui.console()

torch_app = typer.Typer(
    help="Drop our AOTriton build into an installed PyTorch (checks, backup, restore), "
    "or print the from-source PyTorch rebuild recipe.",
    no_args_is_help=True,
)

TorchDirOpt = typer.Option(None, "--torch-dir", help="The torch package folder (default: the one this Python imports; not imported).")
BackupOpt = typer.Option(None, "--backup-dir", help="Backup folder (default: <site-packages>/torch.mi100-codegen-backup).")
CardOpt = typer.Option(None, "--arch", help="The card's arch (default: the GPU found in the KFD topology, else by torch).")
ReplaceShippedOpt = typer.Option(None, "--replace-shipped", metavar="ARCH", help="Replace the kernels torch's "
                                 "aotriton.images/amd-ARCH/ already holds (refused otherwise; backed up, put back by restore).")
SysfsOpt = typer.Option(Path("/sys"), "--sysfs",
                        help="The sysfs root the KFD topology is read from (tests give a fake machine's).")


def _arch(arch: Optional[str], spec: Optional[Path]) -> str:
    if arch:
        return arch
    # CLI start-up: the spec loader loads when a command needs the spec
    from codegen.apply.applied_spec import resolve_spec

    loaded = resolve_spec(None, spec)
    ui.warn(loaded.warnings)
    return loaded.spec.arch


@torch_app.command("status")
def status(
    torch_dir: Optional[Path] = TorchDirOpt,
    backup_dir: Optional[Path] = BackupOpt,
    arch: Optional[str] = CardOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
    sysfs: Path = SysfsOpt,
) -> None:
    """What this machine has for a drop-in: Python, card, HSA override, torch (or none), what is missing, next step.

    The card and the spec that serves it; the installed torch, its HIP, the AOTriton file it links,
    its images, whether ours is in. Without torch in this Python the rest is still shown, and the
    exit code is 3 (a missing environment)."""
    # CLI start-up: the status stage loads when the command runs
    from codegen.ship.status import StatusOptions, format_status, read_status

    s = read_status(StatusOptions(torch_dir, backup_dir, arch, sysfs))
    if as_json:
        sys.stdout.write(json.dumps(s.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(format_status(s))
    if not s.torch_found:
        raise typer.Exit(EXIT_UPSTREAM)


@torch_app.command("install")
def install(
    prefix: Optional[Path] = typer.Option(None, "--prefix", help="AOTriton install prefix (holds lib/libaotriton_v2.so.X.Y.Z and lib/aotriton.images/)."),
    bundle: Optional[str] = typer.Option(None, "--bundle", metavar="FILE", help="A bundle file (made by bundle build) instead of a prefix; "
                                         "`auto`: detect the card and torch, take the matching bundle from the index or build it here, check, install, validate."),
    index: Optional[str] = typer.Option(None, "--index", metavar="URL", help="--bundle auto: the bundle index (a folder, or an https URL of "
                                        "a folder or of its index.json; default: $MI100_CODEGEN_INDEX, else the published one)."),
    build_locally: bool = typer.Option(False, "--build-locally", help="--bundle auto: build the bundle here even when the index has one."),
    arch: Optional[str] = typer.Option(None, "--arch", help="GPU arch whose images must be present (default: the spec's, gfx908; a bundle's own; "
                                       "--bundle auto: the card found)."),
    spec: Optional[Path] = SpecOpt,
    torch_dir: Optional[Path] = TorchDirOpt,
    backup_dir: Optional[Path] = BackupOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Check and list what would change; change nothing (--bundle auto: print the plan only)."),
    replace_shipped: Optional[str] = ReplaceShippedOpt,
    sysfs: Path = SysfsOpt,
) -> None:
    """Install our build under the file name torch links, plus aotriton.images/amd-<arch>/."""
    if bundle == "auto":
        if prefix is not None:
            raise UserError("give one of --prefix PREFIX or --bundle auto")
        # CLI start-up: the owner's command loads the index, the fetcher, check, build and install when it runs
        from codegen.ship.owner import OwnerOptions, install_auto

        install_auto(OwnerOptions(torch_dir, backup_dir, arch, spec, index, build_locally, dry_run, sysfs=sysfs,
                                  validator=_validate_child, replace_shipped=replace_shipped), stderr)
        return
    if index is not None or build_locally:
        raise UserError("--index and --build-locally go with --bundle auto")
    # CLI start-up: the install stage loads when the command runs
    from codegen.formats.bundle_zip import open_bundle
    from codegen.ship.install import backup_location, bundle_prefix, install_into
    from codegen.ship.layout import inspect_prefix, inspect_torch

    if (prefix is None) == (bundle is None):
        raise UserError("give one of --prefix PREFIX or --bundle FILE (or --bundle auto)")
    t = inspect_torch(torch_dir)
    bdir = backup_location(t, backup_dir)
    if bundle is not None:
        res = install_into(t, bdir, lambda work: bundle_prefix(open_bundle(Path(bundle)), work / "bundle", t, arch), dry_run,
                           replace_shipped=replace_shipped)
    else:
        res = install_into(t, bdir, lambda work: (inspect_prefix(prefix), _arch(arch, spec), None), dry_run,
                           replace_shipped=replace_shipped)
    _say_installed(res, t)


def _validate_child(run) -> int:
    """`validate` in a fresh process (a fresh `import torch`) after `--bundle auto` installed:
    the owner's command (codegen.ship.owner) gets this function, so ship starts no CLI command."""
    import subprocess  # CLI start-up: only --bundle auto validates

    from codegen.core import processes

    cmd = [sys.executable, "-m", "codegen.cli", "validate", f"--spec={run.spec}", "--no-perf",
           "--json", str(run.out / "validate.json"), "--md", str(run.out / "validate.md")]
    return processes.run(cmd, timeout=run.timeout_s, env=run.env, stdin=subprocess.DEVNULL).returncode


def _say_installed(res, t) -> None:
    """What `install_into` did, as the command prints it."""
    plan = res.plan
    for line in res.recovered.said:
        stderr.print(ui.printable(line), markup=False)
    if plan is None:
        stderr.print(ui.printable(f"dry run: {res.unfinished}; nothing changed"), markup=False)
        return
    for n in plan.notes:
        stderr.print(ui.printable(n), style="yellow", markup=False)
    for act in plan.actions:
        stderr.print(ui.printable(f"{act.kind:8} {act.rel}"), markup=False)
    if plan.identical:
        stderr.print(f"[green]identical:[/] our build is already installed in {escape(ui.printable(str(t.root)))}")
        return
    if res.dry_run:
        stderr.print(ui.printable(f"dry run: would {plan.summary()} in {t.root}; nothing changed"), markup=False)
        return
    record = plan.bundle
    what = f"bundle {record.file} ({record.label})" if record else plan.prefix.lib.name
    stderr.print("[green]installed:[/] " + escape(ui.printable(
        f"{what} as lib/{t.aot_needed.name} + images for {plan.arch} into {t.root} ({plan.summary()}); "
        f"backup {res.backup_dir}")))
    stderr.print("next: mi100-codegen validate --json report.json --md report.md")

@torch_app.command("restore")
def restore_cmd(
    torch_dir: Optional[Path] = TorchDirOpt,
    backup_dir: Optional[Path] = BackupOpt,
    force: bool = typer.Option(False, "--force", help="Restore even if files install added or replaced were changed since "
                               "(never a backup of another torch, never needed after an interrupted install or restore)."),
) -> None:
    """Put the original files back (byte-identical) and remove what install added."""
    # CLI start-up: the install stage loads when the command runs
    from codegen.ship.install import backup_location, restore_torch
    from codegen.ship.layout import inspect_torch

    t = inspect_torch(torch_dir)
    res = restore_torch(t, backup_location(t, backup_dir), force=force)
    for line in res.recovered.said:
        stderr.print(ui.printable(line), markup=False)
    if res.manifest is not None:
        stderr.print(f"[green]restored:[/] {len(res.manifest.entries)} files in {escape(ui.printable(str(t.root)))}; "
                     "backup removed")

@torch_app.command("rebuild-recipe")
def rebuild_recipe(
    prefix: Optional[Path] = typer.Option(None, "--prefix", help="AOTriton install prefix to build against."),
    release: Optional[str] = typer.Option(None, "--release", help="AOTriton tag (e.g. 0.11b) when no prefix exists yet."),
    arch: Optional[str] = typer.Option(None, "--arch", help="PYTORCH_ROCM_ARCH (default: the spec's arch)."),
    spec: Optional[Path] = SpecOpt,
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="MAX_JOBS for the build."),
    run: bool = typer.Option(False, "--run", help="Run it (resumable) instead of printing it."),
    workdir: Path = typer.Option(Path("pytorch-build"), "--workdir", help="Where --run clones and builds."),
    torch_dir: Optional[Path] = TorchDirOpt,
) -> None:
    """Print (or --run) the PyTorch from-source build against our install prefix.

    Without --prefix and --release: for the release line the installed ROCm torch links."""
    # CLI start-up: the recipe stage loads when the command runs
    from codegen.ship.layout import inspect_torch
    from codegen.ship.recipe import plan_recipe, release_for_installed_torch, render_recipe, run_recipe

    prefer = None
    if prefix is None and release is None:
        t = inspect_torch(torch_dir)
        release, prefer = release_for_installed_torch(t), t.feature_release
    elif torch_dir is not None:
        prefer = inspect_torch(torch_dir).feature_release
    r = plan_recipe(prefix, release, _arch(arch, spec), jobs, prefer_torch_line=prefer)
    if not run:
        sys.stdout.write(render_recipe(r))
        return
    run_recipe(r, workdir, log=lambda m: stderr.print(m, markup=False))
    stderr.print(f"[green]built and installed:[/] torch {r.torch_line} against {r.prefix}")


def register(app: typer.Typer, guarded) -> None:
    add_group(app, torch_app, "torch", guarded)
