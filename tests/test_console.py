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
