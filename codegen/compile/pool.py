"""Warm compile workers with a per-kernel timeout: the one kill-and-replace pool
(codegen.core.pool) running codegen.compile.worker, each worker importing Triton once and
compiling many kernels. A kernel whose compile overruns the timeout, or kills its worker, is
reported as `timeout`/`crashed` and the worker replaced, so one hung compile never stalls the run.
"""

from __future__ import annotations

import sys
from typing import Callable

from packaging.version import InvalidVersion, Version

from codegen.core.errors import UpstreamError
from codegen.core.pool import Job, Lost, Pool
from codegen.compile import worker


def _public(version: str) -> str:
    """3.5.0 for AMD's fork's 3.5.0+rocm… (its `__version__` and its metadata may differ there)."""
    try:
        return Version(version).public
    except InvalidVersion:
        return version


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

    def _where(self) -> str:
        return self.python or sys.executable

    def _check_triton(self, _slot, info: dict) -> None:
        got = info.get("triton")
        if self.triton is not None and got is not None and _public(got) != _public(self.triton):
            raise UpstreamError(f"a compile worker in {self._where()} imported Triton {got}, "
                                f"not the {self.triton} it was chosen for (another `triton` on its sys.path?)")

    def _lost(self, job: Job, lost: Lost, _info: dict) -> list[dict]:
        if lost.why == "timeout":
            return [{"ok": False, "id": job.payload["id"], "timeout": True, "compile_s": self.timeout_s,
                     "error": f"timeout: no result after {self.timeout_s:g} s"}]
        return [{"ok": False, "id": job.payload["id"], "crashed": True, "compile_s": 0.0,
                 "error": f"compile {lost.detail}"}]

    def run(self, tasks: list[dict], on_result: Callable[[dict], None], feed=None) -> None:
        """Compile every task; call on_result(result) in completion order (in this process).

        `feed`: the read end of a `multiprocessing` connection that delivers more tasks while the
        pool runs (`build`'s compile service); a `None` on it closes the feed, and the run ends when
        everything received has been compiled."""
        n = self.jobs if feed is not None else min(self.jobs, len(tasks))
        if n == 0:
            return
        pool = Pool(list(range(n)), worker.init, worker.handle, (self.env, self.python is not None),
                    step_timeout_s=self.timeout_s, setup_timeout_s=self.timeout_s, label="compile",
                    who=lambda _slot: f"compile worker in {self._where()}", python=self.python,
                    check_ready=self._check_triton,
                    fatal_hint="leave out --python: precompile compiles with a build venv of the spec's Triton "
                               "(docs/toolchain.md)")

        def done(job: Job, results: list, err: str, _stats) -> None:
            on_result(results[0] if results else {"ok": False, "id": job.payload["id"], "compile_s": 0.0,
                                                  "error": err or "no result"})

        def job_of(task: dict) -> Job:
            return Job(str(task["id"]), task, (str(task["id"]),))

        pool.run((job_of(t) for t in tasks), done, self._lost, feed=feed, job_of=job_of)
