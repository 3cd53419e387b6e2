"""GPU side of `tune`: measure grid entries in worker processes (one per GPU, each candidate
under a deadline: the one pool, `codegen.core.pool`), handed out by measured device speed
(`estimate.Dispatch`); Triton's cache is compiled in parallel first, while the measuring workers
start. Imports torch/triton lazily (through `.kernels`), in the workers."""

from __future__ import annotations

import datetime
import importlib.util
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from codegen.core.pool import Job, Lost, Pool, SlotStats, short
from codegen.models import KernelConfig
from codegen.gpu.tune.estimate import Dispatch
from codegen.gpu.tune.grid import GridEntry, group_effective
from codegen.gpu.tune.store import Provenance, config_columns, entry_columns


@dataclass(frozen=True)
class Settings:
    batch: int = 4
    heads: int = 16
    check_heads: int = 2
    warmup_ms: int = 10
    rep_ms: int = 50
    fwd_for_bwd: tuple[int, int] = (64, 32)  # tile of the fwd run that feeds the bwd kernels
    dropout_p: float = 0.5  # of dropout entries (upstream's tuner measures them at 0.5 too)
    timeout_s: float = 120.0  # one candidate: launch, check, timing (and its compile on a cache miss)
    setup_timeout_s: float = 600.0  # an entry's inputs and fp64 reference, a worker's start


def provenance(target_arch: str) -> Provenance:
    # import-time dependency: torch and triton, optional, GPU machines only (.kernels imports both)
    import torch
    import triton

    from codegen.gpu.tune.kernels import device_info

    name, proxy = device_info(target_arch)
    return Provenance(device=name, proxy=proxy, triton=triton.__version__,
                      torch=torch.__version__.split("+")[0],
                      date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))


def entry_problem(entry: GridEntry, s: Settings, batch: int, heads: int, seqlens: tuple[int, int],
                  seed: int, device: str = "cuda"):
    """The problem of an entry (its dtype, head dim, causal, dropout and bias), sized as asked."""
    from codegen.gpu.tune.kernels import make_problem  # import-time dependency: torch, triton, optional

    return make_problem(entry.dtype, batch, heads, seqlens[0], seqlens[1], entry.head_dim, entry.causal,
                        seed, device=device, dropout_p=s.dropout_p if entry.dropout else 0.0,
                        bias=entry.bias)


def _row(entry: GridEntry, gpu: str, cfg: KernelConfig, rep: str, prov: Provenance, status: str,
         t_ms, errs: str) -> dict:
    return {**entry_columns(entry, gpu), **config_columns(cfg), "status": status,
            "time_ms": t_ms if t_ms is not None else "", "errors": errs,
            "same_kernel_as": "" if cfg.name == rep else rep, **prov.as_dict()}


def _kernel_kind(entry: GridEntry) -> tuple:
    """What Triton compiles an entry's kernels for, besides the config: entries of one kind share them."""
    kind = (entry.family, entry.dtype, entry.head_dim, entry.causal, entry.dropout, entry.bias)
    return kind + ((entry.seqlen_q, entry.seqlen_k) if entry.family == "bwd_kernel_fuse" else ())


_LOADED: set = set()  # (kind, config) of the kernels this worker process has launched


class _Phases:
    """Seconds per phase (`lap(name)`: the time since the last lap) and counts, added to a dict."""

    def __init__(self, into: dict):
        self.into, self.t = into, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.add(name, now - self.t)
        self.t = now

    def add(self, name: str, n: float = 1) -> None:
        self.into[name] = self.into.get(name, 0) + n


def _candidate(tk, entry: GridEntry, p, rep: KernelConfig, bwd, refs, s: Settings, ph: _Phases):
    """(status, time in ms or None, errors) of one kernel: launched once, checked, timed if it passes."""
    import torch  # import-time dependency: torch, optional (loaded by the caller already)
    from codegen.gpu.tune.kernels import bench, check

    try:
        launch, outs = tk.launcher(entry.family, p, rep, bwd)
        launch()
        torch.cuda.synchronize()
        key = (_kernel_kind(entry), rep.name)
        ph.lap("launch" if key in _LOADED else "cache load")
        ph.add("cache loads", key not in _LOADED)
        _LOADED.add(key)
        ok, errs = check(outs, refs, s.check_heads, entry.dtype)
        ph.lap("check")
        if not ok:
            return "numerics", None, errs

        def counted():
            ph.add("timing launches")
            launch()

        t_ms = bench(counted, s.warmup_ms, s.rep_ms)
        ph.lap("timing")
        ph.add("timed")
        if not math.isfinite(t_ms):  # never a NaN into the CSVs or the overlay
            return "bad time", None, f"benchmark returned {t_ms}"
        return "ok", t_ms, errs
    except torch.cuda.OutOfMemoryError as exc:
        return "oom", None, short(exc)
    except Exception as exc:  # compile failures, out of resources, launch errors
        return "error", None, short(exc)


def measure_entry(tk, entry: GridEntry, configs: list[KernelConfig], s: Settings, gpu: str,
                  prov: Provenance, report=None, phases: dict | None = None) -> list[dict]:
    """Rows of every config: checked against fp64, timed when they pass. `report` (a worker's
    `Reporter`) hears of each kernel before it runs and gets its rows after; `phases` gets the
    seconds spent per phase added (inputs, reference, cache load: a kernel's first launch in
    this process, launch, check, timing) and counts (cache loads, timed, timing launches)."""
    # import-time dependency: torch, optional, GPU machines only (.kernels imports triton)
    import torch
    from codegen.gpu.tune.kernels import reference, seed_of

    ph = _Phases({} if phases is None else phases)
    p = entry_problem(entry, s, s.batch, s.heads, (entry.seqlen_q, entry.seqlen_k), seed_of(entry.name))
    keep = tk.dropout_keep(p, s.check_heads) if entry.dropout else None
    bwd = tk.bwd_inputs(p, s.fwd_for_bwd) if entry.family != "attn_fwd" else (None, None, None)
    torch.cuda.synchronize()
    ph.lap("inputs")
    refs = reference(p, s.check_heads, want_grads=entry.family != "attn_fwd", keep=keep)
    torch.cuda.synchronize()
    ph.lap("reference")
    rows: list[dict] = []
    for group in group_effective(configs, tk.backend):
        rep = group[0]
        if report is not None:
            report.begin([c.name for c in group])
        ph.lap("other")
        status, t_ms, errs = _candidate(tk, entry, p, rep, bwd, refs, s, ph)
        group_rows = [_row(entry, gpu, c, rep.name, prov, status, t_ms, errs) for c in group]
        rows += group_rows
        if report is not None:
            report.end(group_rows)
    del p, refs, keep, bwd
    torch.cuda.empty_cache()
    ph.lap("other")
    return rows


def lost_rows(entry: GridEntry, configs: list[KernelConfig], lost: Lost, gpu: str, prov: Provenance) -> list[dict]:
    """The rows of a candidate whose worker hung (`timeout`) or died (`crash`): never winners."""
    by_name = {c.name: c for c in configs}
    return [_row(entry, gpu, by_name[n], lost.names[0], prov, lost.why, None, lost.detail) for n in lost.names]


# ---- worker processes: compile-cache warm-up and measuring ------------------------------
def warm_init(slot, aotriton_dir: str):
    # import-time dependency: torch and triton, optional, in the worker process (.kernels imports both)
    from codegen.gpu.tune.kernels import TreeKernels

    return TreeKernels(Path(aotriton_dir)), {}


def candidate_launch(tk, like: GridEntry, cfg: KernelConfig, s: Settings, device: str = "cuda"):
    """The launch of candidate `cfg` for entries like `like`, not run: on the meta device (the
    compile warm-up) it has the real problem's shapes, strides and dtypes, so every
    specialisation Triton keys its cache by is the real one, and it takes no memory."""
    import torch  # import-time dependency: torch, optional, in the worker process (loaded there by .kernels already)

    p = entry_problem(like, s, s.batch, s.heads, (like.seqlen_q, like.seqlen_k), 0, device=device)
    bwd = (None, None, None)
    if like.family != "attn_fwd":  # o, L, delta as the entry has them (their layout is what counts)
        _, o, L = tk.fwd_launcher(p, *s.fwd_for_bwd, False, tk.opts(4, 1, 1))
        bwd = (o, L, torch.empty_like(L))
    return tk.launcher(like.family, p, cfg, bwd)[0]


def warm_handle(tk, job: tuple, names, report) -> None:
    """Compile the kernels of one job (nothing runs on the GPU) so the measuring workers find them
    in Triton's disk cache: a candidate config, or (config None) what an entry runs before its
    candidates (the forward and bwd_preprocess that feed the backward, the dropout mask)."""
    like, cfg, s = job
    report.begin(names)
    try:
        if cfg is not None:
            candidate_launch(tk, like, cfg, s, "meta").compile()
        else:
            p = entry_problem(like, s, s.batch, s.heads, (like.seqlen_q, like.seqlen_k), 0, device="meta")
            if like.family != "attn_fwd":
                tk.bwd_inputs(p, s.fwd_for_bwd, compile_only=True)
            if like.dropout:
                tk.dropout_keep(p, s.check_heads, compile_only=True)
        err = ""
    except Exception as exc:  # the measuring run reports it per entry
        err = short(exc)
    report.end((cfg.name if cfg is not None else f"{like.name} (inputs)", err))


def warm_jobs(entries: Iterable[GridEntry], configs_for: Callable, backend: str) -> list[tuple]:
    """Distinct (entry standing for its kernels, representative config or None for the kernels
    that make its inputs) the entries will compile. Seqlens are constexprs of bwd_kernel_fuse
    only; elsewhere the first entry's stand for all (Triton keys the others by divisibility)."""
    jobs: dict = {}
    for e in entries:
        kind = (e.family, e.dtype, e.head_dim, e.causal, e.dropout, e.bias)
        kind += (e.seqlen_q, e.seqlen_k) if e.family == "bwd_kernel_fuse" else ()
        if e.family != "attn_fwd" or e.dropout:
            jobs.setdefault((kind, ""), (e, None))
        for group in group_effective(configs_for(e), backend):
            jobs.setdefault((kind, group[0].name), (e, group[0]))
    return [jobs[k] for k in sorted(jobs)]


def warm_compile(aotriton_dir: Path, jobs: list[tuple], s: Settings, workers: int,
                 on_done: Callable[[str, str], None]) -> None:
    """Compile `jobs` in `workers` processes, each compile under the candidate deadline."""
    if not jobs or workers < 1:
        return

    def done(job, results, err, _stats):
        for name, e in results or [(job.key, err)]:
            on_done(name, e or err)

    pool = Pool(list(range(min(workers, len(jobs)))), warm_init, warm_handle, (str(aotriton_dir),),
                step_timeout_s=s.timeout_s, setup_timeout_s=s.setup_timeout_s, label="tune-compile",
                who=lambda slot: f"tune compile worker {slot}")
    named = ((like, cfg, cfg.name if cfg is not None else f"{like.name} (inputs)") for like, cfg in jobs)
    pool.run((Job(name, (like, cfg, s), (name,)) for like, cfg, name in named), done,
             lambda job, lost, info: [(lost.names[0], f"{lost.why}: {lost.detail}")])


def measure_init(device_index: int, aotriton_dir: str, target_arch: str):
    """A measuring worker's state on its GPU: the tree's kernels and the provenance of its rows."""
    # import-time dependency: torch, optional, GPU machines only (.kernels imports triton)
    import torch
    from codegen.gpu.tune.kernels import TreeKernels

    torch.cuda.set_device(device_index)
    torch.empty(1, device="cuda")  # the GPU context, made now: at start, not in the first entry
    prov = provenance(target_arch)
    return (TreeKernels(Path(aotriton_dir)), prov), {"prov": prov, "device": prov.device}


def measure_handle(state, job: tuple, names, report) -> dict:
    tk, prov = state
    entry, configs, gpu, s = job
    todo = set(names)
    phases: dict = {}
    measure_entry(tk, entry, [c for c in configs if c.name in todo], s, gpu, prov, report, phases)
    return phases


def missing_gpu_stack() -> list[str]:
    return [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]


def backend_name() -> str:
    from codegen.gpu.tune.kernels import backend  # import-time dependency: torch, triton, optional

    return backend()


def visible_gpus() -> int:
    import torch  # import-time dependency: torch, optional

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_entries(aotriton_dir: Path, target_arch: str, gpu: str,
                work: Iterable[tuple[GridEntry, list[KernelConfig]]], s: Settings, devices: list[int],
                on_result: Callable[[GridEntry, list[dict], str, object], None], *,
                init: Callable = measure_init, handle: Callable = measure_handle,
                cost: Callable[[GridEntry], float] | None = None, stop: Callable[[], bool] | None = None,
                meanwhile: Callable[[Pool], None] | None = None) -> list[SlotStats]:
    """Measure each (entry, configs) of `work` on one worker per device of `devices`;
    meanwhile(pool) runs in this process while they start (the compile warm-up). Entries go out longest
    first by cost(entry), their estimated seconds (None: all equal, in order), each to a device
    that would finish it soonest by its measured speed, entries that share kernels kept on one
    device while others have work (`estimate.Dispatch`); once stop()
    says so (a budget) no more are handed out. on_result(entry, rows, error, device) runs in
    this process as each entry finishes, so results are flushed one at a time. A candidate
    that hangs or kills its worker gets a `timeout`/`crash` row; the worker is replaced and the
    entry goes on. Returns what each device did."""

    def done(job, results, err, stats):
        entry = job.payload[0]
        on_result(entry, [r for step in results for r in step], err, stats.slot)

    def lost(job, lost_step, info):
        entry, configs, gpu_, _ = job.payload
        return [lost_rows(entry, configs, lost_step, gpu_, info["prov"])]

    jobs = [Job(e.name, (e, configs, gpu, s), tuple(c.name for c in configs), cost(e) if cost else 1.0,
                ".".join(map(str, _kernel_kind(e)))) for e, configs in work]
    with Pool(list(devices), init, handle, (str(aotriton_dir), target_arch), step_timeout_s=s.timeout_s,
              setup_timeout_s=s.setup_timeout_s, label="tune",
              who=lambda slot: f"tune worker for device {slot}") as pool:
        pool.start()
        if meanwhile is not None:
            meanwhile(pool)
        return pool.run(Dispatch(jobs, len(devices), stop=stop), done, lost)


def default_compile_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) - 1))
