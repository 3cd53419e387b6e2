"""A pool of warm compile workers with a per-kernel timeout.

Each worker is a spawned process that imports Triton once and compiles many kernels. The parent
hands one task at a time to each idle worker; a worker that exceeds the timeout is killed (its
kernel reported as `timeout`) and replaced, so one hung compile never stalls the run.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing import spawn
from multiprocessing.connection import wait
from typing import Callable

from packaging.version import InvalidVersion, Version

from codegen.core.errors import UpstreamError
from codegen.compile.worker import serve

_DEFAULT_EXECUTABLE = spawn.get_executable()


def _public(version: str) -> str:
    """3.5.0 for AMD's fork's 3.5.0+rocm… (its `__version__` and its metadata may differ there)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


@dataclass
class _Worker:
    proc: mp.process.BaseProcess
    conn: object
    ready: bool = False
    task: dict | None = None
    started: float = 0.0
    done: int = field(default=0)


class WorkerPool:
    """`python`: the interpreter the workers run (the build venv's; None: this one), `triton` the
    version they must import there (a worker that imports another one is refused)."""

    def __init__(self, jobs: int, env: dict[str, str], timeout_s: float = 600.0, *, python: str | None = None,
                 triton: str | None = None):
        self.jobs = max(1, int(jobs))
        self.env = dict(env)
        self.timeout_s = float(timeout_s)
        self.python = python
        self.triton = triton
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker] = []
        self.spawned = 0
        self._startup_deaths = 0

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=serve, args=(child, self.env, self.python is not None), daemon=True,
                                 name=f"mi100-codegen-compile-{self.spawned}")
        proc.start()
        child.close()
        self.spawned += 1
        return _Worker(proc=proc, conn=parent)

    def _retire(self, w: _Worker, kill: bool) -> None:
        if kill and w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=5)
        try:
            w.conn.close()
        except OSError:
            pass

    def run(self, tasks: list[dict], on_result: Callable[[dict], None], feed=None) -> None:
        """Compile every task; call on_result(result) in completion order (in this process).

        `feed`: the read end of a `multiprocessing` connection that delivers more tasks while the
        pool runs (`build`'s compile service); a `None` on it closes the feed, and the run ends when
        everything received has been compiled."""
        pending = deque(tasks)
        n_workers = self.jobs if feed is not None else min(self.jobs, len(pending))
        if self.python is not None:
            # spawn's interpreter is process-wide in multiprocessing: set for this run, restored after
            spawn.set_executable(self.python)
        try:
            self._workers = [self._spawn() for _ in range(n_workers)]
            while feed is not None or pending or any(w.task is not None for w in self._workers):
                for w in self._workers:
                    if w.ready and w.task is None and pending:
                        w.task = pending.popleft()
                        w.started = time.monotonic()
                        w.conn.send(w.task)
                busy = [w for w in self._workers if w.task is not None]
                waits = [self.timeout_s - (time.monotonic() - w.started) for w in busy]
                tick = max(0.05, min([1.0, *waits]))
                ready = wait([w.conn for w in self._workers] + ([feed] if feed is not None else []), timeout=tick)
                if feed is not None and feed in ready:
                    try:
                        item = feed.recv()
                    except (EOFError, OSError):
                        item = None
                    if item is None:
                        feed = None
                    else:
                        pending.append(item)
                for w in list(self._workers):
                    if w.conn in ready:
                        try:
                            msg = w.conn.recv()
                        except (EOFError, OSError):
                            self._died(w, on_result, pending)
                            continue
                        if "fatal" in msg:
                            raise UpstreamError(f"a compile worker could not start in {self.python or sys.executable}: "
                                                f"{msg['fatal']}",
                                                hint="leave out --python: precompile compiles with a build venv "
                                                "of the spec's Triton (docs/toolchain.md)")
                        if msg.get("ready"):
                            self._check_triton(msg.get("triton"))
                            w.ready = True
                            continue
                        w.task, w.done = None, w.done + 1
                        on_result(msg)
                    elif w.task is not None and time.monotonic() - w.started > self.timeout_s:
                        task = w.task
                        self._replace(w, kill=True)
                        on_result({"ok": False, "id": task["id"], "timeout": True,
                                   "compile_s": self.timeout_s,
                                   "error": f"timeout: no result after {self.timeout_s:g} s"})
        finally:
            self.close()
            if self.python is not None:
                spawn.set_executable(_DEFAULT_EXECUTABLE)

    def _check_triton(self, got: str | None) -> None:
        if self.triton is not None and got is not None and _public(got) != _public(self.triton):
            raise UpstreamError(f"a compile worker in {self.python or sys.executable} imported Triton {got}, "
                                f"not the {self.triton} it was chosen for (another `triton` on its sys.path?)")

    def _died(self, w: _Worker, on_result: Callable[[dict], None], pending: deque) -> None:
        task = w.task
        code = w.proc.exitcode
        self._replace(w, kill=True)
        if task is not None:
            on_result({"ok": False, "id": task["id"], "crashed": True, "compile_s": 0.0,
                       "error": f"compile worker died (exit code {code})"})
        else:
            self._startup_deaths += 1
            if self._startup_deaths > 2 * self.jobs:
                raise UpstreamError(f"compile workers keep dying at start (exit code {code})")

    def _replace(self, w: _Worker, kill: bool) -> None:
        i = self._workers.index(w)
        self._retire(w, kill=kill)
        self._workers[i] = self._spawn()

    def close(self) -> None:
        for w in self._workers:
            if w.proc.is_alive():
                try:
                    w.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 5
        for w in self._workers:
            w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._retire(w, kill=True)
        self._workers = []
