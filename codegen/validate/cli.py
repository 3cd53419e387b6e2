"""`mi100-codegen validate [--kernels TREE]`."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..errors import CodegenError, EXIT_UPSTREAM, UserError

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


class ValidationFailed(CodegenError):
    exit_code = EXIT_UPSTREAM


def _need_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise UserError("validate needs torch, which is not installed in this Python environment",
                        hint="on the MI100: the ROCm PyTorch you installed our build into; elsewhere: pip install torch")


def build_report(loaded, mode_result: dict, plat, label: str | None) -> dict:
    from .. import __version__
    from .report import summarize

    spec = loaded.spec
    report = {
        "tool": "mi100-codegen validate",
        "tool_version": __version__,
        "label": label,
        "self_test": plat.self_test,
        "platform": plat.as_dict(),
        "spec": {
            "display": loaded.display,
            "sha256": loaded.sha256,
            "arch": spec.arch,
            "head_dims": sorted(spec.head_dims),
            "dtypes": list(spec.dtypes),
        },
        **mode_result,
    }
    try:
        import triton

        report["triton_version"] = triton.__version__
    except Exception:
        report["triton_version"] = None
    report["arch_matches_spec"] = plat.arch == spec.arch
    report["summary"] = summarize(report)
    return report


def register(app: typer.Typer, guarded) -> None:
    @app.command("validate")
    @guarded
    def validate(
        spec: Optional[Path] = typer.Option(None, "--spec", help="Target spec (head dims, dtypes, configs)."),
        json_out: Optional[Path] = typer.Option(None, "--json", help="Write the JSON report here."),
        md_out: Optional[Path] = typer.Option(None, "--md", help="Write the Markdown report here."),
        kernels: Optional[Path] = typer.Option(None, "--kernels", help="Run the Triton kernels of this AOTriton "
                                               "source tree (TREE/tritonsrc) with the spec's configs instead of SDPA."),
        backend: list[str] = typer.Option(["flash", "efficient"], "--backend", help="SDPA backends to force."),
        jobs: int = typer.Option(0, "--jobs", help="--kernels: parallel worker processes (0: one per CPU, max 16)."),
        family: list[str] = typer.Option([], "--family", help="--kernels: only these kernel families."),
        no_perf: bool = typer.Option(False, "--no-perf", help="Skip the speed / memory measurement."),
        seed: int = typer.Option(0, "--seed", help="Random seed of the inputs."),
    ) -> None:
        """On the current GPU: prove AOTriton's flash attention runs and is correct (exit 3 on failure)."""
        from ..spec import load_spec

        loaded = load_spec(spec)
        for b in backend:
            if b not in ("flash", "efficient"):
                raise UserError(f"--backend {b}: expected flash or efficient")
        if kernels is not None:
            from .kernels import FAMILIES, tree_source_dir

            tree_source_dir(kernels)  # a clear error before touching torch or a GPU
            for f in family:
                if f not in FAMILIES:
                    raise UserError(f"--family {f}: expected one of {', '.join(FAMILIES)}")
            os.environ["TRITON_F32_DEFAULT"] = "ieee"
        _need_torch()
        from .gpu import detect_platform

        plat = detect_platform()
        stderr.print(f"GPU: {plat.device_name} ({plat.arch_full}), torch {plat.torch_version}"
                     + (f", HIP {plat.hip_version}" if plat.hip_version else f", CUDA {plat.cuda_version}"))
        with stderr.status("validating…") as status:
            def progress(msg: str) -> None:
                status.update(msg)

            if kernels is not None:
                if importlib.util.find_spec("triton") is None:
                    raise UserError("validate --kernels needs triton (pip install triton; ROCm: pytorch-triton-rocm)")
                from .kernels import FAMILIES, run_kernels

                n = jobs or min(16, os.cpu_count() or 1)
                res = run_kernels(kernels, loaded.spec, plat.kind == "rocm", n, progress,
                                  tuple(family) or FAMILIES)
                label = None
                if plat.kind != "rocm":
                    label = (f"Proxy run on {plat.device_name} ({plat.arch}): the tree's Triton kernels with the "
                             f"spec's configs, compiled for this GPU, not for {loaded.spec.arch}. Numerics of the "
                             "kernel source and configs only; no claim about MI100 speed or registers.")
            else:
                from .sdpa import run_sdpa

                res = run_sdpa(loaded, plat, list(backend), seed, progress, perf=not no_perf)
                label = None
                if plat.kind != "rocm":
                    label = (f"Harness self-test on {plat.device_name} ({plat.arch}): PyTorch's own CUDA flash and "
                             "memory-efficient kernels, not AOTriton. It shows the checks work; it proves nothing "
                             "about MI100.")
        report = build_report(loaded, res, plat, label)
        from .report import render_markdown, write_json, write_markdown

        if json_out:
            write_json(report, json_out)
        if md_out:
            write_markdown(report, md_out)
        s = report["summary"]
        if label:
            stderr.print(f"[yellow]{label}[/]")
        line = (f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped"
                + (f", {s['proof_failed']} proof checks failed" if s["proof_failed"] else ""))
        if not (json_out or md_out):
            import sys

            sys.stdout.write(render_markdown(report))
        if not s["ok"]:
            bad = [c for c in report["cases"] if c["status"] == "fail"][:5]
            detail = "\n".join(f"{c['name']}: {c.get('reason', '')}" for c in bad)
            pf = [c for c in report.get("proof", {}).get("checks", []) if not c["ok"]]
            detail += ("\n" if detail and pf else "") + "\n".join(f"proof: {c['what']}: {c['detail']}" for c in pf)
            raise ValidationFailed(f"validation failed: {line}" + (f"\n{detail}" if detail else ""),
                                   hint="see the report for every case" if (json_out or md_out) else None)
        stderr.print(f"[green]ok:[/] {line}")
