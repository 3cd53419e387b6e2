"""GPU side of `tune`: measure grid entries (one worker per visible GPU), warm Triton's compile
cache in parallel first. Imports torch/triton lazily (through `.kernels`)."""

from __future__ import annotations

import datetime
import math
import multiprocessing as mp
import os
import queue
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from codegen.models import KernelConfig
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


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ").strip()
    return text[:200]


def provenance(target_arch: str) -> Provenance:
    # optional heavy dependencies: torch, triton (and .kernels, which imports both)
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
    from codegen.gpu.tune.kernels import make_problem  # optional heavy dependency: imports torch and triton

    return make_problem(entry.dtype, batch, heads, seqlens[0], seqlens[1], entry.head_dim, entry.causal,
                        seed, device=device, dropout_p=s.dropout_p if entry.dropout else 0.0,
                        bias=entry.bias)


def _row(entry: GridEntry, gpu: str, cfg: KernelConfig, rep: str, prov: Provenance, status: str,
         t_ms, errs: str) -> dict:
    return {**entry_columns(entry, gpu), **config_columns(cfg), "status": status,
            "time_ms": t_ms if t_ms is not None else "", "errors": errs,
            "same_kernel_as": "" if cfg.name == rep else rep, **prov.as_dict()}


def measure_entry(tk, entry: GridEntry, configs: list[KernelConfig], s: Settings, gpu: str,
                  prov: Provenance) -> list[dict]:
    """Rows of every config: checked against fp64, timed when they pass."""
    # optional heavy dependencies: torch (and .kernels, which imports triton)
    import torch
    from codegen.gpu.tune.kernels import bench, check, reference, seed_of

    fam = entry.family
    p = entry_problem(entry, s, s.batch, s.heads, (entry.seqlen_q, entry.seqlen_k), seed_of(entry.name))
    keep = tk.dropout_keep(p, s.check_heads) if entry.dropout else None
    refs = reference(p, s.check_heads, want_grads=fam != "attn_fwd", keep=keep)
    bwd = tk.bwd_inputs(p, s.fwd_for_bwd) if fam != "attn_fwd" else (None, None, None)
    rows: list[dict] = []
    for group in group_effective(configs, tk.backend):
        rep = group[0]
        status, t_ms, errs = "error", None, ""
        try:
            launch, outs = tk.launcher(fam, p, rep, bwd)
            launch()
            torch.cuda.synchronize()
            ok, errs = check(outs, refs, s.check_heads, entry.dtype)
            if ok:
                t_ms = bench(launch, s.warmup_ms, s.rep_ms)
                status = "ok"
                if not math.isfinite(t_ms):  # never a NaN into the CSVs or the overlay
                    status, errs, t_ms = "bad time", f"benchmark returned {t_ms}", None
            else:
                status = "numerics"
            del outs, launch
        except torch.cuda.OutOfMemoryError as exc:
            status, errs = "oom", _short(exc)
        except Exception as exc:  # compile failures, out of resources, launch errors
            status, errs = "error", _short(exc)
        rows += [_row(entry, gpu, c, rep.name, prov, status, t_ms, errs) for c in group]
    del p, refs, keep, bwd
    torch.cuda.empty_cache()
    return rows



# ---- parallel compile-cache warm-up ------------------------------------------------------
_WARM_TK = {}


def _warm_one(aotriton_dir: str, entry: GridEntry, cfg: KernelConfig, s: Settings) -> tuple[str, str]:
    """Compile (and run once, small) one kernel so the main process hits Triton's disk cache.
    The small problem keeps every specialisation of the real one (ints multiple of 16, none 1;
    bwd_kernel_fuse takes heads and seqlens as constexprs: those are the real ones)."""
    try:
        # optional heavy dependencies: torch (and .kernels, which imports triton)
        import torch
        from codegen.gpu.tune.kernels import TreeKernels

        tk = _WARM_TK.get(aotriton_dir) or _WARM_TK.setdefault(aotriton_dir, TreeKernels(Path(aotriton_dir)))
        if entry.family == "bwd_kernel_fuse":
            p = entry_problem(entry, s, 1, s.heads, (entry.seqlen_q, entry.seqlen_k), 0)
        else:
            p = entry_problem(entry, s, 2, 2, (128, 128), 0)
        bwd = tk.bwd_inputs(p, s.fwd_for_bwd) if entry.family != "attn_fwd" else (None, None, None)
        tk.launcher(entry.family, p, cfg, bwd)[0]()
        torch.cuda.synchronize()
        return cfg.name, ""
    except Exception as exc:  # the main run reports it per entry
        return cfg.name, _short(exc)


def warm_jobs(entries: Iterable[GridEntry], configs_for: Callable, backend: str) -> list[tuple]:
    """Distinct (entry standing for its kernels, representative config) the entries will compile;
    seqlens matter only for bwd_kernel_fuse (constexprs there), else 128."""
    jobs = {}
    for e in entries:
        sq, sk = (e.seqlen_q, e.seqlen_k) if e.family == "bwd_kernel_fuse" else (128, 128)
        like = GridEntry(e.family, e.arch, e.dtype, e.head_dim, e.causal, e.dropout, e.bias, sq, sk)
        for group in group_effective(configs_for(e), backend):
            jobs[(like, group[0].name)] = (like, group[0])
    return [jobs[k] for k in sorted(jobs)]


def warm_compile(aotriton_dir: Path, jobs: list[tuple], s: Settings, workers: int,
                 on_done: Callable[[str, str], None]) -> None:
    if not jobs or workers < 1:
        return
    ctx = mp.get_context("spawn")
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        futs = [ex.submit(_warm_one, str(aotriton_dir), like, cfg, s) for like, cfg in jobs]
        for f in as_completed(futs):
            try:
                name, err = f.result()
            except Exception as exc:  # a worker died
                name, err = "?", _short(exc)
            on_done(name, err)
    except BaseException:  # interrupted: do not wait for the queued compiles
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    ex.shutdown(wait=True)


# ---- measuring: in-process (one GPU) or one worker process per GPU -----------------------
def _gpu_worker(device_index: int, aotriton_dir: str, target_arch: str, gpu: str, s: Settings,
                tasks, results) -> None:
    # optional heavy dependencies: torch (and .kernels, which imports triton)
    import torch
    from codegen.gpu.tune.kernels import TreeKernels

    torch.cuda.set_device(device_index)
    tk = TreeKernels(Path(aotriton_dir))
    prov = provenance(target_arch)
    while True:
        task = tasks.get()
        if task is None:
            break
        entry, configs = task
        try:
            rows = measure_entry(tk, entry, configs, s, gpu, prov)
            results.put((entry, rows, ""))
        except Exception as exc:
            results.put((entry, [], _short(exc)))
    results.put(None)


def missing_gpu_stack() -> list[str]:
    import importlib.util  # only here: tells whether torch and triton are installed

    return [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]


def backend_name() -> str:
    from codegen.gpu.tune.kernels import backend  # optional heavy dependency: imports torch and triton

    return backend()


def visible_gpus() -> int:
    import torch  # optional heavy dependency

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_entries(aotriton_dir: Path, target_arch: str, gpu: str,
                work: Iterable[tuple[GridEntry, list[KernelConfig]]], s: Settings, n_gpus: int,
                on_result: Callable[[GridEntry, list[dict], str], None],
                worker: Callable = None) -> None:
    """Measure each (entry, configs) of `work` (consumed lazily: a budget check inside the
    iterator stops handing out work); call on_result(entry, rows, error) as each finishes, in
    the calling process, so results are flushed one entry at a time."""
    if n_gpus <= 1:
        _run_in_process(aotriton_dir, target_arch, gpu, work, s, on_result)
    else:
        _run_on_gpus(aotriton_dir, target_arch, gpu, work, s, n_gpus, on_result, worker or _gpu_worker)


def _run_in_process(aotriton_dir: Path, target_arch: str, gpu: str,
                    work: Iterable[tuple[GridEntry, list[KernelConfig]]], s: Settings,
                    on_result: Callable[[GridEntry, list[dict], str], None]) -> None:
    from codegen.gpu.tune.kernels import TreeKernels  # optional heavy dependency: imports torch and triton

    tk = TreeKernels(aotriton_dir)
    prov = provenance(target_arch)
    for entry, configs in work:
        try:
            rows, err = measure_entry(tk, entry, configs, s, gpu, prov), ""
        except Exception as exc:
            rows, err = [], _short(exc)
        on_result(entry, rows, err)


def _run_on_gpus(aotriton_dir: Path, target_arch: str, gpu: str,
                 work: Iterable[tuple[GridEntry, list[KernelConfig]]], s: Settings, n_gpus: int,
                 on_result: Callable[[GridEntry, list[dict], str], None], worker: Callable) -> None:
    """One spawned worker process per GPU, one task in flight each; results come back here."""
    ctx = mp.get_context("spawn")
    tasks, results = ctx.Queue(), ctx.Queue()
    items = iter(work)
    pending = 0

    def feed() -> bool:
        nonlocal pending
        item = next(items, None)
        if item is None:
            return False
        tasks.put(item)
        pending += 1
        return True

    for _ in range(n_gpus):  # one task in flight per GPU
        if not feed():
            break
    procs = [ctx.Process(target=worker, daemon=True,
                         args=(i, str(aotriton_dir), target_arch, gpu, s, tasks, results))
             for i in range(n_gpus)]
    for pr in procs:
        pr.start()
    exhausted = False
    try:
        while pending:
            try:
                msg = results.get(timeout=5)
            except queue.Empty:
                if not all(pr.is_alive() for pr in procs):  # a worker died: its entry is lost
                    break  # (not recorded, so --resume measures it again)
                continue
            if msg is None:  # a worker exited
                continue
            pending -= 1
            on_result(*msg)
            if not exhausted and not feed():
                exhausted = True
        for _ in procs:
            tasks.put(None)
    finally:
        for pr in procs:
            pr.join(timeout=10)
            if pr.is_alive():
                pr.terminate()


def default_compile_workers() -> int:
    return max(1, min(8, (os.cpu_count() or 2) - 1))
