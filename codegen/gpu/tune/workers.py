"""Worker processes a hung or crashed GPU kernel cannot stall: one per slot (a GPU, or a compile
job), each given one job at a time. Every step of a job (one candidate config) runs under a
deadline; a worker that overruns it or dies is killed and replaced, the step is reported lost
(`timeout` or `crash`), and the rest of the job goes on in the new worker.

Protocol over a pipe: the worker sends ("ready", info) once started (or ("fatal", text)), then
for each job ("begin", names) before a step, ("end", result) after it and ("done", error) at the
end; the parent sends (payload, names still to do) or None to stop. `init` and `handle` are
top-level functions (spawned workers import them by name); no torch here.

`codegen.compile.pool` keeps the same kill-and-replace rule for compile jobs of one step each;
here a job has many steps, each with its own deadline, and a slot is pinned to one device.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Callable, Iterable, Iterator

from codegen.core.errors import UpstreamError

START_TIMEOUT_S = 300.0  # a worker's start (imports torch, creates the GPU context)
SETUP_TRIES = 2  # a job whose worker is lost before its first step twice fails


def short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
    return text[:200]


@dataclass
class Job:
    key: str  # its name in messages (a grid entry's name)
    payload: object  # what the worker's handler gets, with the names still to do
    names: tuple[str, ...]  # the units its steps report (candidate configs), each exactly once


@dataclass(frozen=True)
class Lost:
    names: tuple[str, ...]  # the step in flight
    why: str  # "timeout" or "crash"
    detail: str


@dataclass
class SlotStats:
    """What one slot (device) did: jobs finished, steps reported, seconds busy, steps lost."""

    slot: object
    info: dict = field(default_factory=dict)
    jobs: int = 0
    steps: int = 0
    busy_s: float = 0.0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0


class Reporter:
    """The worker's side of a job: `begin(names)` before a step, `end(result)` after it."""

    def __init__(self, conn):
        self._conn = conn

    def begin(self, names) -> None:
        self._conn.send(("begin", tuple(names)))

    def end(self, result) -> None:
        self._conn.send(("end", result))


def serve(conn, slot, init: Callable, handle: Callable, args: tuple) -> None:
    """A worker's main loop (the spawned process's target)."""
    try:
        state, info = init(slot, *args)
    except BaseException as exc:  # reported to the parent, which refuses the run
        conn.send(("fatal", short(exc)))
        return
    conn.send(("ready", info))
    report = Reporter(conn)
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                return
            payload, names = msg
            try:
                handle(state, payload, names, report)
                err = ""
            except Exception as exc:  # the job fails; the worker goes on
                err = short(exc)
            conn.send(("done", err))
    except (KeyboardInterrupt, EOFError, BrokenPipeError):  # Ctrl-C, or the parent is gone: the parent reports
        return


@dataclass
class _Worker:
    slot: object
    stats: SlotStats
    proc: object = None
    conn: object = None
    ready: bool = False
    started: float = 0.0  # when started, or when the step in flight began
    job: Job | None = None
    job_started: float = 0.0
    left: list = field(default_factory=list)  # names of the job not reported yet
    results: list = field(default_factory=list)
    step: tuple | None = None  # names of the step in flight
    setup_losses: int = 0
    start_failures: int = 0


class Supervisor:
    """Run jobs on one worker per slot. `step_timeout_s` bounds each step, `setup_timeout_s`
    what a job does before its first step and after its last (problem, reference)."""

    def __init__(self, slots: list, init: Callable, handle: Callable, args: tuple, *,
                 step_timeout_s: float, setup_timeout_s: float, start_timeout_s: float = START_TIMEOUT_S):
        self.slots = list(slots)
        self.init, self.handle, self.args = init, handle, args
        self.step_timeout_s = float(step_timeout_s)
        self.setup_timeout_s = float(setup_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self._ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []

    # ---- processes ---------------------------------------------------------------------------
    def _start(self, w: _Worker) -> None:
        parent, child = self._ctx.Pipe()
        w.proc = self._ctx.Process(target=serve, args=(child, w.slot, self.init, self.handle, self.args),
                                   daemon=True, name=f"mi100-codegen-tune-{w.slot}")
        w.proc.start()
        child.close()
        w.conn, w.ready, w.started, w.step = parent, False, time.monotonic(), None

    def _stop(self, w: _Worker) -> None:
        if w.proc is not None and w.proc.is_alive():
            w.proc.kill()
        if w.proc is not None:
            w.proc.join(timeout=10)
        try:
            w.conn.close()
        except (OSError, AttributeError):
            pass

    def close(self) -> None:
        for w in self.workers:
            if w.proc is not None and w.proc.is_alive():
                try:
                    w.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
        deadline = time.monotonic() + 10
        for w in self.workers:
            if w.proc is not None:
                w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._stop(w)

    # ---- the run -----------------------------------------------------------------------------
    def run(self, jobs: Iterable[Job], on_done: Callable[[Job, list, str, SlotStats], None],
            lost_result: Callable[[Job, Lost, dict], list]) -> list[SlotStats]:
        """Hand out `jobs` (consumed lazily, one per idle worker) and call on_done(job, results,
        error, slot stats) in this process as each finishes; `results` holds every step's
        result, lost steps as lost_result(job, lost, worker info) gives them."""
        self.workers = [_Worker(slot=s, stats=SlotStats(slot=s)) for s in self.slots]
        it: Iterator[Job] = iter(jobs)
        exhausted = False
        try:
            for w in self.workers:
                self._start(w)
            while True:
                for w in self.workers:
                    if w.ready and w.job is None and not exhausted:
                        job = next(it, None)
                        if job is None:
                            exhausted = True
                        else:
                            w.job, w.job_started, w.left, w.results = job, time.monotonic(), list(job.names), []
                            w.setup_losses = 0
                            self._send(w)
                if exhausted and all(w.job is None for w in self.workers):
                    return [w.stats for w in self.workers]
                self._poll(on_done, lost_result)
        finally:
            self.close()

    def _send(self, w: _Worker) -> None:
        w.started, w.step = time.monotonic(), None
        try:
            w.conn.send((w.job.payload, tuple(w.left)))
        except (BrokenPipeError, OSError):  # it died meanwhile: the next poll replaces it and sends again
            pass

    def _limit(self, w: _Worker) -> float:
        if not w.ready:
            return self.start_timeout_s
        return self.step_timeout_s if w.step is not None else self.setup_timeout_s

    def _poll(self, on_done, lost_result) -> None:
        now = time.monotonic()
        busy = [w for w in self.workers if w.job is not None or not w.ready]
        waits = [self._limit(w) - (now - w.started) for w in busy]
        tick = min([1.0, *waits]) if waits else 1.0
        ready = wait([w.conn for w in self.workers] + [w.proc.sentinel for w in self.workers],
                     timeout=max(0.01, tick))
        for w in self.workers:
            if w.conn in ready:
                try:
                    while w.conn.poll():
                        self._message(w, w.conn.recv(), on_done)
                except (EOFError, OSError):
                    pass
            if not w.proc.is_alive():
                self._lost(w, "crash", f"worker died (exit code {w.proc.exitcode})", on_done, lost_result)
            elif (w.job is not None or not w.ready) and time.monotonic() - w.started > self._limit(w):
                what = "step" if w.step is not None else "setup" if w.ready else "start"
                self._lost(w, "timeout", f"no result after {self._limit(w):g} s ({what})", on_done, lost_result)

    def _message(self, w: _Worker, msg: tuple, on_done) -> None:
        kind = msg[0]
        if kind == "fatal":
            raise UpstreamError(f"a tune worker for device {w.slot} could not start: {msg[1]}")
        if kind == "ready":
            w.ready, w.start_failures, w.stats.info = True, 0, msg[1]
            w.started = time.monotonic()
            if w.job is not None:  # a replacement: the rest of its job
                self._send(w)
        elif kind == "begin":
            w.step, w.started = msg[1], time.monotonic()
        elif kind == "end":
            if w.step is not None:
                w.left = [n for n in w.left if n not in w.step]
                w.stats.steps += 1
            w.results.append(msg[1])
            w.step, w.started = None, time.monotonic()
        elif kind == "done":
            self._finish(w, msg[1], on_done)

    def _finish(self, w: _Worker, err: str, on_done) -> None:
        job, results = w.job, w.results
        w.stats.jobs += 1
        w.stats.busy_s += time.monotonic() - w.job_started
        w.job, w.results, w.left, w.step = None, [], [], None
        on_done(job, results, err, w.stats)

    def _lost(self, w: _Worker, why: str, detail: str, on_done, lost_result) -> None:
        """Kill and replace the worker; account for what it was doing."""
        self._stop(w)
        w.stats.restarts += 1
        if not w.ready:
            w.start_failures += 1
            if w.start_failures > 2:
                raise UpstreamError(f"the tune worker for device {w.slot} keeps failing at start: {detail}")
        elif w.job is not None and w.step is not None:
            lost = Lost(w.step, why, detail)
            w.stats.timeouts += why == "timeout"
            w.stats.crashes += why == "crash"
            w.results.extend(lost_result(w.job, lost, w.stats.info))
            w.left = [n for n in w.left if n not in lost.names]
        elif w.job is not None:
            w.setup_losses += 1
        self._start(w)
        if w.job is None:
            return
        if not w.left:
            self._finish(w, "", on_done)
        elif w.setup_losses >= SETUP_TRIES:
            self._finish(w, f"worker lost {w.setup_losses} times outside a candidate: {detail}", on_done)
        else:
            w.step = None  # sent again once the new worker is ready


__all__ = ["Job", "Lost", "Reporter", "SlotStats", "Supervisor", "serve", "short"]
