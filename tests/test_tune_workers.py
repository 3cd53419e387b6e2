"""tune's worker processes on the CPU, with stand-in workers (no torch, no GPU): a candidate that
hangs is killed at its deadline and recorded `timeout`, a worker that dies mid-entry is replaced
and the candidate recorded `crash`, the entry goes on in the new worker; entries spread over
several devices give the same winners as one device; the run hands entries out longest first.
The same on a real GPU, with an infinite-loop Triton kernel: tests/test_tune_gpu.py."""

from __future__ import annotations

import os
import signal
import time

import pytest

from codegen.core.errors import UpstreamError
from codegen.formats.spec import load_spec
from codegen.gpu.tune import runner
from codegen.gpu.tune.estimate import schedule
from codegen.gpu.tune.grid import GridEntry, GridFilter, plan_tuning
from codegen.gpu.tune.store import Provenance, ResultStore, config_columns, entry_columns
from codegen.core.pool import Job, Pool

PROV = Provenance("Stand-in GPU", "nvidia-proxy", "3.6.0", "2.11.0", "2026-11-26")
HANG = "M64N32.wpe1."  # the stand-in hangs on this candidate of entries with seqlen 4096
CRASH = "M128N64.wpe1."  # and dies (SIGKILL, as the OOM killer would) on this one of causal entries
SETTINGS = runner.Settings(timeout_s=2.0, setup_timeout_s=20.0)


def stand_in_init(slot, aotriton_dir, target_arch):
    return slot, {"prov": PROV, "device": f"stand-in {slot}"}


def _time_ms(entry: GridEntry, name: str) -> float:
    """Deterministic: the same on every device, so winners do not depend on the split."""
    return round(entry.seqlen_q / 1000 + sum(map(ord, name)) % 97 / 100, 4)


def stand_in_handle(slot, job, names, report):
    entry, configs, gpu, s = job
    for c in configs:
        if c.name not in names:
            continue
        report.begin([c.name])
        if HANG in c.name and entry.seqlen_q == 4096:
            time.sleep(3600)
        if CRASH in c.name and entry.causal:
            os.kill(os.getpid(), signal.SIGKILL)
        report.end([{**entry_columns(entry, gpu), **config_columns(c), "status": "ok",
                     "time_ms": _time_ms(entry, c.name), "errors": "out=0/1", "same_kernel_as": "",
                     **PROV.as_dict(), "device": f"stand-in {slot}"}])


def quiet_handle(slot, job, names, report):
    """Like stand_in_handle, minus the hang and the crash."""
    entry, configs, gpu, s = job
    for c in configs:
        if c.name in names:
            report.begin([c.name])
            report.end([{**entry_columns(entry, gpu), **config_columns(c), "status": "ok",
                         "time_ms": _time_ms(entry, c.name), "errors": "out=0/1", "same_kernel_as": "",
                         **PROV.as_dict()}])


def setup_dies_handle(slot, job, names, report):
    entry = job[0]
    if entry.seqlen_q == 1024:
        os._exit(3)  # before any candidate: a broken entry
    quiet_handle(slot, job, names, report)


def fatal_init(slot, aotriton_dir, target_arch):
    raise RuntimeError("no such device")


@pytest.fixture(scope="module")
def plan():
    return plan_tuning(load_spec(None).spec, GridFilter(families=("attn_fwd",), dtypes=("fp16",), head_dims=(64,),
                                                        seqlens=(1024, 4096), square_only=True, dropout=False,
                                                        bias=False))


def _run(plan, devices, handle, tmp_path, entries=None):
    got, where = {}, {}

    def on_result(entry, rows, err, device):
        got[entry.name] = (rows, err)
        where[entry.name] = device

    stats = runner.run_entries(tmp_path, "gfx908", "gfx908_mod0",
                               ((e, plan.configs_for(e)) for e in (entries or plan.entries)), SETTINGS, devices,
                               on_result, init=stand_in_init, handle=handle)
    return got, where, stats


def test_a_hang_and_a_killed_worker_cost_one_candidate_each(plan, tmp_path):
    got, where, stats = _run(plan, [0, 1], stand_in_handle, tmp_path)
    assert sorted(got) == sorted(e.name for e in plan.entries)
    for e in plan.entries:
        rows, err = got[e.name]
        assert not err, err
        names = [r["config"] for r in rows]
        assert sorted(names) == sorted(c.name for c in plan.configs_for(e)), e.name  # each exactly once
        status = {r["config"]: r["status"] for r in rows}
        hang = {n for n in names if HANG in n} if e.seqlen_q == 4096 else set()
        crash = {n for n in names if CRASH in n} if e.causal else set()
        assert {n for n, st in status.items() if st == "timeout"} == hang, e.name
        assert {n for n, st in status.items() if st == "crash"} == crash, e.name
        assert all(st == "ok" for n, st in status.items() if n not in hang | crash)
        lost = [r for r in rows if r["status"] in ("timeout", "crash")]
        assert all(r["time_ms"] == "" and r["device"] == "Stand-in GPU" for r in lost)
        assert all("no result after 2 s" in r["errors"] for r in rows if r["status"] == "timeout")
        assert all("worker died" in r["errors"] for r in rows if r["status"] == "crash")
        with ResultStore(tmp_path / "out") as store:  # a lost candidate is never the winner
            w = store.record(e, rows, len(rows))
        assert w is not None and w["config"] not in hang | crash
    # 2 entries at 4096 hang once each, 2 causal entries crash once each; every loss restarts its worker
    assert sum(s.timeouts for s in stats) == 2 and sum(s.crashes for s in stats) == 2
    assert sum(s.restarts for s in stats) == 4
    assert sum(s.jobs for s in stats) == len(plan.entries)
    assert {s.slot for s in stats} == {0, 1} and set(where.values()) <= {0, 1}
    assert [s.info["device"] for s in stats] == ["stand-in 0", "stand-in 1"]


def test_several_devices_give_the_winners_of_one(plan, tmp_path):
    winners = {}
    for devices in ([0], [0, 1, 2]):
        got, where, stats = _run(plan, devices, quiet_handle, tmp_path)
        out = tmp_path / f"out{len(devices)}"
        with ResultStore(out) as store:
            for e in plan.entries:
                store.record(e, got[e.name][0], len(got[e.name][0]))
        winners[len(devices)] = [(w["entry"], w["config"], w["time_ms"]) for w in store.winners]
        assert sum(s.jobs for s in stats) == len(plan.entries)
        assert set(where.values()) <= set(devices)
    assert winners[1] == winners[3] and len(winners[1]) == len(plan.entries)


def test_an_entry_whose_worker_dies_before_any_candidate_fails_alone(plan, tmp_path):
    got, _, stats = _run(plan, [0], setup_dies_handle, tmp_path)
    for e in plan.entries:
        rows, err = got[e.name]
        if e.seqlen_q == 1024:
            assert rows == [] and "worker lost 2 times outside a step" in err
        else:
            assert not err and len(rows) == len(plan.configs_for(e))


def test_a_worker_that_cannot_start_stops_the_run(plan, tmp_path):
    with pytest.raises(UpstreamError, match="could not start: RuntimeError: no such device"):
        runner.run_entries(tmp_path, "gfx908", "gfx908_mod0", ((e, plan.configs_for(e)) for e in plan.entries),
                           SETTINGS, [0], lambda *a: None, init=fatal_init, handle=quiet_handle)


def test_jobs_are_taken_lazily(tmp_path):
    """Nothing is taken before a worker is free (a budget check in the job iterator holds); a
    finished job's results are handled once the worker has its next one."""
    taken = []

    def jobs():
        for i in range(3):
            taken.append(i)
            yield Job(f"j{i}", ("x",), ())

    done = []
    pool = Pool([0], stand_in_init, _noop_handle, (tmp_path, "gfx908"), step_timeout_s=5, setup_timeout_s=5)
    pool.run(jobs(), lambda job, res, err, st: done.append((job.key, len(taken))), lambda *a: [])
    assert done == [("j0", 2), ("j1", 3), ("j2", 3)]


def _noop_handle(slot, job, names, report):
    pass


def test_schedule_is_longest_first_to_the_least_loaded_device():
    e = {n: GridEntry("attn_fwd", "gfx908", "fp16", 64, False, False, False, n, n) for n in (16, 32, 64, 128, 256)}
    cost = {16: 3.0, 32: 3.0, 64: 3.0, 128: 4.0, 256: 5.0}
    sched = schedule(list(e.values()), lambda x: cost[x.seqlen_q], 2)
    assert [x.seqlen_q for x in sched.order] == [256, 128, 16, 32, 64]  # ties by name
    assert sched.loads_s == [8.0, 10.0] and sched.total_s == 18.0  # 5+3 | 4+3+3
    one = schedule(list(e.values()), lambda x: cost[x.seqlen_q], 1, budget_s=7.0)
    assert one.loads_s == [18.0] and one.fits == 2  # they start at 0, 5, 9, 12, 15 s: two within 7 s


def test_warm_jobs_cover_candidates_and_each_entrys_inputs(plan):
    sp = load_spec(None).spec
    full = plan_tuning(sp, GridFilter(families=("attn_fwd", "bwd_kernel_dq", "bwd_kernel_fuse"), dtypes=("fp16",),
                                      head_dims=(64,), seqlens=(1024, 4096), square_only=True, causal=False))
    jobs = runner.warm_jobs(full.entries, full.configs_for, "hip")
    kinds = {}
    for entry, cfg in jobs:
        kinds.setdefault((entry.family, entry.dropout, entry.bias), []).append((entry.seqlen_q, cfg))
    for (family, dropout, bias), got in kinds.items():
        n = len(full.configs_for(next(e for e in full.entries if e.family == family)))
        inputs = [sq for sq, cfg in got if cfg is None]  # what runs before the candidates
        seqlens = 2 if family == "bwd_kernel_fuse" else 1  # seqlens are constexprs of the fused kernel only
        assert len(got) == seqlens * (n + (family != "attn_fwd" or dropout)), (family, dropout, bias)
        assert len(inputs) == (seqlens if family != "attn_fwd" or dropout else 0)



# ---- the hand-out by measured speed (a mixed rig) --------------------------------------------
def _simulate(costs: list[float], speeds: list[float], groups: list[str] | None = None, loaded: set | None = None):
    """Dispatch driven by a virtual clock, worker w taking cost * speeds[w] seconds for a job.
    -> (estimated seconds each worker did, when the last job ended); `loaded` gets each
    (worker, group) pair."""
    import heapq

    from codegen.gpu.tune.estimate import Dispatch

    now = [0.0]
    groups = groups or [""] * len(costs)
    hand = Dispatch([Job(f"j{i:03d}", g, (), c, g) for i, (c, g) in enumerate(zip(costs, groups))], len(speeds),
                    clock=lambda: now[0])
    loaded = set() if loaded is None else loaded
    work = [0.0] * len(speeds)
    events, running, idle = [], {}, set(range(len(speeds)))
    while True:
        handed = True
        while handed:  # as the pool asks: every idle worker, until none takes one
            handed = False
            for w in sorted(idle):
                job = hand.take(w)
                if job is not None:
                    idle.discard(w)
                    running[w] = (job, now[0])
                    heapq.heappush(events, (now[0] + job.cost * speeds[w], w))
                    work[w] += job.cost
                    loaded.add((w, job.payload))
                    handed = True
        if not events:
            assert hand.finished() and not running
            return work, now[0]
        now[0], w = heapq.heappop(events)
        job, began = running.pop(w)
        hand.done(w, job, now[0] - began)
        idle.add(w)


SLICE = [3.0] * 8 + [1.5] * 24 + [0.8] * 40 + [0.3] * 120  # estimated seconds: few long, many short


def test_a_slower_device_gets_less_work_not_the_same_share():
    """A mixed rig: device 3 takes 2.5 times as long for the same work. It ends up with about
    its share of the throughput (0.4 of a fast one's), and the run ends within 10 % of the
    best any split could do; handing out by count (the same share each) would take 2.5x."""
    speeds = [1.0, 1.0, 1.0, 2.5]
    work, end = _simulate(SLICE, speeds)
    assert sum(work) == pytest.approx(sum(SLICE))
    fast = sum(work[:3]) / 3
    assert 0.25 * fast < work[3] < 0.55 * fast, work
    best = sum(SLICE) / sum(1 / sp for sp in speeds)  # every device busy to the same end
    assert end < 1.1 * best, (end, best)
    same_share = max(sum(SLICE[w::4]) * sp for w, sp in enumerate(speeds))
    assert same_share > 2 * best
    even, even_end = _simulate(SLICE, [1.0] * 4)  # equal devices: equal shares, as longest-first gives
    assert max(even) - min(even) <= max(SLICE) and even_end < 1.05 * sum(SLICE) / 4


def test_entries_that_share_kernels_stay_on_one_device():
    """96 kernel groups of 3 entries (seqlens 4096, 2048, 1024) on 4 devices: each group's
    kernels are loaded by about one device (handed out by length alone, 2.3 each), and the run
    still ends within 5 % of the best split."""
    costs = [c * (1 + (g % 7) / 20) for g in range(96) for c in (1.0, 0.6, 0.4)]
    groups = [f"g{g}" for g in range(96) for _ in range(3)]
    together: set = set()
    _, end = _simulate(costs, [1.0] * 4, groups, together)
    assert len(together) <= 1.1 * 96, len(together)
    assert end < 1.05 * sum(costs) / 4, (end, sum(costs) / 4)
    import heapq  # by length alone, each to the device that frees first

    heap, seen = [(0.0, w) for w in range(4)], set()
    for c, g in sorted(zip(costs, groups), key=lambda x: -x[0]):
        t, w = heapq.heappop(heap)
        seen.add((w, g))
        heapq.heappush(heap, (t + c, w))
    assert len(seen) > 2 * 96, len(seen)


def test_a_slow_device_waits_rather_than_take_a_job_a_fast_one_finishes_sooner():
    """Device 1 is known to be 4 times slower. While device 0 runs a long job that ends in 1 s,
    device 1 takes nothing (device 0 would finish each job sooner); once device 0 has the
    next long one, device 1 takes the short one."""
    from codegen.gpu.tune.estimate import Dispatch

    now = [0.0]
    hand = Dispatch([Job("x", None, (), 8.0), Job("y", None, (), 8.0), Job("z", None, (), 1.0)], 2,
                    clock=lambda: now[0])
    hand.done(0, Job("p", None, (), 1.0), 1.0)  # measured: device 0 takes 1 s per estimated second
    hand.done(1, Job("q", None, (), 1.0), 4.0)  # device 1 takes 4
    assert hand.take(0).key == "x"
    now[0] = 7.0
    assert hand.take(1) is None  # y: 32 s here against 1 + 8 there; z: 4 s here against 1 + 1
    now[0] = 8.0
    hand.done(0, Job("x", None, (), 8.0), 8.0)
    assert hand.take(0).key == "y" and hand.take(1).key == "z"
    assert hand.finished()


def speed_init(slot, aotriton_dir, target_arch):
    return slot, {"prov": PROV, "device": f"stand-in {slot}"}


def speed_handle(slot, job, names, report):
    """Device 1 is four times as slow as device 0 (each entry: its cost in tenths of seconds)."""
    entry, configs, gpu, s = job
    time.sleep(_cost(entry) * (4 if slot == 1 else 1))
    for c in configs:
        if c.name in names:
            report.begin([c.name])
            report.end([{**entry_columns(entry, gpu), **config_columns(c), "status": "ok", "time_ms": 1.0,
                         "errors": "", "same_kernel_as": "", **PROV.as_dict()}])


def _cost(entry: GridEntry) -> float:
    return entry.seqlen_q / 4096 * 0.2


def test_the_run_hands_out_by_measured_device_speed(tmp_path):
    """The same through the worker processes: the slower device finishes fewer entries."""
    entries = [GridEntry("attn_fwd", "gfx908", "fp16", 64, c, False, False, sq, sq)
               for sq in (1024, 2048, 4096) for c in (False, True)] * 3
    entries = [GridEntry(e.family, e.arch, e.dtype, e.head_dim, e.causal, e.dropout, e.bias, e.seqlen_q + i,
                         e.seqlen_k + i) for i, e in enumerate(entries)]  # 18 distinct names
    where = {}
    stats = runner.run_entries(tmp_path, "gfx908", "gfx908_mod0", [(e, []) for e in entries], SETTINGS, [0, 1],
                               lambda e, rows, err, dev: where.__setitem__(e.name, dev), init=speed_init,
                               handle=speed_handle, cost=_cost)
    assert len(where) == len(entries)
    work = {d: sum(_cost(e) for e in entries if where[e.name] == d) for d in (0, 1)}
    assert work[1] < 0.5 * work[0], work
    assert stats[1].jobs < stats[0].jobs
