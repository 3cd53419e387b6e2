"""codegen.core.ui: one-line messages of the root commands, without rich."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app

REPO = Path(__file__).resolve().parents[1]
GREEN = "\x1b[32m"


def _say_through_a_pipe(env: dict) -> str:
    """`say` in a child whose stderr is a pipe (not a terminal), with `env` set."""
    code = "from codegen.core.ui import say\nsay(('ok:', 'green'), ' out[red]x :smile: [/]')\n"
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**base, "PYTHONPATH": str(REPO), **env})
    return out.stderr


@pytest.mark.parametrize("env, coloured", [
    ({}, False),                                   # a pipe: plain text
    ({"FORCE_COLOR": "1"}, True),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),  # NO_COLOR wins
    ({"FORCE_COLOR": "1", "TERM": "dumb"}, False),    # a dumb terminal gets none, as with rich
    ({"TERM": "dumb"}, False),
])
def test_colour_follows_the_environment(env, coloured):
    err = _say_through_a_pipe(env)
    assert (GREEN in err) == coloured, repr(err)
    # the text itself is verbatim: no markup, no emoji codes
    assert err.endswith(" out[red]x :smile: [/]\n"), repr(err)


def test_a_path_with_brackets_is_printed_as_given(tmp_path):
    out = tmp_path / "ov[bold]x"
    r = CliRunner().invoke(app, ["render", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert f"wrote: {out} (" in r.output
    r = CliRunner().invoke(app, ["render", "--out", str(out), "--check"])
    assert r.exit_code == 0 and f"up to date: {out} (" in r.output, r.output


def test_one_console_factory_for_the_stages(monkeypatch):
    """codegen.core.ui.console: stderr (or stdout), no highlighting, soft wrap; a log width when the
    output is not a terminal (under pytest it is not)."""
    from codegen.core import ui

    err = ui.console()
    assert err.stderr and not err.is_terminal and err.soft_wrap and not err._highlight
    assert ui.console(stderr=False, log_width=160).width == 160
    assert not ui.console(stderr=False).stderr
    monkeypatch.setenv("COLUMNS", "90")
    assert ui.console().width == 90  # no log width: the environment's


def test_one_progress_factory_for_the_stages():
    """codegen.core.ui.progress: build's bar (spinner, fields, tail), precompile's and tune's."""
    import io

    from rich.console import Console
    from rich.progress import SpinnerColumn, TimeRemainingColumn

    from codegen.core import ui

    out = io.StringIO()
    on = Console(file=out, force_terminal=True, width=200)
    build = ui.progress(on, label="[bold]build[/]", detail="kernels {task.fields[kernels]}",
                        tail="[dim]{task.fields[what]}", spinner=True)
    assert isinstance(build.columns[0], SpinnerColumn) and any(isinstance(c, TimeRemainingColumn) for c in build.columns)
    with build:
        build.add_task("build", total=4, completed=2, kernels="compiled 1", what="k.hsaco")
    assert "build" in out.getvalue() and "2/4" in out.getvalue() and "compiled 1" in out.getvalue()
    tune = ui.progress(on, label="{task.description}", remaining=False)
    assert not any(isinstance(c, (SpinnerColumn, TimeRemainingColumn)) for c in tune.columns)
    assert ui.progress(on, disable=True).disable


def test_untrusted_text_reaches_the_terminal_escaped():
    """codegen.core.ui.printable, `repr`-style (issue 30 item 9): ESC, a newline, a bidi override
    print as escapes, printable text (non-ASCII too) as it is; `say` applies it to every part, so an
    error message naming a file from a bundle or a torch folder cannot drive the terminal or
    forge a line."""
    from codegen.core.ui import printable

    assert printable("gfx908 µ é") == "gfx908 µ é"
    assert printable("a\x1b[2Jb\nproblem: forged\u202e") == "a\\x1b[2Jb\\nproblem: forged\\u202e"
    code = ("from codegen.core.ui import say\n"
            "say(('error:', 'red'), ' lib/x\\x1b[2J\\nproblem: forged', ('\\x07', 'dim'))\n")
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    err = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**base, "PYTHONPATH": str(REPO), "FORCE_COLOR": "1"}).stderr
    assert "\x1b[2J" not in err and "\x07" not in err and err.count("\n") == 1, repr(err)
    assert "lib/x\\x1b[2J\\nproblem: forged" in err and "\\x07" in err and "\x1b[31m" in err, repr(err)  # styled still
