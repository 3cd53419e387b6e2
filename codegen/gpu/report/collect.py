"""What `mi100-codegen report` does: on the card owner's machine, collect the environment (torch,
HIP/ROCm, driver, the GPU's full arch string, the values of a few known environment variables),
`torch status`, and `validate`'s results with its speed table into one Markdown file. The file
is posted publicly: every string collected goes through one allow-list sanitizer
(`codegen.gpu.report.privacy.scrub`) before it is rendered, and the renderers add only our own
words. The owner is told how much was replaced and that the file is exactly what they send.

Refusals come first and write nothing: an output that cannot be written (exit 2), no torch or no
GPU (exit 3, one message). A validation that fails still writes the report (a failure is worth
reporting), then exits 3 like `validate`."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from codegen import __version__
from codegen.core import preflight, processes, ui
from codegen.core.errors import CodegenError, EnvironmentMissing
from codegen.core.fsutil import atomic_write
from codegen.apply.applied_spec import resolve_spec
from codegen.ship.layout import inspect_torch
from codegen.ship.status import TorchStatus, format_status, torch_status
from codegen.gpu.report.privacy import KNOWN_ENV, PATH, REDACTED, URL, sanitize, scrub
from codegen.gpu.validate.report import render_markdown
from codegen.gpu.validate import run as validate

stderr = ui.console()
DEFAULT_OUT = Path("mi100-codegen-report.md")
ISSUE_FORM = "the project's \"Card report\" issue form (.github/ISSUE_TEMPLATE/card-report.yml)"


@dataclass(frozen=True)
class ReportOptions:
    out: Path = DEFAULT_OUT
    spec: Path | None = None
    no_perf: bool = False
    seed: int = 0


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.readline().strip() or None
    except OSError:
        return None


def _command(cmd: list[str]) -> str | None:
    try:
        proc = processes.run(cmd, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    out = proc.stdout.strip().splitlines()
    return out[0].strip() if proc.returncode == 0 and out else None


def _os_name() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    return None


def environment(plat=None) -> dict:
    """The machine's software and GPU (scrubbed later, with everything else: compose_report).
    `plat`: validate's Platform (None before a GPU was found)."""
    env = {
        "mi100_codegen": __version__,
        "python": platform.python_version(),
        "os": _os_name(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "rocm": _read_first_line("/opt/rocm/.info/version") or os.environ.get("ROCM_VERSION"),
        "amdgpu_driver": _read_first_line("/sys/module/amdgpu/version"),
        "variables": {name: os.environ[name] for name in KNOWN_ENV if name in os.environ},
    }
    if plat is not None:
        env.update(plat.as_dict())
        if plat.kind == "cuda":
            env["nvidia_driver"] = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    try:
        # import-time dependency: Triton, optional, the one torch brought (ROCm: pytorch-triton-rocm)
        import triton

        env["triton"] = triton.__version__
    except Exception:
        env["triton"] = None
    return env


def _torch_status() -> tuple[dict | None, str | None]:
    """torch status as JSON, or why there is none."""
    try:
        return torch_status(inspect_torch(None)).model_dump(mode="json"), None
    except CodegenError as exc:
        return None, str(exc)


def compose_report(env: dict, status: dict | None, status_error: str | None, validation: dict,
                   counts: Counter | None = None) -> str:
    """The report's text from what was collected: every string and key scrubbed first
    (`privacy.scrub`; `counts` gains what was replaced), then rendered."""
    env, status, validation = scrub(env, counts), scrub(status, counts), scrub(validation, counts)
    status_text = (format_status(TorchStatus.model_validate(status)) if status is not None
                   else f"torch status failed: {sanitize(status_error or '-', counts)}\n")
    return render_report(env, status_text, render_markdown(validation), validation, status)


def render_report(env: dict, status_text: str, validate_md: str, validate: dict | None,
                  status: dict | None = None) -> str:
    """The report as Markdown from scrubbed data (compose_report): the tables, then the same data
    as JSON (`validate`: validate's JSON report; `status`: torch status as JSON)."""
    L = ["# mi100-codegen card report", "",
         f"Written by `mi100-codegen report` {env['mi100_codegen']}. Attach this file to {ISSUE_FORM}. "
         f"It keeps only what the tool prints on purpose: any other word, path or address reads {REDACTED}, "
         f"{PATH} or {URL}.", "",
         "## Environment", "", "| what | value |", "|---|---|"]
    for key in ("device_name", "arch_full", "arch", "compute_units", "platform", "torch_version", "hip_version",
                "cuda_version", "rocm", "amdgpu_driver", "nvidia_driver", "triton", "python", "os", "kernel",
                "machine", "mi100_codegen"):
        if key in env:
            L.append(f"| {key} | {env[key] if env[key] is not None else '-'} |")
    for name, value in sorted((env.get("variables") or {}).items()):
        L.append(f"| {name} | {value} |")
    L += ["", "## torch status", "", "```", status_text.rstrip("\n"), "```", ""]
    L += ["## validate", ""]
    L += [validate_md.rstrip("\n"), ""]
    data = {"environment": env, "torch_status": status, "validate": validate}
    L += ["## Machine-readable", "", "```json", json.dumps(data, indent=1, sort_keys=True, default=str), "```", ""]
    return "\n".join(L)


def run_report(opts: ReportOptions) -> Path:
    """Collect, scrub and write the report; exit 3 (ValidationFailed) after writing when validate failed."""
    preflight.output_file(opts.out, "--out")
    loaded = resolve_spec(None, opts.spec)
    ui.warn(loaded.warnings)
    if importlib.util.find_spec("torch") is None:
        raise EnvironmentMissing("report runs validate, which needs torch: it is not installed in this Python "
                                 "environment", hint="run it in the environment of the ROCm PyTorch you installed "
                                 "our build into")
    from codegen.gpu.validate.gpu import detect_platform  # import-time dependency: torch, optional

    plat = detect_platform()  # no GPU: exit 3, nothing written
    stderr.print(f"GPU: {plat.device_name} ({plat.arch_full}), torch {plat.torch_version}", markup=False)
    status, status_error = _torch_status()
    with stderr.status("validating…") as progress:
        vopts = validate.ValidateOptions(spec=opts.spec, no_perf=opts.no_perf, seed=opts.seed)
        res, label = validate._run_mode(vopts, loaded, plat, progress.update)
    report = validate.build_report(loaded, res, plat, label)
    counts: Counter = Counter()
    text = compose_report(environment(plat), status, status_error, report, counts)
    atomic_write(opts.out, text)
    stderr.print(f"wrote {opts.out} ({text.count(chr(10))} lines). It is exactly what you will post: read it, then "
                 f"attach it to {ISSUE_FORM}. Replaced as not ours to show: {counts[REDACTED]} words "
                 f"({REDACTED}), {counts[PATH]} paths ({PATH}), {counts[URL]} addresses ({URL}).", markup=False)
    validate._verdict(report, True)
    return opts.out
