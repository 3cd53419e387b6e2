"""The root commands' messages: one line each, verbatim text with a coloured verdict word.

`render`, `spec check`, warnings, errors and "interrupted" print only such lines, so they go
through click's styling (bundled with typer, which is loaded anyway) and never import rich: rich
costs ~40 ms of start-up, a tenth of `render` (docs/bench.md). Tables and progress bars of the
later stages stay rich (their modules import it when they run).

Colour follows the conventions rich follows: NO_COLOR turns it off, and so does TERM=dumb (or
unknown) even when forced; FORCE_COLOR turns it on; otherwise a terminal gets colour and a pipe
or a file plain text. Text is never parsed for markup or emoji codes: a path like `out[red]`
prints as it is.
"""

from __future__ import annotations

import os

import typer

# the styles a part may name -> click.style arguments
STYLES: dict[str, dict] = {
    "green": {"fg": "green"},
    "red": {"fg": "red"},
    "bold red": {"fg": "red", "bold": True},
    "yellow": {"fg": "yellow"},
    "dim": {"dim": True},
}


def use_color() -> bool | None:
    """False/True when the environment decides, None to let the stream decide (a TTY gets colour)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") in ("dumb", "unknown"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return None


def say(*parts: str | tuple[str, str]) -> None:
    """Write `parts` (plain text, or (text, style) with a style of STYLES) as one line to stderr."""
    text = "".join(p if isinstance(p, str) else typer.style(p[0], **STYLES[p[1]]) for p in parts)
    typer.echo(text, err=True, color=use_color())


__all__ = ["STYLES", "say", "use_color"]
