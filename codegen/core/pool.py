"""The one pool of worker processes that a hung or crashing job cannot stall (compile, tune,
validate). One worker per slot (a GPU, or a number), each given one job at a time; every step
of a job (a kernel to compile, a candidate config to measure) runs under a deadline. A worker
that overruns it or dies is killed and replaced, the step is reported lost (`timeout` or
`crash`) and the rest of the job goes on in the new worker.

Protocol over a pipe: the worker sends ("ready", info) once started (or ("fatal", text)), then
for each job ("begin", names) before a step, ("end", result) after it and ("done", error,
phases) at the end; the parent sends (payload, names still to do) or None to stop. `init` and
`handle` are top-level functions (spawned workers import them by name); `handle` may return a
dict of seconds per phase, summed per slot (`SlotStats.phases`).

Jobs come from an iterable, taken one per idle worker, or from a `Source` that chooses per
slot (tune's `Dispatch`: by each device's measured speed); `feed` (a connection) delivers more
while the pool runs (build's compile service). `start()` spawns the workers ahead, so they
start while the caller does something else (tune fills Triton's cache meanwhile).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing import spawn
from multiprocessing.connection import wait
from typing import Callable, Iterable, Iterator, Protocol

from codegen.core.errors import UpstreamError

START_TIMEOUT_S = 300.0  # a worker's start (imports, a GPU context)
SETUP_TRIES = 2  # a job whose worker is lost before its first step twice fails
START_TRIES = 3  # a slot whose worker dies or hangs at start this often in a row stops the run
_SPAWN_LOCK = threading.Lock()  # spawn's interpreter is process-wide: set around one start at a time


def short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
    return text[:200]


@dataclass
class Job:
    key: str  # its name in messages (a grid entry's, a kernel's)
    payload: object  # what the worker's handler gets, with the names still to do
    names: tuple[str, ...]  # the units its steps report (candidate configs), each exactly once
    cost: float = 1.0  # its expected seconds, relative to the other jobs (for a `Source`)
    group: str = ""  # jobs of one group share what a worker loads for them (a `Source` may keep them together)


@dataclass(frozen=True)
class Lost:
    names: tuple[str, ...]  # the step in flight
    why: str  # "timeout" or "crash"
    detail: str


@dataclass
class SlotStats:
    """What one slot (device) did: jobs finished, steps reported, seconds busy, steps lost, its
    worker's start, and the seconds its handler reported per phase."""

    slot: object
    info: dict = field(default_factory=dict)
    jobs: int = 0
    steps: int = 0
    busy_s: float = 0.0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    start_s: float = 0.0
    phases: dict = field(default_factory=dict)


class Source(Protocol):
    """Chooses the jobs: `take(i)` the next for the idle worker i (its index in the pool's
    slots; None: nothing for it now), `finished()` once nothing more will come, `done(i, job,
    seconds)` as each ends."""

    def take(self, worker: int) -> Job | None: ...

    def finished(self) -> bool: ...

    def done(self, worker: int, job: Job, seconds: float) -> None: ...


class _Lazy:
    """An iterable of jobs as a Source: one taken per idle worker, in order."""

    def __init__(self, jobs: Iterable[Job]):
        self._it: Iterator[Job] = iter(jobs)
        self._end = False

    def take(self, worker: int) -> Job | None:
        job = None if self._end else next(self._it, None)
        self._end = job is None
        return job

    def finished(self) -> bool:
        return self._end

    def done(self, worker: int, job: Job, seconds: float) -> None:
        pass


class Reporter:
    """The worker's side of a job: `begin(names)` before a step, `end(result)` after it."""

    def __init__(self, conn):
        self._conn = conn

    def begin(self, names) -> None:
        self._conn.send(("begin", tuple(names)))

    def end(self, result) -> None:
        self._conn.send(("end", result))


def serve(conn, slot, init: Callable, handle: Callable, args: tuple) -> None:
    """A worker's main loop (the spawned process's target). Ctrl-C is the parent's: it stops
    the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
            phases = None
            try:
                phases = handle(state, payload, names, report)
                err = ""
            except Exception as exc:  # the job fails; the worker goes on
                err = short(exc)
            conn.send(("done", err, phases if isinstance(phases, dict) else None))
    except (EOFError, BrokenPipeError):  # the parent is gone
        return


@dataclass
class _Worker:
    slot: object
    stats: SlotStats
    proc: object = None
    conn: object = None
    ready: bool = False
    spawned: float = 0.0
    started: float = 0.0  # when started, or when the step in flight began
    job: Job | None = None
    job_started: float = 0.0
    left: list = field(default_factory=list)  # names of the job not reported yet
    results: list = field(default_factory=list)
    step: tuple | None = None  # names of the step in flight
    setup_losses: int = 0
    start_failures: int = 0


class Pool:
    """Workers, one per slot of `slots` (the same slot twice: two workers on it), started by
    init(slot, *args) in a spawned process, given jobs through handle. `step_timeout_s` bounds
    each step, `setup_timeout_s` what a job does before its first step and after its last.
    `label` names the worker processes, `who(slot)` a worker in messages; `python` is the
    interpreter they run (None: this one); `check_ready(slot, info)` may refuse a started worker
    (raise); `fatal_hint` is the hint of the error when a worker cannot start."""

    def __init__(self, slots: list, init: Callable, handle: Callable, args: tuple, *, step_timeout_s: float,
                 setup_timeout_s: float, start_timeout_s: float = START_TIMEOUT_S, label: str = "worker",
                 who: Callable[[object], str] | None = None, python: str | None = None,
                 check_ready: Callable[[object, dict], None] | None = None, fatal_hint: str | None = None):
        self.slots = list(slots)
        self.init, self.handle, self.args = init, handle, args
        self.step_timeout_s = float(step_timeout_s)
        self.setup_timeout_s = float(setup_timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.label, self.python, self.check_ready, self.fatal_hint = label, python, check_ready, fatal_hint
        self.who = who or (lambda slot: f"{label} worker {slot}")
        self._ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- processes ---------------------------------------------------------------------------
    def start(self) -> "Pool":
        """Spawn every worker now (no waiting for them): they start while the caller goes on."""
        if not self.workers:
            self.workers = [_Worker(slot=s, stats=SlotStats(slot=s)) for s in self.slots]
            for w in self.workers:
                self._start(w)
        return self

    def wait_ready(self) -> list[SlotStats]:
        """Block until every worker has started (a worker that cannot start raises)."""
        self.start()
        while not all(w.ready for w in self.workers):
            self._poll(lambda *a: None, lambda *a: [], ())
        return [w.stats for w in self.workers]

    def _start(self, w: _Worker) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=serve, args=(child, w.slot, self.init, self.handle, self.args),
                                 daemon=True, name=f"mi100-codegen-{self.label}-{w.slot}")
        with _SPAWN_LOCK:
            if self.python is not None:
                spawn.set_executable(self.python)
            try:
                proc.start()
            finally:
                if self.python is not None:
                    spawn.set_executable(_DEFAULT_EXECUTABLE)
                child.close()
        w.proc, w.conn, w.ready, w.step = proc, parent, False, None
        w.spawned = w.started = time.monotonic()

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
        self.workers = []

    # ---- the run -----------------------------------------------------------------------------
    def run(self, jobs: Iterable[Job] | Source, on_done: Callable[[Job, list, str, SlotStats], None],
            lost_result: Callable[[Job, Lost, dict], list], *, feed=None,
            job_of: Callable[[object], Job] | None = None) -> list[SlotStats]:
        """Hand out `jobs` and call on_done(job, results, error, slot stats) in this process as
        each finishes, once the idle workers have their next job (so writing results overlaps
        the work); `results` holds every step's result, lost steps as lost_result(job, lost,
        worker info) gives them. `feed`: a connection delivering more (job_of(item) each; None
        closes it), the run ends once everything received is done. Closes the pool."""
        source = jobs if hasattr(jobs, "take") else _Lazy(jobs)
        fed: deque = deque()
        finished: deque = deque()
        try:
            self.start()
            index = {id(w.stats): i for i, w in enumerate(self.workers)}  # a replacement keeps its stats

            def done(job, results, err, stats, seconds):
                source.done(index[id(stats)], job, seconds)
                finished.append((job, results, err, stats))

            while True:
                handed = True
                while handed:  # until no idle worker takes one (a Source may give it to another first)
                    handed = False
                    for i, w in enumerate(self.workers):
                        if w.ready and w.job is None:
                            job = fed.popleft() if fed else None if source.finished() else source.take(i)
                            if job is not None:
                                w.job, w.job_started, w.left, w.results = job, time.monotonic(), list(job.names), []
                                w.setup_losses = 0
                                self._send(w)
                                handed = True
                while finished:
                    on_done(*finished.popleft())
                if feed is None and not fed and source.finished() and all(w.job is None for w in self.workers):
                    return [w.stats for w in self.workers]

                if self._poll(done, lost_result, (feed,) if feed is not None else ()):
                    try:
                        item = feed.recv()
                    except (EOFError, OSError):
                        item = None
                    if item is None:
                        feed = None
                    else:
                        fed.append(job_of(item) if job_of is not None else item)
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

    def _poll(self, on_done, lost_result, extra: tuple) -> bool:
        """Wait for the workers (and `extra`) at most until the nearest deadline; handle what
        came. True when `extra` has something to read."""
        now = time.monotonic()
        busy = [w for w in self.workers if w.job is not None or not w.ready]
        waits = [self._limit(w) - (now - w.started) for w in busy]
        tick = min([1.0, *waits]) if waits else 1.0
        ready = wait([w.conn for w in self.workers] + [w.proc.sentinel for w in self.workers] + list(extra),
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
        return any(x in ready for x in extra)

    def _message(self, w: _Worker, msg: tuple, on_done) -> None:
        kind = msg[0]
        if kind == "fatal":
            raise UpstreamError(f"a {self.who(w.slot)} could not start: {msg[1]}", hint=self.fatal_hint)
        if kind == "ready":
            if self.check_ready is not None:
                self.check_ready(w.slot, msg[1])
            w.ready, w.start_failures, w.stats.info = True, 0, msg[1]
            if not w.stats.start_s:
                w.stats.start_s = time.monotonic() - w.spawned
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
            for k, v in (msg[2] or {}).items():
                w.stats.phases[k] = w.stats.phases.get(k, 0.0) + float(v)
            self._finish(w, msg[1], on_done)

    def _finish(self, w: _Worker, err: str, on_done) -> None:
        job, results = w.job, w.results
        seconds = time.monotonic() - w.job_started
        w.stats.jobs += 1
        w.stats.busy_s += seconds
        w.job, w.results, w.left, w.step = None, [], [], None
        on_done(job, results, err, w.stats, seconds)

    def _lost(self, w: _Worker, why: str, detail: str, on_done, lost_result) -> None:
        """Kill and replace the worker; account for what it was doing."""
        self._stop(w)
        w.stats.restarts += 1
        if not w.ready:
            w.start_failures += 1
            if w.start_failures >= START_TRIES:
                raise UpstreamError(f"the {self.who(w.slot)} keeps failing at start: {detail}")
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
            self._finish(w, f"worker lost {w.setup_losses} times outside a step: {detail}", on_done)
        else:
            w.step = None  # sent again once the new worker is ready


_DEFAULT_EXECUTABLE = spawn.get_executable()

__all__ = ["Job", "Lost", "Pool", "Reporter", "SlotStats", "Source", "serve", "short"]
