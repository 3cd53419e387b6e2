"""CLI polish of issue 22: a closed stdout pipe is a quiet exit 0; a closed stdout or stderr (`>&-`,
`2>&-`) or a stderr whose reader went away changes nothing but what is seen (issue 30 item 12);
apply/revert tables carry no trailing spaces when piped and print a path with [brackets]
verbatim; revert says per file what it did (restored, removed, identical)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.apply.engine import apply_overlay
from codegen.cli import app
from codegen.formats.spec import load_spec
from fake_tree import make_fake_tree

REPO = Path(__file__).resolve().parents[1]


def test_a_closed_stdout_pipe_exits_0_quietly():
    """`mi100-codegen spec schema | head -0`: the reader is gone before the first write."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", "from codegen.cli import main; main()", "spec", "schema"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    p.stdout.close()  # no reader: the first write gets EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert err == ""


COMMANDS = {  # a command -> the exit code it has with both streams open
    "spec check": (["spec", "check"], 0),              # stderr only
    "spec schema": (["spec", "schema"], 0),            # stdout only
    "render --check": (["render", "--check", "--out", "NOWHERE"], 1),  # a diff on stdout, drift on stderr
    "bundle check": (["bundle", "check", "NOWHERE.zip"], 2),           # an error on stderr
}


def _closed(fds):
    return lambda: [os.close(fd) for fd in fds]


@pytest.mark.parametrize("how", ["stdout closed", "stderr closed", "both closed", "stderr reader gone"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_closed_stream_changes_nothing_but_what_is_seen(tmp_path, command, how):
    """`mi100-codegen spec check >&-` was a traceback (sys.stdout is None): now every command
    runs as with its streams open and exits with the same code; what it writes is dropped."""
    args, code = COMMANDS[command]
    args = [a.replace("NOWHERE", str(tmp_path / "nowhere")) for a in args]
    cmd = [sys.executable, "-c", "from codegen.cli import main; main()", *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if how == "stderr reader gone":
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=REPO)
        p.stderr.close()  # no reader: every write to stderr gets EPIPE
        assert p.wait(timeout=120) == code
        return
    fds = {"stdout closed": [1], "stderr closed": [2], "both closed": [1, 2]}[how]
    log = tmp_path / "log"
    with open(log, "w") as out:  # the stream left open goes to a file, read for a traceback
        p = subprocess.run(cmd, stdout=out, stderr=out, env=env, cwd=REPO, timeout=120, preexec_fn=_closed(fds))
    text = log.read_text()
    assert p.returncode == code, text[-2000:]
    assert "Traceback" not in text and "Exception ignored" not in text, text[-2000:]
    assert not (tmp_path / "nowhere").exists()


def test_apply_and_revert_tables_verbatim_and_without_trailing_spaces(tmp_path):
    tree = make_fake_tree(tmp_path / "[red]x[bold]", (0, 12, 0))
    runner = CliRunner()
    res = runner.invoke(app, ["apply", str(tree)])
    assert res.exit_code == 0, res.output
    assert f"apply {tree} (AOTriton" in res.stderr  # the title: the path as it is, no markup
    lines = res.stderr.splitlines()
    assert lines and all(line == line.rstrip() for line in lines), [line for line in lines if line != line.rstrip()]
    res = runner.invoke(app, ["revert", str(tree), "--json"])
    assert res.exit_code == 0, res.output
    verdicts = {f["path"]: f["verdict"] for f in json.loads(res.stdout)["files"]}
    assert verdicts["v3python/mi100_codegen_space.py"] == "removed"
    assert verdicts["v3src/util.cc"] == "restored"
    assert set(verdicts.values()) <= {"removed", "restored", "identical"}
    assert all(line == line.rstrip() for line in res.stderr.splitlines())
    assert "restored" in res.stderr and "removed" in res.stderr and f"revert {tree}" in res.stderr


def test_revert_says_identical_for_a_file_already_pristine(tmp_path):
    """A file the user put back by hand: --force reverts, and the verdict says nothing changed."""
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    pristine = (tree / "v3src" / "util.cc").read_bytes()
    apply_overlay(tree, load_spec(None))
    (tree / "v3src" / "util.cc").write_bytes(pristine)
    res = CliRunner().invoke(app, ["revert", str(tree), "--force", "--json"])
    assert res.exit_code == 0, res.output
    verdicts = {f["path"]: f["verdict"] for f in json.loads(res.stdout)["files"]}
    assert verdicts["v3src/util.cc"] == "identical"
    assert (tree / "v3src" / "util.cc").read_bytes() == pristine
