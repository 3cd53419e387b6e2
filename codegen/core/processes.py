"""The one process runner: every external command mi100-codegen starts goes through here, so a
time limit and Ctrl-C hold for everything the command starts (`subprocess.run(timeout=...)`
alone is not enough).

`subprocess.run` kills only the child it started when the time is up, then waits for its output
pipes to close; a child that is a shell script (`#!/bin/sh` running `sleep`), or any program that
starts another, leaves a grandchild holding those pipes, and the wait never ends. Here every
command runs in its own session (process group) and the whole group is killed.

Three entry points: `run` (wait for the result, output captured or not), `stream` (each output
line to a callback as it comes: CMake and ninja, with their progress) and `start` (a process the
caller polls itself, several at a time). The only process started elsewhere is the build venv's
hook (`codegen.compile.client`), which runs in another interpreter without codegen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Any, Callable


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Send `sig` (SIGKILL) to the process group `proc` leads (every process here leads one),
    else to `proc` alone."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError, OSError):
        with contextlib.suppress(OSError):
            proc.send_signal(sig)


def start(cmd: list[str], **kw: Any) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **kw)` in a session of its own: `kill_group` ends it and all it started."""
    kw.setdefault("start_new_session", True)
    return subprocess.Popen(cmd, **kw)


def _drain(proc: subprocess.Popen) -> None:
    """After a kill: reap the process, reading what is left in its pipes for a few seconds."""
    with contextlib.suppress(subprocess.TimeoutExpired):  # a descendant out of the group holds a pipe
        proc.communicate(timeout=5)


def run(cmd: list[str], *, timeout: float | None, capture_output: bool = False, input: Any = None,
        **kw: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, timeout=timeout, ...)` (None: no limit), except that on timeout (or
    Ctrl-C) every process the command started is killed; raises `subprocess.TimeoutExpired` as
    run does."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    with start(cmd, **kw) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            _drain(proc)
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        except BaseException:
            kill_group(proc)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stream(cmd: list[str], on_line: Callable[[str], None], *, timeout: float | None = None,
           interrupt_grace: float = 0.0, **kw: Any) -> int:
    """Run `cmd` with stdout and stderr merged, each output line (newline kept, undecodable bytes
    replaced) passed to `on_line` as it is written; returns the exit status. On timeout the group
    is killed and `subprocess.TimeoutExpired` raised. On Ctrl-C (or an error in `on_line`) the
    group gets SIGINT and `interrupt_grace` seconds to stop cleanly (ninja removes the outputs of
    the steps it interrupts), then SIGKILL; the exception goes on."""
    timer = None
    with start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
               encoding="utf-8", errors="replace", bufsize=1, **kw) as proc:
        try:
            if timeout is not None:
                timer = threading.Timer(timeout, kill_group, (proc,))
                timer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                on_line(line)
            rc = proc.wait()
            if timer is not None and not timer.is_alive():  # the time ran out: the kill ended the output
                raise subprocess.TimeoutExpired(cmd, timeout)
            return rc
        except BaseException:
            if proc.poll() is None and interrupt_grace > 0:
                kill_group(proc, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=interrupt_grace)
            kill_group(proc)
            _drain(proc)
            raise
        finally:
            if timer is not None:
                timer.cancel()
