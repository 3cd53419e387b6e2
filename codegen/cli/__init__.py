"""The `mi100-codegen` command line: thin; maps exceptions to exit codes.

Exit codes (an API): 0 ok, 1 drift (--check), 2 user error, 3 upstream/build/GPU failure or a
missing environment (no torch, no Triton, no GPU), 130 interrupted.

Start-up stays light: building the app imports typer only (messages go through
`codegen.core.ui`; rich loads with the stage that draws a table or a progress bar, or for
`--help`). The commands of the later
stages live in their stage's `cli` module, which is imported when the command runs (or its own
`--help` is asked for); the root `--help` lists them from `STAGE_COMMANDS`.
"""

from __future__ import annotations

import sys

try:  # Ctrl-C while the CLI starts up: one line and exit 130, never a traceback
    import contextlib
    import errno
    import functools
    import importlib
    import os
    import traceback
    from pathlib import Path
    from typing import Callable, Optional

    import typer
    from typer.core import TyperGroup

    from codegen import __version__
    from codegen.core.ui import say, warn
    from codegen.core.errors import EXIT_DRIFT, EXIT_INTERRUPTED, CodegenError, SystemFailure, UserError
except KeyboardInterrupt:
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None

# command -> (module whose `register(app, guarded)` defines it, its one-line help for the root
# --help). tests/test_cli_help.py checks each line against the command's own help.
STAGE_COMMANDS: dict[str, tuple[str, str]] = {
    "apply": ("codegen.cli.apply", "Apply the overlay to an AOTriton tree: new files, anchored edits, tuning-DB rows."),
    "revert": ("codegen.cli.apply", "Restore the tree byte-for-byte to its state before the first apply."),
    "plan": ("codegen.cli.plan", "List the kernels the tree's own generator selects for the target GPUs: total and counts by family, head dim, dtype and config. Writes nothing into the tree."),
    "precompile": ("codegen.cli.precompile", "Cross-compile the plan's kernels for the target with Triton and report each kernel's resources (registers, LDS, scratch, spills, occupancy, MFMA use) and a verdict per config."),
    "build": ("codegen.cli.build", "Configure, build and install AOTriton for the spec's GPU; verify the install."),
    "tune": ("codegen.cli.tune", "Tune the spec's kernel configs on a GPU (tune AOTRITON_DIR ...) or import upstream's tuning logs (tune import FILE). Results: tuning/<arch>/ beside the spec, where render reads them."),
    "bundle": ("codegen.cli.bundle", "Drop-in bundles: the runtime built against a HIP major's headers, its images and a manifest, checked on a CPU (link identity, emulated dispatch); never run on a card."),
    "emulate": ("codegen.cli.emulate", "Execute the bundle's flash attention forward and backward on an emulated GPU and compare with fp64."),
    "torch": ("codegen.cli.torch", "Drop our AOTriton build into an installed PyTorch (checks, backup, restore), or print the from-source PyTorch rebuild recipe."),
    "validate": ("codegen.cli.validate", "On the current GPU: prove AOTriton's flash attention runs and is correct (exit 3 on failure)."),
    "report": ("codegen.cli.report", "On a card: collect the environment, torch status and validate's results into one file to send back."),
}


class _LazyGroup(TyperGroup):
    """The root group: stage commands are imported on first use. While the root help is
    formatted they are listed from STAGE_COMMANDS without importing anything."""

    _listing = False

    def list_commands(self, ctx) -> list[str]:
        own = super().list_commands(ctx)  # render, spec: defined below
        return own + [name for name in STAGE_COMMANDS if name not in own]

    def get_command(self, ctx, cmd_name: str):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in STAGE_COMMANDS:
            return cmd
        if self._listing:
            return typer.core.TyperCommand(cmd_name, help=STAGE_COMMANDS[cmd_name][1])
        return stage_command(cmd_name)

    def format_help(self, ctx, formatter) -> None:
        type(self)._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            type(self)._listing = False


@functools.lru_cache(maxsize=None)
def _stage_group(module: str):
    """The click group of one stage cli module's commands."""
    # CLI start-up: a stage's command module is imported when one of its commands runs
    sub = typer.Typer(add_completion=False)
    importlib.import_module(module).register(sub, guarded)
    sub.callback()(lambda: None)  # a group even when the module has one command
    return typer.main.get_command(sub)


def add_group(app: typer.Typer, group: typer.Typer, name: str, guard: Callable) -> None:
    """A stage's command group (torch, bundle, tune) under `name`, each command's body guarded."""
    for cmd in group.registered_commands:
        cmd.callback = guard(cmd.callback)
    app.add_typer(group, name=name)


def stage_command(name: str):
    """The click command `name` of a later stage (imports its cli module)."""
    return _stage_group(STAGE_COMMANDS[name][0]).commands[name]


app = typer.Typer(
    cls=_LazyGroup,
    name="mi100-codegen",
    help="Bring AOTriton's FlashAttention to AMD GPUs AMD ships no kernels for (MI100/gfx908 first).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
spec_app = typer.Typer(help="Validate specs; print an embedded spec or the specs' JSON Schema.", no_args_is_help=True)
app.add_typer(spec_app, name="spec")

_state = {"debug": False, "interrupt_reported": False}


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


def _interrupted(why: str = "") -> None:
    """'interrupted', once; `why`: what the interrupted stage left (a KeyboardInterrupt's words)."""
    if not _state["interrupt_reported"]:
        _state["interrupt_reported"] = True
        say(("interrupted", "yellow"), f": {why}" if why else "")


def guarded(fn: Callable) -> Callable:
    """Run a command body: user-facing errors become one message and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _state["interrupt_reported"] = False   # once per command: a process may run several (tests)
        try:
            _check_cwd()
            result = fn(*args, **kwargs)
            if sys.stdout is not None:  # None: stdout closed (`>&-`) and the command not run by main
                sys.stdout.flush()  # a full disk under stdout shows here, not as a shutdown traceback
            return result
        except typer.Exit:
            raise
        except MemoryError:
            _report(SystemFailure("out of memory (MemoryError) while running this command",
                                  hint=_MEMORY_HINT))
        except RuntimeError as exc:  # threading's words for ENOMEM/EAGAIN when a thread is created
            if "can't start new thread" not in str(exc):
                raise
            _report(SystemFailure("cannot start a thread: out of memory or past the process limit",
                                  hint=_MEMORY_HINT))
        except OSError as exc:
            if exc.errno not in _SYSTEM_ERRNOS:
                raise
            if exc.filename is None:  # stdout itself (`> /dev/full`)
                _mute_stdout()
                _report(SystemFailure(f"cannot write the output: {exc.strerror or exc}"))
            _report(SystemFailure(f"{exc.filename}: {exc.strerror or exc}"))
        except CodegenError as exc:
            _report(exc)
        except KeyboardInterrupt as exc:
            _interrupted(str(exc))
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


_MEMORY_HINT = ("free memory or raise the limit (ulimit -v, ulimit -u), then re-run the same command: "
                "every stage is safe to re-run")

# errors of the machine, not of the command: a full disk or quota, an I/O error, no memory (exit 3)
_SYSTEM_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM}


def _check_cwd() -> None:
    """A working directory that was deleted (os.getcwd raises): one message, before any work."""
    try:
        os.getcwd()
    except OSError:
        raise UserError("the working directory no longer exists (it was deleted or unmounted)",
                        hint="cd to an existing folder and run the command again") from None


def _to_devnull(stream) -> None:
    """Point `stream`'s descriptor at /dev/null (what is still buffered then goes nowhere, quietly)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def _mute_stdout() -> None:
    """Point stdout at /dev/null once writing to it failed (ENOSPC): the shutdown's flush of the
    buffered rest then succeeds instead of printing a traceback."""
    _to_devnull(sys.stdout)


def _report(exc: CodegenError) -> None:
    """One message (and a hint) on stderr, then exit with the error's code."""
    if _state["debug"]:
        traceback.print_exc()
    # messages are plain text: no markup, no emoji codes (`x.yaml:100:7:` is not an emoji)
    message = str(exc)
    if "\n" not in message:
        say(("error:", "bold red"), " ", message)
    else:
        say(("error:", "bold red"))
        for line in message.splitlines():
            say(f"  {line}")
    if exc.hint:
        say(("hint:", "dim"), " ", exc.hint)
    raise typer.Exit(exc.exit_code) from None


# the one --spec of every command; the rule is codegen.apply.applied_spec.resolve_spec's, the one
# function every command calls
SpecOpt = typer.Option(None, "--spec", help="Target spec YAML (default: the embedded rules/mi100.yaml, which `spec "
                       "show` prints; commands "
                       "that read an applied tree take the spec apply recorded in it, which a given --spec "
                       "must match).")


def _path_option(value):
    """preflight.path_option, loaded when a path option is parsed (not at start-up)."""
    from codegen.core.preflight import path_option  # CLI start-up: preflight loads when a path option is parsed, never for --help

    return path_option(value)


@app.command()
@guarded
def render(
    spec: Optional[Path] = SpecOpt,
    out: Path = typer.Option(Path("aotriton_overlay"), "--out", parser=_path_option, metavar="PATH",
                             help="Overlay directory to write: a preview to read or diff (apply renders "
                             "again from its --spec and never reads it)."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 with a diff if OUT is stale."),
) -> None:
    """Render the overlay (tuning-space module, anchored edits, tuning rows, MANIFEST.json)."""
    # CLI start-up: the render stage loads when the command runs
    from codegen.render.overlay_dir import diff_overlay, write_overlay
    from codegen.render.inputs import render_overlay
    from codegen.apply.applied_spec import resolve_spec

    loaded = resolve_spec(None, spec)
    warn(loaded.warnings)
    ov = render_overlay(loaded)
    if check:
        diff = diff_overlay(ov, out)
        if diff:
            sys.stdout.writelines(diff)
            say(("drift:", "red"), f" {out} is not the render of {loaded.display}; "
                f"run: mi100-codegen render{' --spec ' + str(spec) if spec else ''} --out {out}")
            raise typer.Exit(EXIT_DRIFT)
        say(("up to date:", "green"), f" {out} ({len(ov.files)} files)")
        return
    changed = write_overlay(ov, out)
    verdict = "wrote" if changed else "identical"
    say(f"{verdict}: {out} ({len(ov.files)} files, {len(ov.edits)} edits, spec {loaded.display})")


@spec_app.command("check")
@guarded
def spec_check(
    path: Optional[Path] = typer.Argument(None, help="Spec YAML (default: the embedded one)."),
) -> None:
    """Validate a spec; every problem as file:line:col, exit 2 on errors."""
    # CLI start-up: the models and the loader load when the command runs
    from codegen.models import expand_space
    from codegen.apply.applied_spec import resolve_spec

    loaded = resolve_spec(None, path)
    warn(loaded.warnings)
    counts = {f: len(c) for f, c in expand_space(loaded.spec).items()}
    summary = ", ".join(f"{f} {n}" for f, n in counts.items())
    say(("ok:", "green"), f" {loaded.display}: {loaded.spec.arch}, head dims "
        f"{list(loaded.spec.head_dims)}, candidate configs: {summary}")


@spec_app.command("show")
@guarded
def spec_show(
    name: Optional[str] = typer.Argument(None, help="An embedded spec's name: mi100 (the default spec), mi50, "
                                         "rdna2, examples/smoke (an unknown name lists them all)."),
) -> None:
    """Print an embedded spec as shipped, comments included.

    `mi100-codegen spec show > my.yaml` starts a spec of your own (docs/howto/add-head-dim.md)."""
    from codegen.core.resources import DEFAULT_SPEC, embedded_spec  # CLI start-up: data folders, when run

    sys.stdout.write(embedded_spec(name or DEFAULT_SPEC).read_text(encoding="utf-8"))


@spec_app.command("schema")
@guarded
def spec_schema() -> None:
    """Print the JSON Schema of specs (committed as rules/schema/target-spec.schema.json)."""
    from codegen.formats.spec import spec_json_schema  # CLI start-up: the loader loads when run

    sys.stdout.write(spec_json_schema())


def _closed_stdout(exc: BaseException) -> bool:
    """`exc` comes from a write to a pipe whose reader went away (`plan | head`): click turns
    that EPIPE into exit 1; we want it to be a quiet success."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.EPIPE:
            return True
        seen = seen.__context__
    return False


def _quiet_exit_on_closed_stdout() -> None:
    """The reader of stdout is gone: point stdout at /dev/null (so the interpreter's final flush
    does not complain) and exit 0."""
    _to_devnull(sys.stdout)
    raise SystemExit(0)


def _reopen_closed_streams() -> None:
    """stdout or stderr closed by the caller (`>&-`, `2>&-`): Python leaves `sys.stdout` None and
    the first write or flush is a traceback. The closed descriptor is pointed at /dev/null (so a
    file opened later cannot take its number and receive a child process's output) and the stream
    writes there: what would have been printed is dropped, as for a reader that went away; the exit
    code still tells how the command ended."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is not None:
            continue
        with contextlib.suppress(OSError):  # no /dev/null: leave it (the command's errors still exit non-zero)
            try:
                os.fstat(fd)
            except OSError:  # closed: /dev/null takes its number
                null = os.open(os.devnull, os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
                setattr(sys, name, open(fd, "w", encoding="utf-8", errors="replace", closefd=False))
            else:  # something else holds the number: never write into it
                setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))


class _DroppingStderr:
    """sys.stderr whose reader may go away (`cmd 2>&1 | head -1`): a write past that is dropped
    (the descriptor then points at /dev/null) instead of ending the command, so an error still
    exits with its own code and a running stage is not cut short by its messages."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _to_devnull(self._stream)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _to_devnull(self._stream)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def main() -> None:
    """The console script: the app, plus Ctrl-C between start-up and the first command, a closed
    stdout pipe (`plan | head`) as a quiet exit 0, and a closed stdout or stderr (`>&-`) as a
    stream that drops what is written to it."""
    _reopen_closed_streams()
    if sys.stderr is not None and not isinstance(sys.stderr, _DroppingStderr):
        sys.stderr = _DroppingStderr(sys.stderr)
    try:
        app()
    except KeyboardInterrupt:
        _interrupted()
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        _quiet_exit_on_closed_stdout()
    except OSError as exc:  # outside a command body (`--version > /dev/full`)
        if exc.errno not in _SYSTEM_ERRNOS:
            raise
        _mute_stdout()
        say(("error:", "bold red"), f" cannot write the output: {exc.strerror or exc}")
        sys.exit(SystemFailure.exit_code)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:
            _interrupted()
        if exc.code == 1 and _closed_stdout(exc):
            _quiet_exit_on_closed_stdout()
        raise
