"""`validate --kernels TREE`: the AOTriton tree's own Triton kernels, with every config the spec
ships, JIT-compiled and run on the current GPU (AMD or NVIDIA) against a float64 reference.

This works before anything is built: it checks the kernel sources and the spec's tuning space,
not a compiled library. The tree's modules are imported at run time from its kernel folder
(`codegen.upstream.kernel_source_dir`: `TREE/tritonsrc` up to 0.12.1b, `TREE/modules/flash/kernel`
for 0.13b); nothing of them is copied. Kernel parameters are passed by name, looked
up in the kernel's own signature (`codegen.upstream.kernel_args`, shared with `tune`), so the
signature changes between releases are handled and unknown required parameters are reported
clearly.

On NVIDIA, AMD-only launch options (waves_per_eu) are dropped, so configs that differ only in
them compile to the same kernel and are run once; TRITON_F32_DEFAULT=ieee keeps fp32 dots exact
(the tree's test harness demands it too).

Configs run in parallel worker processes of the one pool (codegen.core.pool: spawned, each with
its own GPU context; compiling is CPU-bound and dominates): a config that hangs or kills its
worker fails alone, the worker is replaced.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from codegen.core.errors import UpstreamError, UserError
from codegen.core.pool import Job, Lost, Pool
from codegen.models import FAMILIES, KernelConfig, expand_family
from codegen.models.cases import KERNEL_SHAPES, Shape
from codegen.upstream import KERNEL_DIRS, kernel_source_dir
from codegen.upstream.kernel_args import bind, load_kernels, param_values

TIMEOUT_S = 600.0  # one config: its compile, launches and checks


def tree_source_dir(tree: Path) -> Path:
    tree = Path(tree)
    src = kernel_source_dir(tree)
    if src is not None and (src / "fwd_kernel.py").is_file():
        return src
    raise UserError(f"{tree}: not an AOTriton source tree (no {' nor '.join(d + '/fwd_kernel.py' for d in KERNEL_DIRS)})",
                    hint="pass the root of an AOTriton release checkout, e.g. aotriton-0.11b/")


def tree_identity(tree: Path) -> dict:
    src = tree_source_dir(tree)
    h = hashlib.sha256()
    for f in sorted(src.glob("*.py")):
        h.update(f"{f.name} {hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    release = None
    cm = Path(tree) / "CMakeLists.txt"
    if cm.is_file():
        t = cm.read_text(errors="replace")
        parts = [re.search(rf"set\(AOTRITON_VERSION_{k}_INT\s+(\d+)\)", t) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            a, b, c = (p.group(1) for p in parts)
            release = f"{a}.{b}b" if c == "0" else f"{a}.{b}.{c}b"
    return {"release": release, "tritonsrc_sha256": h.hexdigest()}


@dataclass(frozen=True)
class Task:
    family: str
    config: dict  # KernelConfig fields
    names: tuple[str, ...]  # every spec config name this run stands for
    causal: bool
    shape: tuple[int, int, int, int, int]
    driver: dict  # attn_fwd KernelConfig fields used to produce O and L for backward kernels
    seed: int
    control: bool = False  # negative control: compare against the reference of the other causal mode


def plan_tasks(spec, amd: bool, families: tuple[str, ...] = FAMILIES,
               shapes: tuple[Shape, ...] = KERNEL_SHAPES) -> list[Task]:
    """One run per distinct kernel (config x causal x shape); on NVIDIA configs that differ only
    in waves_per_eu are merged."""
    tasks: list[Task] = []
    seed = 0
    for dtype in spec.dtypes:
        for hd in sorted(spec.head_dims):
            fwd_cfgs = expand_family(spec, "attn_fwd", dtype, hd)
            driver = _driver(fwd_cfgs)
            for family in families:
                groups: dict[tuple, list[KernelConfig]] = {}
                for cfg in expand_family(spec, family, dtype, hd):
                    key = asdict(cfg)
                    if not amd:
                        key["waves_per_eu"] = 0
                    groups.setdefault(tuple(sorted(key.items())), []).append(cfg)
                for key in sorted(groups):
                    cfgs = groups[key]
                    for causal in (False, True):
                        for sh in shapes:
                            seed += 1
                            tasks.append(Task(
                                family, asdict(cfgs[0]), tuple(c.name for c in cfgs), causal,
                                (sh.batch, sh.heads_q, sh.heads_k, sh.seqlen_q, sh.seqlen_k),
                                asdict(driver) if driver else {}, seed))
    return tasks


def _driver(fwd_cfgs: list[KernelConfig]) -> KernelConfig | None:
    """The forward config that produces O and L for the backward checks: the smallest tile with
    the lowest waves_per_eu (the least likely to hit a resource limit)."""
    if not fwd_cfgs:
        return None
    return sorted(fwd_cfgs, key=lambda c: (c.block_m * c.block_n, c.waves_per_eu, c.name))[0]


# --- worker side ---------------------------------------------------------------------------------
_K: dict = {}


def init_worker(src_dir: str) -> None:
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    _K.clear()
    _K.update(load_kernels(Path(src_dir)))


def _launch(kernel, grid, values: dict, opts: dict) -> None:
    kernel[grid](**bind(kernel, values), **opts)


def _tensors(task: Task, dt, dev: str):
    """Inputs, the fp64 reference's outputs and every buffer the kernels write."""
    # import-time dependency: torch, optional, in the worker process only (.gpu imports it)
    import torch

    from codegen.gpu.validate.gpu import reference

    B, Hq, Hk, Sq, Sk = task.shape
    hd = task.config["head_dim"]
    g = torch.Generator(device="cpu").manual_seed(task.seed)
    q = torch.randn(B, Hq, Sq, hd, generator=g).to(dev, dt)
    k = torch.randn(B, Hk, Sk, hd, generator=g).to(dev, dt)
    v = torch.randn(B, Hk, Sk, hd, generator=g).to(dev, dt)
    do = torch.randn(B, Hq, Sq, hd, generator=g).to(dev, dt)
    o_ref, dq_ref, dk_ref, dv_ref, _ = reference(q, k, v, do, task.causal != task.control)
    b = torch.empty((0, 0, 0, 0), device=dev, dtype=dt)
    t = dict(
        q=q, k=k, v=v, do=do, o=torch.empty_like(q),
        L=torch.empty((B * Hq, Sq), device=dev, dtype=torch.float32),
        dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
        b=b, db=torch.empty_like(b), alibi=torch.empty((0, 0), device=dev, dtype=dt),
        i32null=torch.empty(0, device=dev, dtype=torch.int32),
        u64null=torch.empty(0, device=dev, dtype=torch.uint64),
        counter=torch.zeros(1, device=dev, dtype=torch.int32),
    )
    t["delta"] = torch.empty_like(t["L"])
    return t, {"o": o_ref, "dq": dq_ref, "dk": dk_ref, "dv": dv_ref}


def _judge(result: dict, checks: list[dict]) -> None:
    result["checks"] = checks
    if all(c["ok"] for c in checks):
        result["status"] = "pass"
    else:
        result["status"] = "fail"
        result["reason"] = "; ".join(
            f"{c['tensor']}: " + ("not finite" if not c["finite"] else "all zeros" if not c["nonzero"]
                                  else f"err {c['max_abs_err']:.3g} > tol {c['tol']:.3g}")
            for c in checks if not c["ok"])


def _head(task: Task) -> dict:
    cfg = task.config
    return {"family": task.family, "names": list(task.names), "causal": task.causal,
            "shape": dict(zip(("batch", "heads_q", "heads_k", "seqlen_q", "seqlen_k"), task.shape)),
            "dtype": cfg["dtype"], "head_dim": cfg["head_dim"], "config": cfg}


def run_task(task: Task, amd: bool) -> dict:
    # import-time dependency: torch, optional, in the worker process only (.gpu imports it)
    import torch

    from codegen.gpu.validate.gpu import DTYPES, compare

    cfg = task.config
    dtype = cfg["dtype"]
    t, ref = _tensors(task, DTYPES[dtype], "cuda")
    n_cu = torch.cuda.get_device_properties(t["q"].device).multi_processor_count

    def launch(family: str, c: dict, with_opts: bool = True) -> None:
        if family not in _K:
            raise UpstreamError(f"this tree has no {family} kernel")
        vals, grid = param_values(family, t, c, task.causal, task.shape, n_cu)
        o = {"num_warps": c["num_warps"], "num_stages": c["num_stages"]}
        if amd:
            o["waves_per_eu"] = c["waves_per_eu"]
        _launch(_K[family], grid, vals, o if with_opts else {})

    result = _head(task)
    try:
        if task.family == "attn_fwd":
            launch("attn_fwd", cfg)
            torch.cuda.synchronize()
            checks = [compare("out", "fwd", dtype, t["o"], ref["o"])]
        else:
            launch("attn_fwd", task.driver)
            t["counter"].zero_()
            if task.family == "bwd_kernel_fuse":
                launch("bwd_kernel_fuse", cfg)
                names = ("dq", "dk", "dv")
            else:
                launch("bwd_preprocess", cfg, with_opts=False)
                launch(task.family, cfg)
                names = ("dk", "dv") if task.family == "bwd_kernel_dk_dv" else ("dq",)
            torch.cuda.synchronize()
            checks = [compare(n, "bwd", dtype, t[n], ref[n]) for n in names]
        _judge(result, checks)
    except Exception as exc:  # one config's failure is a result, not the end of the run
        msg = str(exc).strip().splitlines()
        result["status"] = "fail"
        result["reason"] = f"{type(exc).__name__}: {msg[-1] if msg else ''}"[:500]
    return result


def _init(_slot, src_dir: str):
    init_worker(src_dir)
    return None, {}


def _handle(_state, job: tuple, names, report) -> None:
    task, amd = job
    report.begin(names)
    report.end(run_task(task, amd))


def _lost(job: Job, lost: Lost, _info: dict) -> list[dict]:
    """A config whose worker hung or died: it fails, the others go on."""
    return [{**_head(job.payload[0]), "status": "fail", "reason": f"{lost.why}: {lost.detail}"}]


def run_kernels(tree: Path, spec, amd: bool, jobs: int, progress: Callable[[str], None] = lambda m: None,
                families: tuple[str, ...] = FAMILIES) -> dict:
    src = tree_source_dir(tree)
    os.environ["TRITON_F32_DEFAULT"] = "ieee"
    tasks = plan_tasks(spec, amd, families)
    # negative controls: a causal run compared with the non-causal reference must be rejected
    ctl_tasks = []
    for fam in families:
        first = next((t for t in tasks if t.family == fam and t.causal), None)
        if first is not None:
            ctl_tasks.append(Task(first.family, first.config, first.names, True, first.shape, first.driver,
                                  first.seed, control=True))
    everything = tasks + ctl_tasks
    done: list[dict] = []

    def finished(job: Job, results: list, err: str, _stats) -> None:
        task = job.payload[0]
        r = results[0] if results else {**_head(task), "status": "fail", "reason": err or "no result"}
        done.append(dict(r, control=task.control))
        progress(f"[{len(done)}/{len(everything)}] {r['status']} {r['names'][0]}")

    pool = Pool(list(range(max(1, min(jobs, len(everything))))), _init, _handle, (str(src),),
                step_timeout_s=TIMEOUT_S, setup_timeout_s=TIMEOUT_S, label="validate",
                who=lambda slot: f"validate worker {slot}")
    pool.run((Job(t.names[0], (t, amd), (str(i),)) for i, t in enumerate(everything)), finished, _lost)
    results = [r for r in done if not r["control"]]
    controls = [
        {"what": f"negative control: {r['family']} causal output vs the non-causal reference is rejected",
         "ok": r["status"] == "fail", "detail": r.get("reason", "accepted: the checks do not bite")}
        for r in sorted((r for r in done if r["control"]), key=lambda r: r["family"])
    ]
    rows = []
    for r in results:
        for n in r["names"]:
            row = dict(r)
            row.pop("names")
            row.pop("control", None)
            row["config_name"] = n
            row["name"] = f"{n}.{'causal' if r['causal'] else 'full'}.b{r['shape']['batch']}h{r['shape']['heads_q']}" \
                          f"k{r['shape']['heads_k']}.q{r['shape']['seqlen_q']}k{r['shape']['seqlen_k']}"
            row["merged_with"] = [x for x in r["names"] if x != n]
            rows.append(row)
    rows.sort(key=lambda x: x["name"])
    return {"mode": "kernels", "cases": rows, "tree": tree_identity(tree), "runs": len(tasks),
            "proof": {"checks": controls},
            "waves_per_eu": "applied" if amd else "dropped (not an AMD GPU): configs differing only in it ran once"}
