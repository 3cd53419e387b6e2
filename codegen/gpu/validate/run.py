"""What `mi100-codegen validate` does, given its options (`codegen.cli.validate` only parses them):
check the options and the environment, run SDPA or the tree's kernels, write the reports."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from codegen import __version__
from codegen.core import preflight, ui
from codegen.core.errors import EXIT_UPSTREAM, CodegenError, EnvironmentMissing, UserError
from codegen.apply.applied_spec import resolve_spec
from codegen.gpu.validate.kernels import FAMILIES, run_kernels, tree_source_dir
from codegen.gpu.validate.report import render_markdown, summarize, write_json, write_markdown

stderr = ui.console()
BACKENDS = ("flash", "efficient")


class ValidationFailed(CodegenError):
    exit_code = EXIT_UPSTREAM


@dataclass(frozen=True)
class ValidateOptions:
    spec: Path | None = None
    json_out: Path | None = None
    md_out: Path | None = None
    kernels: Path | None = None          # a tree: run its Triton kernels instead of SDPA
    backend: tuple[str, ...] = BACKENDS
    jobs: int = 0                        # --kernels: 0 = one per CPU, at most 16
    family: tuple[str, ...] = ()
    no_perf: bool = False
    seed: int = 0


def _need(module: str, what: str, hint: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise EnvironmentMissing(f"{what} needs {module}, which is not installed in this Python environment",
                                 hint=hint)


def _check(opts: ValidateOptions) -> None:
    """Options, the tree and the Python environment, before torch or a GPU is touched."""
    for b in opts.backend:
        if b not in BACKENDS:
            raise UserError(f"--backend {b}: expected flash or efficient")
    preflight.output_file(opts.json_out, "--json")
    preflight.output_file(opts.md_out, "--md")
    if opts.kernels is not None:
        tree_source_dir(opts.kernels)  # a clear error before touching torch or a GPU
        for f in opts.family:
            if f not in FAMILIES:
                raise UserError(f"--family {f}: expected one of {', '.join(FAMILIES)}")
    _need("torch", "validate", "on the MI100: the ROCm PyTorch you installed our build into; "
          "elsewhere: pip install torch")
    if opts.kernels is not None:
        _need("triton", "validate --kernels", "a torch environment whose torch wheel brought Triton "
              "(ROCm wheels: pytorch-triton-rocm); never pip install triton into a ROCm torch environment")


def build_report(loaded, mode_result: dict, plat, label: str | None) -> dict:
    spec = loaded.spec
    report = {
        "tool": "mi100-codegen validate",
        "tool_version": __version__,
        "label": label,
        "self_test": plat.self_test,
        "platform": plat.as_dict(),
        "spec": {"display": loaded.display, "sha256": loaded.sha256, "arch": spec.arch,
                 "head_dims": sorted(spec.head_dims), "dtypes": list(spec.dtypes),
                 "compute_units": spec.hardware.compute_units},
        **mode_result,
    }
    try:
        import triton  # import-time dependency: Triton, optional: only its version is reported

        report["triton_version"] = triton.__version__
    except Exception:
        report["triton_version"] = None
    report["arch_matches_spec"] = plat.arch == spec.arch
    # the spec's hardware.compute_units describes the target GPU: on it, the counts agree
    report["compute_units_match_spec"] = (plat.compute_units == spec.hardware.compute_units
                                          if report["arch_matches_spec"] and plat.compute_units else None)
    report["summary"] = summarize(report)
    return report


def run_validate(opts: ValidateOptions) -> None:
    """Validate on this machine's GPU; exit 3 (ValidationFailed) when a case or proof fails."""
    loaded = resolve_spec(None, opts.spec)
    ui.warn(loaded.warnings)
    _check(opts)
    if opts.kernels is not None:
        os.environ["TRITON_F32_DEFAULT"] = "ieee"
    from codegen.gpu.validate.gpu import detect_platform  # import-time dependency: torch, optional

    plat = detect_platform()
    stderr.print(f"GPU: {plat.device_name} ({plat.arch_full}), torch {plat.torch_version}"
                 + (f", HIP {plat.hip_version}" if plat.hip_version else f", CUDA {plat.cuda_version}"))
    with stderr.status("validating…") as status:
        res, label = _run_mode(opts, loaded, plat, status.update)
    report = build_report(loaded, res, plat, label)
    if opts.json_out:
        write_json(report, opts.json_out)
    if opts.md_out:
        write_markdown(report, opts.md_out)
    if label:
        stderr.print(f"[yellow]{label}[/]")
    if not (opts.json_out or opts.md_out):
        sys.stdout.write(render_markdown(report))
    _verdict(report, bool(opts.json_out or opts.md_out))


def _run_mode(opts: ValidateOptions, loaded, plat, progress) -> tuple[dict, str | None]:
    if opts.kernels is not None:
        n = opts.jobs or min(16, os.cpu_count() or 1)
        res = run_kernels(opts.kernels, loaded.spec, plat.kind == "rocm", n, progress, opts.family or FAMILIES)
        if plat.kind == "rocm":
            return res, None
        return res, (f"Proxy run on {plat.device_name} ({plat.arch}): the tree's Triton kernels with the "
                     f"spec's configs, compiled for this GPU, not for {loaded.spec.arch}. Numerics of the "
                     f"kernel source and configs only; no claim about {loaded.spec.arch} speed or registers.")
    from codegen.gpu.validate.sdpa import run_sdpa  # import-time dependency: torch, optional

    res = run_sdpa(loaded, plat, list(opts.backend), opts.seed, progress, perf=not opts.no_perf)
    if plat.kind == "rocm":
        return res, None
    return res, (f"Harness self-test on {plat.device_name} ({plat.arch}): PyTorch's own CUDA flash and "
                 "memory-efficient kernels, not AOTriton. It shows the checks work; it proves nothing "
                 f"about {loaded.spec.arch}.")


def _verdict(report: dict, wrote_report: bool) -> None:
    s = report["summary"]
    line = (f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped"
            + (f", {s['proof_failed']} proof checks failed" if s["proof_failed"] else ""))
    if not s["ok"]:
        bad = [c for c in report["cases"] if c["status"] == "fail"][:5]
        detail = "\n".join(f"{c['name']}: {c.get('reason', '')}" for c in bad)
        pf = [c for c in report.get("proof", {}).get("checks", []) if not c["ok"]]
        detail += ("\n" if detail and pf else "") + "\n".join(f"proof: {c['what']}: {c['detail']}" for c in pf)
        raise ValidationFailed(f"validation failed: {line}" + (f"\n{detail}" if detail else ""),
                               hint="see the report for every case" if wrote_report else None)
    stderr.print(f"[green]ok:[/] {line}")
