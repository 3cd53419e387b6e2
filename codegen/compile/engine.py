"""Compile a kernel list for the target with warm workers and the persistent cache."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from codegen.core.errors import EnvironmentMissing, UserError
from codegen.models import TargetSpec
from codegen.plan.kernel_list import KernelEntry
from codegen.toolchain import installed_triton_version
from codegen.toolchain.interpreter import CompilerPython
from codegen.compile.cache import CompileCache, KernelIdent, kernel_ident
from codegen.compile.pool import WorkerPool
from codegen.compile.report import KernelResult, kernel_result


def triton_version(compiler: CompilerPython | None = None) -> str:
    """The Triton the kernels are compiled with: the compiler Python's, else this Python's."""
    if compiler is not None:
        return compiler.triton
    version = installed_triton_version()
    if version is None:
        raise EnvironmentMissing(
            "precompile needs Triton in this Python",
            hint="leave out --python: precompile compiles with a build venv of the spec's Triton (docs/toolchain.md)",
        )
    return version


def worker_env(triton_cache: Path) -> dict[str, str]:
    return {
        "TRITON_F32_DEFAULT": "ieee",        # the kernels assert it, as the tree's build sets it
        "TRITON_CACHE_DIR": str(triton_cache),
        "PYTHONDONTWRITEBYTECODE": "1",      # never write __pycache__ into the tree
    }


@dataclass
class CompileRun:
    results: list[KernelResult]
    wall_s: float
    compiled_now: int
    from_cache: int
    triton: str
    jobs: int


def task_for(tree: Path, entry: KernelEntry, warp_size: int) -> dict:
    return {
        "id": entry.id,
        "source": str((Path(tree) / entry.source).resolve()),
        "kernel_name": entry.kernel_name,
        "signature": entry.signature,
        "num_warps": entry.config.num_warps,
        "num_stages": entry.config.num_stages,
        "waves_per_eu": entry.config.waves_per_eu,
        "arch": entry.config.arch,
        "warp_size": warp_size,
    }


def entry_ident(tree: Path, e: KernelEntry, warp_size: int, version: str) -> KernelIdent:
    """What decides a planned kernel's code object (codegen.compile.cache.KernelIdent), as precompile and
    build look it up in the kernel cache."""
    c = e.config
    return kernel_ident(source=str(tree / e.source), kernel_name=e.kernel_name, signature=e.signature,
                        num_warps=c.num_warps, num_stages=c.num_stages, waves_per_eu=c.waves_per_eu, arch=c.arch,
                        warp_size=warp_size, triton_version=version)


def _keep_image(keep: Path | None, entry: KernelEntry, data: bytes | None) -> None:
    """--keep: the code object under KEEP/<its path in the build dir>."""
    if keep is not None and data:
        dest = Path(keep) / entry.hsaco
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def compile_entries(
    tree: Path,
    entries: list[KernelEntry],
    spec: TargetSpec,
    *,
    jobs: int,
    timeout_s: float,
    cache: CompileCache | None,
    keep: Path | None = None,
    on_progress: Callable[[KernelResult], None] | None = None,
    compiler: CompilerPython | None = None,
) -> CompileRun:
    """`compiler`: the interpreter whose Triton compiles (its workers run there); None: this one."""
    tree = Path(tree).resolve()
    version = triton_version(compiler)
    for e in entries:
        if not (tree / e.source).is_file():
            raise UserError(f"{tree / e.source}: Triton source of {e.id} not found")
    by_id = {e.id: e for e in entries}
    idents = {e.id: entry_ident(tree, e, spec.warp_size, version) for e in entries}
    results: dict[str, KernelResult] = {}
    todo: list[dict] = []

    for e in entries:
        record = cache.get(idents[e.id]) if cache is not None else None
        if record is not None:
            r = kernel_result(e, record, spec.hardware, cached=True)
            results[e.id] = r
            _keep_image(keep, e, record.get("_hsaco"))
            if on_progress:
                on_progress(r)
        else:
            todo.append(task_for(tree, e, spec.warp_size))

    def done(raw: dict) -> None:
        e = by_id[raw["id"]]
        hsaco = raw.pop("hsaco", None)
        if cache is not None and not raw.get("timeout") and not raw.get("crashed"):
            record = {k: v for k, v in raw.items() if k in ("ok", "id", "compile_s", "error", "resources", "sidecar")}
            cache.put(idents[e.id], record, hsaco if raw.get("ok") else None)
        _keep_image(keep, e, hsaco)
        r = kernel_result(e, raw, spec.hardware, cached=False)
        results[e.id] = r
        if on_progress:
            on_progress(r)

    # longest (expected) first: fewer idle workers at the tail of the run
    todo.sort(key=lambda t: (-expected_cost(by_id[t["id"]]), t["id"]))
    t0 = time.perf_counter()
    if todo:
        scratch = Path(tempfile.mkdtemp(prefix="mi100-codegen-triton-"))
        try:
            python = None if compiler is None or compiler.is_current else compiler.python
            WorkerPool(jobs, worker_env(scratch), timeout_s, python=python, triton=version).run(todo, done)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    wall = time.perf_counter() - t0
    ordered = [results[e.id] for e in entries]
    return CompileRun(results=ordered, wall_s=wall, compiled_now=len(todo),
                      from_cache=len(entries) - len(todo), triton=version, jobs=jobs)


def expected_cost(e: KernelEntry) -> float:
    """A rough relative compile cost: tile area x head dim, heavier for the backward kernels."""
    weight = {"bwd_kernel_fuse": 3.0, "bwd_kernel_dk_dv": 2.0, "bwd_kernel_dq": 1.5, "attn_fwd": 1.5}
    c = e.config
    area = (c.block_m or 16) * (c.block_n or 16) * (c.head_dim or 16)
    return weight.get(c.family, 0.1) * area * (1 + 0.25 * c.num_warps)


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)
