"""Running a short external command with a time limit that holds: the one helper for every
probe, venv step and generator run (`subprocess.run(timeout=...)` alone is not enough).

`subprocess.run` kills only the child it started when the time is up, then waits for its output
pipes to close; a child that is a shell script (`#!/bin/sh` running `sleep`), or any program that
starts another, leaves a grandchild holding those pipes, and the wait never ends. Here the
command runs in its own session (process group) and the whole group is killed."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (started with start_new_session=True), else `proc`."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        try:
            proc.kill()
        except OSError:
            pass


def run(cmd: list[str], *, timeout: float, capture_output: bool = False, input: Any = None,
        **kw: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, timeout=timeout, ...)`, except that on timeout (or Ctrl-C) every
    process the command started is killed; raises `subprocess.TimeoutExpired` as run does."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = subprocess.PIPE
    if input is not None:
        kw["stdin"] = subprocess.PIPE
    kw.setdefault("start_new_session", True)
    with subprocess.Popen(cmd, **kw) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            try:
                proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a descendant that left the group still holds a pipe
                pass
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        except BaseException:
            kill_group(proc)
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


__all__ = ["kill_group", "run"]
