"""The `mi100-codegen` command line: thin; maps exceptions to exit codes.

Exit codes (an API): 0 ok, 1 drift (--check), 2 user error, 3 upstream/build/GPU failure,
130 interrupted."""

from __future__ import annotations

import functools
import sys
import traceback
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console

from . import __version__
from .errors import EXIT_DRIFT, EXIT_INTERRUPTED, CodegenError

stderr = Console(stderr=True, highlight=False, soft_wrap=True)
stdout = Console(highlight=False, soft_wrap=True)

app = typer.Typer(
    name="mi100-codegen",
    help="Bring AOTriton's FlashAttention to AMD GPUs AMD ships no kernels for (MI100/gfx908 first).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
spec_app = typer.Typer(help="Validate specs and print their JSON Schema.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")

_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mi100-codegen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks of errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    _state["debug"] = debug


def guarded(fn: Callable) -> Callable:
    """Run a command body: user-facing errors become one message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except CodegenError as exc:
            if _state["debug"]:
                traceback.print_exc()
            # messages are plain text: no markup, no emoji codes (`x.yaml:100:7:` is not an emoji)
            stderr.print("[bold red]error:[/]", end=" " if "\n" not in str(exc) else "\n")
            if "\n" not in str(exc):
                stderr.print(str(exc), markup=False, emoji=False)
            else:
                for line in str(exc).splitlines():
                    stderr.print(f"  {line}", markup=False, emoji=False)
            if exc.hint:
                stderr.print("[dim]hint:[/]", end=" ")
                stderr.print(exc.hint, markup=False, emoji=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("[yellow]interrupted[/]")
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def print_warnings(warnings: list[str]) -> None:
    for w in warnings:
        stderr.print(w, markup=False, style="yellow")


SpecOpt = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded rules/mi100.yaml).")


@app.command()
@guarded
def render(
    spec: Optional[Path] = SpecOpt,
    out: Path = typer.Option(Path("aotriton_overlay"), "--out", help="Overlay directory to write."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 with a diff if OUT is stale."),
) -> None:
    """Render the overlay (tuning-space module, anchored edits, tuning rows, MANIFEST.json)."""
    from .overlay_dir import diff_overlay, write_overlay
    from .render import plan_overlay
    from .spec import load_spec

    loaded = load_spec(spec)
    print_warnings(loaded.warnings)
    ov = plan_overlay(loaded)
    if check:
        diff = diff_overlay(ov, out)
        if diff:
            sys.stdout.writelines(diff)
            stderr.print(
                f"[red]drift:[/] {out} is not the render of {loaded.display}; "
                f"run: mi100-codegen render{' --spec ' + str(spec) if spec else ''} --out {out}"
            )
            raise typer.Exit(EXIT_DRIFT)
        stderr.print(f"[green]up to date:[/] {out} ({len(ov.files)} files)")
        return
    changed = write_overlay(ov, out)
    verdict = "wrote" if changed else "identical"
    stderr.print(f"{verdict}: {out} ({len(ov.files)} files, {len(ov.edits)} edits, spec {loaded.display})")


@spec_app.command("check")
@guarded
def spec_check(
    path: Optional[Path] = typer.Argument(None, help="Spec YAML (default: the embedded one)."),
) -> None:
    """Validate a spec; every problem as file:line:col, exit 2 on errors."""
    from .models import expand_space
    from .spec import load_spec

    loaded = load_spec(path)
    print_warnings(loaded.warnings)
    counts = {f: len(c) for f, c in expand_space(loaded.spec).items()}
    summary = ", ".join(f"{f} {n}" for f, n in counts.items())
    stderr.print(f"[green]ok:[/] {loaded.display}: {loaded.spec.arch}, head dims "
                 f"{list(loaded.spec.head_dims)}, candidate configs: {summary}")


@spec_app.command("schema")
@guarded
def spec_schema() -> None:
    """Print the JSON Schema of specs (committed as rules/schema/target-spec.schema.json)."""
    from .spec import spec_json_schema

    sys.stdout.write(spec_json_schema())


def _register_optional() -> None:
    """Commands of later pipeline stages live in their own modules."""
    import importlib

    for mod in (
        "codegen.apply.cli",       # apply, revert
        "codegen.plan.cli",        # plan
        "codegen.precompile.cli",  # precompile, bench
        "codegen.build.cli",       # build
        "codegen.tune.cli",        # tune
        "codegen.torch_integration.cli",  # torch status|install|restore|rebuild-recipe
        "codegen.validate.cli",    # validate
    ):
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if not (exc.name and (mod == exc.name or mod.startswith(exc.name + "."))):
                raise
            continue
        m.register(app, guarded)


_register_optional()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
