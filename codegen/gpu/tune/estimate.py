"""How long a tuning run will take, before it starts (pure: no torch, no GPU).

A kernel's time is taken as proportional to its work: seqlen_q x seqlen_k x head dim x batch x
heads, halved for causal. The time per unit of work comes from rows measured so far (the run's
own measurements.csv), else from the proxy's committed table (the spec's shipped
measurements.csv), per (family, dtype), else per family; with neither, from DEFAULT_MS_PER_UNIT.
Each candidate then costs what `do_bench` spends on it (a first run, five to estimate, the
warm-up and the repetitions) plus a fixed overhead, and each entry its inputs and reference.

The entries are handed out longest first, each to the device that would finish it soonest
(`Dispatch`, by each device's measured speed; with equal speeds that is longest processing time
first, within 4/3 of the best split); `schedule` simulates it to give each device's share and
what fits in a budget.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from codegen.core.pool import Job
from codegen.gpu.tune.grid import GridEntry

# ms per unit of work (units: seqlen_q*seqlen_k*head_dim*batch*heads) with no measurement to go
# by: what the committed H200 rows give for the slowest family (bwd_kernel_fuse, fp16: 1.5e-10)
DEFAULT_MS_PER_UNIT = 1.5e-10
# fitted to two H200 runs (24 and 48 entries at seqlen 1024-2048, docs/measurements.md)
CANDIDATE_OVERHEAD_S = 0.01  # launch, check against the reference, bookkeeping
ENTRY_OVERHEAD_S = 0.1  # inputs, fp64 reference, the forward run that feeds the backward
DEFAULT_BATCH_HEADS = 64  # what the committed rows were measured with (batch 4 x 16 heads)


def work(entry: GridEntry, batch_heads: int = DEFAULT_BATCH_HEADS) -> float:
    units = entry.seqlen_q * entry.seqlen_k * entry.head_dim * batch_heads
    return units / 2 if entry.causal else units


@dataclass(frozen=True)
class CostModel:
    rates: dict  # (family, dtype) or (family,) -> ms per unit of work
    source: str  # where the rates come from, for the estimate's line
    warmup_ms: float = 10.0
    rep_ms: float = 50.0
    batch_heads: int = DEFAULT_BATCH_HEADS

    def kernel_ms(self, entry: GridEntry) -> float:
        rate = self.rates.get((entry.family, entry.dtype), self.rates.get((entry.family,), DEFAULT_MS_PER_UNIT))
        return rate * work(entry, self.batch_heads)

    def candidate_s(self, entry: GridEntry) -> float:
        t = self.kernel_ms(entry)
        return (6 * t + max(self.warmup_ms, t) + max(self.rep_ms, t)) / 1000 + CANDIDATE_OVERHEAD_S

    def entry_s(self, entry: GridEntry, n_candidates: int) -> float:
        return ENTRY_OVERHEAD_S + n_candidates * self.candidate_s(entry)


def _entry_of(row: dict) -> GridEntry | None:
    try:
        return GridEntry(row["family"], "", row["dtype"], int(row["head_dim"]), bool(int(row["causal"])),
                         bool(int(row["dropout"])), bool(int(row["bias"])), int(row["seqlen_q"]),
                         int(row["seqlen_k"]))
    except (KeyError, TypeError, ValueError):
        return None


def fit_rates(rows: list[dict]) -> dict:
    """Median ms per unit of work of the passing rows, per (family, dtype) and per family."""
    per: dict[tuple, list[float]] = {}
    for r in rows:
        e, t = _entry_of(r), r.get("time_ms")
        if r.get("status") != "ok" or e is None or not isinstance(t, (int, float)) or t <= 0:
            continue
        rate = float(t) / work(e)
        per.setdefault((e.family, e.dtype), []).append(rate)
        per.setdefault((e.family,), []).append(rate)
    return {k: statistics.median(v) for k, v in per.items()}


def cost_model(measured: list[dict], proxy: list[dict], proxy_label: str, *, warmup_ms: float,
               rep_ms: float, batch_heads: int) -> CostModel:
    """Rates from the rows measured so far, else the proxy's table, else the default."""
    for rows, label in ((measured, f"{len(measured)} rows measured so far"), (proxy, proxy_label)):
        rates = fit_rates(rows)
        if rates:
            return CostModel(rates, label, warmup_ms, rep_ms, batch_heads)
    return CostModel({}, "a default rate (nothing measured yet)", warmup_ms, rep_ms, batch_heads)


class Dispatch:
    """The entries' hand-out, a `codegen.core.pool.Source`: jobs longest (by `Job.cost`, their
    estimated seconds) first, each to a worker that would finish it no later than any other
    would. Each worker's speed is measured as it goes (its seconds over the estimates of the
    jobs it finished), so a slower device (a mixed rig) takes fewer and smaller entries and
    leaves the long ones to the faster, rather than taking the same share. A worker whose job
    overran its projection counts as not free soon. Among the jobs it may take, a worker takes
    one of a group it already has (`Job.group`: entries whose kernels it has loaded) first,
    else one of a group no worker has, else another's (at the end). `stop()` ends the
    hand-out (a budget)."""

    def __init__(self, jobs: list[Job], workers: int, *, stop: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.pending = sorted(jobs, key=lambda j: -j.cost)  # stable: ties keep the given order
        self.n = max(1, workers)
        self.stop, self.clock = stop, clock
        self.stopped = False
        self._busy: dict[int, tuple[Job, float]] = {}  # worker -> (job, when it started)
        self._took = [0.0] * self.n  # seconds of the jobs each worker finished
        self._est = [0.0] * self.n  # and their estimates
        self._owner: dict[str, int] = {}  # group -> the worker that took it first

    def speed(self, w: int) -> float:
        """Seconds per estimated second: measured, else the median of the measured ones, else 1."""
        if self._est[w] > 0:
            return self._took[w] / self._est[w]
        known = [t / e for t, e in zip(self._took, self._est) if e > 0]
        return statistics.median(known) if known else 1.0

    def _free_in(self, w: int, now: float) -> float:
        if w not in self._busy:
            return 0.0
        job, started = self._busy[w]
        left = started + job.cost * self.speed(w) - now
        return left if left >= 0 else math.inf  # overrunning: when it frees is unknown

    def _longest(self, w: int, now: float) -> float:
        """The longest job w finishes no later than any other worker would: cost * speed(w) <=
        free_in(o) + cost * speed(o) for every other o."""
        mine, limit = self.speed(w), math.inf
        for o in range(self.n):
            sp = self.speed(o)
            if o != w and mine > sp:
                limit = min(limit, self._free_in(o, now) / (mine - sp))
        return limit

    def take(self, w: int) -> Job | None:
        if self.finished():
            return None
        if self.stop is not None and self.stop():
            self.stopped = True
            return None
        now = self.clock()
        limit = self._longest(w, now)
        first = new = pick = None
        for k, job in enumerate(self.pending):
            if job.cost > limit:
                continue
            owner = self._owner.get(job.group) if job.group else None
            if owner == w:
                pick = k
                break
            first = k if first is None else first
            new = k if new is None and owner is None else new
        pick = pick if pick is not None else new if new is not None else first
        if pick is None:
            return None  # a faster worker frees soon enough to finish each of them first
        job = self.pending.pop(pick)
        if job.group:
            self._owner.setdefault(job.group, w)
        self._busy[w] = (job, now)
        return job

    def finished(self) -> bool:
        return self.stopped or not self.pending

    def done(self, w: int, job: Job, seconds: float) -> None:
        self._busy.pop(w, None)
        if job.cost > 0:
            self._took[w] += seconds
            self._est[w] += job.cost


@dataclass(frozen=True)
class Schedule:
    order: list  # entries, longest first
    loads_s: list  # estimated seconds per device
    fits: int  # entries started within the budget (all when there is none)
    total_s: float
    costs: dict  # entry -> its estimated seconds


def schedule(entries: list[GridEntry], cost: Callable[[GridEntry], float], devices: int,
             budget_s: float | None = None) -> Schedule:
    """The run's hand-out (`Dispatch`) simulated with every device at the estimated speed: the
    order entries go out in, each device's estimated time, and how many entries start within
    `budget_s`."""
    costs = {e: cost(e) for e in entries}
    order = sorted(entries, key=lambda e: (-costs[e], e.name))
    now = [0.0]
    n = max(1, devices)
    hand = Dispatch([Job(e.name, e, (), costs[e]) for e in order], n, clock=lambda: now[0])
    heap = [(0.0, d) for d in range(n)]
    loads = [0.0] * n
    running: dict[int, Job] = {}
    fits = 0
    while heap:
        now[0], d = heapq.heappop(heap)
        if d in running:
            job = running.pop(d)
            hand.done(d, job, job.cost)
        job = hand.take(d)
        if job is None:
            continue
        fits += budget_s is None or now[0] <= budget_s
        running[d] = job
        loads[d] = now[0] + job.cost
        heapq.heappush(heap, (loads[d], d))
    return Schedule(order, loads, fits, sum(costs.values()), costs)


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def summary_line(n_entries: int, n_candidates: int, sched: Schedule, model: CostModel,
                 budget_min: float | None) -> str:
    """The first line of a run (and of --dry-run): entries, candidates, GPU time per device."""
    per = ", ".join(f"device {i}: {duration(s)}" for i, s in enumerate(sched.loads_s))
    line = (f"plan: {n_entries} entries, {n_candidates} candidate measurements; estimated GPU time "
            f"{duration(sched.total_s)} ({per}; from {model.source})")
    if budget_min is not None and sched.fits < n_entries:
        line += f"; --budget-min {budget_min:g} starts about {sched.fits} of them"
    return line
