"""The one console factory: the root commands' one-line messages (`say`), and the rich Console
(`console`) and progress bars (`progress`) every later stage prints with.

`render`, `spec check`, warnings, errors and "interrupted" print only one-line messages, so they
go through click's styling (bundled with typer, which is loaded anyway) and never pay rich's
start-up: `console` and `progress` import it when a stage first asks for them.

Colour follows the conventions rich follows: NO_COLOR turns it off, and so does TERM=dumb (or
unknown) even when forced; FORCE_COLOR turns it on; otherwise a terminal gets colour and a pipe
or a file plain text. Text is never parsed for markup or emoji codes: a path like `out[red]`
prints as it is.

Text we did not write (a label from a bundle, a file name or version from a torch folder, an ELF
string) may hold control characters: `printable` escapes them the way `repr` does (ESC prints as
`\x1b`, a newline as `\n`), so it can neither drive the terminal nor forge a line. `say` applies
it to every part; a caller that prints through a rich console applies it to the text it hands
over.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Iterable

import typer

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

# the styles a part may name -> click.style arguments
STYLES: dict[str, dict] = {
    "green": {"fg": "green"},
    "red": {"fg": "red"},
    "bold red": {"fg": "red", "bold": True},
    "yellow": {"fg": "yellow"},
    "dim": {"dim": True},
}


def printable(text: str) -> str:
    """`text` fit for one line of a terminal: control and other non-printable characters escaped,
    `repr`-style (`\x1b`, `\n`, `\u202e`); printable text (also non-ASCII) is returned as it is."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def use_color() -> bool | None:
    """False/True when the environment decides, None to let the stream decide (a TTY gets colour)."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") in ("dumb", "unknown"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return None


def say(*parts: str | tuple[str, str]) -> None:
    """Write `parts` (plain text, or (text, style) with a style of STYLES) as one line to stderr,
    each with its control characters escaped (`printable`)."""
    text = "".join(printable(p) if isinstance(p, str) else typer.style(printable(p[0]), **STYLES[p[1]]) for p in parts)
    typer.echo(text, err=True, color=use_color())


def warn(lines: Iterable[str]) -> None:
    """Each of `lines` (a spec's warnings and notes) as one yellow line on stderr."""
    for line in lines:
        say((line, "yellow"))


def console(*, stderr: bool = True, log_width: int | None = None) -> "Console":
    """A rich Console on stderr (or stdout): no highlighting of numbers and paths, long lines
    soft-wrapped rather than cut. `log_width`: its width when the output is not a terminal (a log
    or a pipe), so that tables keep their columns whole."""
    from rich.console import Console  # CLI start-up: rich loads only when a stage prints with it

    out = Console(stderr=stderr, highlight=False, soft_wrap=True)
    if log_width is not None and not out.is_terminal:
        out.width = log_width
    return out


def progress(on: "Console", *, label: str = "[bold]{task.description}", detail: str = "", tail: str = "",
             spinner: bool = False, remaining: bool = True, disable: bool = False, data: bool = False) -> "Progress":
    """The stages' progress bar (build, precompile, bench, tune, downloads), kept on screen when done:
    `[spinner] LABEL bar done/total DETAIL elapsed [remaining] TAIL`; LABEL, DETAIL and TAIL are
    rich format strings over the task (`{task.description}`, `{task.fields[NAME]}`). `data`: the
    task counts bytes (done/total in MB, and the rate)."""
    # CLI start-up: rich.progress (beyond the console) loads only when a bar is drawn
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

    columns = [SpinnerColumn()] if spinner else []
    columns += [TextColumn(label), BarColumn()]
    columns += [DownloadColumn(), TransferSpeedColumn()] if data else [MofNCompleteColumn()]
    columns += [TextColumn(detail)] if detail else []
    columns += [TimeElapsedColumn()] + ([TimeRemainingColumn()] if remaining else [])
    columns += [TextColumn(tail)] if tail else []
    return Progress(*columns, console=on, transient=False, disable=disable)
