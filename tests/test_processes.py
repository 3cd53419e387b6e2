"""codegen.core.processes, the one process runner: the time limit and Ctrl-C end every process a
command started (shell scripts whose children hold the output pipe), for `run` and `stream`."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from codegen.core import processes


def _script(tmp_path, body: str) -> str:
    p = tmp_path / "cmd.sh"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


def _gone(pid: int) -> bool:
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_stream_passes_each_line_as_it_comes_and_returns_the_status(tmp_path):
    """Lines arrive while the command runs, not at its end: the command goes on only once the
    caller has seen its second line (an event, not a timing: a loaded machine cannot break it)."""
    seen: list[str] = []
    go = tmp_path / "go"
    cmd = _script(tmp_path, f"echo one\necho two >&2\nn=0\nwhile [ ! -e {go} ] && [ $n -lt 600 ]; do "
                            "sleep 0.1; n=$((n+1)); done\n"
                            f"[ -e {go} ] || exit 5\nprintf 'caf\\351\\n'\nexit 4\n")

    def on_line(line: str) -> None:
        seen.append(line)
        if line == "two\n":
            go.touch()

    rc = processes.stream([cmd], on_line)
    assert rc == 4, "the second line reached the caller only after the command ended"
    assert seen == ["one\n", "two\n", "caf\ufffd\n"]  # stderr merged, bad bytes replaced


@pytest.mark.timeout(60)
def test_stream_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "child.pid"
    cmd = _script(tmp_path, f"echo started\nsleep 600 &\necho $! > {pidfile}\nwait\n")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        processes.stream([cmd], lambda _line: None, timeout=1.0)
    assert time.monotonic() - t0 < 20
    assert _gone(int(pidfile.read_text())), "the command's child survived the time limit"


@pytest.mark.timeout(60)
def test_stream_interrupt_sends_sigint_with_grace_then_kills(tmp_path):
    """Ctrl-C: the command gets SIGINT and time to stop (its trap runs), then the group is killed
    (a background child, which a shell starts with SIGINT ignored, included)."""
    pidfile, marker = tmp_path / "child.pid", tmp_path / "stopped"
    cmd = _script(tmp_path, f"trap 'echo clean > {marker}; exit 3' INT\nsleep 600 &\necho $! > {pidfile}\n"
                  "echo ready\nwhile :; do sleep 0.1; done\n")

    def on_line(line: str) -> None:
        if line == "ready\n":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        processes.stream([cmd], on_line, interrupt_grace=10.0)
    assert marker.read_text() == "clean\n"
    assert _gone(int(pidfile.read_text())), "the command's child survived the interrupt"


def test_run_without_a_time_limit_inherits_output(tmp_path, capfd):
    cmd = _script(tmp_path, "echo out\nexit 2\n")
    assert processes.run([cmd], timeout=None).returncode == 2
    assert capfd.readouterr().out == "out\n"


def test_start_puts_the_command_in_its_own_group(tmp_path):
    proc = processes.start([_script(tmp_path, "sleep 600\n")])
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        processes.kill_group(proc)
        proc.wait()
