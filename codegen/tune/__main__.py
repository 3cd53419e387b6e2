"""`python -m codegen.tune …`: the tune commands alone (same as `mi100-codegen tune …`), for GPU
machines where only this stage is wanted; it does not import the other stages' commands."""

from __future__ import annotations

import functools
import sys

import typer

from ..errors import EXIT_INTERRUPTED, CodegenError
from .cli import register


def _guarded(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CodegenError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if exc.hint:
                print(f"hint: {exc.hint}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return wrapper


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _root() -> None:
        pass

    register(app, _guarded)
    app(prog_name="python -m codegen.tune", args=["tune", *sys.argv[1:]])


if __name__ == "__main__":
    main()
