"""`validate`: PyTorch's scaled_dot_product_attention with the flash (and memory-efficient)
backend forced, forward and backward, against a float64 reference, plus the proof that
AOTriton's kernels ran (which library file is mapped, its images, the kernel names the profiler
saw) and speed / peak memory against the math backend.

On ROCm this checks AOTriton. On a CUDA GPU the same harness runs against PyTorch's own flash
and memory-efficient kernels: a self-test of the harness, labelled as such in the report.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from codegen.formats.spec import LoadedSpec
from codegen.gpu.validate import gpu
from codegen.models.cases import PERF_SHAPE, Case, Shape, dispatch_limit, sdpa_cases
from codegen.gpu.validate.gpu import (
    DTYPES,
    Platform,
    aotriton_proof,
    compare,
    env_snapshot,
    make_inputs,
    peak_mib,
    profile_kernels,
    reference,
    shape_dict,
    time_ms,
)

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}

# Kernel names that prove which implementation ran (profiler), per platform and backend.
EXPECTED_KERNELS = {
    ("rocm", "flash", "fwd"): r"attn_fwd",
    ("rocm", "flash", "bwd"): r"bwd_kernel|bwd_preprocess",
    ("rocm", "efficient", "fwd"): r"attn_fwd",
    ("rocm", "efficient", "bwd"): r"bwd_kernel|bwd_preprocess",
    ("cuda", "flash", "fwd"): r"flash_fwd",
    ("cuda", "flash", "bwd"): r"flash_bwd",
    ("cuda", "efficient", "fwd"): r"fmha_cutlassF|efficient_attention|mem_eff",
    ("cuda", "efficient", "bwd"): r"fmha_cutlassB|efficient_attention|mem_eff",
}
ARCH_WARNING = "was not compiled for current AMD GPU architecture"
# The ATen op scaled_dot_product_attention dispatches to, per backend, as the profiler records it
# (the backward's name adds "_backward"); "math" is the unfused fallback.
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
}


def _sdpa(backend: str, q, k, v, causal: bool):
    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel([BACKENDS[backend]]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)


def _run_case(backend: str, case: Case, inputs, ref, math_errs) -> tuple[dict, list[str]]:
    q, k, v, do = (t.detach().clone() for t in inputs)
    for t in (q, k, v):
        t.requires_grad_(True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = _sdpa(backend, q, k, v, case.causal)
        out.backward(do)
        if q.is_cuda:
            torch.cuda.synchronize()
    msgs = sorted({str(x.message) for x in w})
    o_ref, dq_ref, dk_ref, dv_ref, _ = ref
    me = math_errs or {}
    checks = [
        compare("out", "fwd", case.dtype, out, o_ref, me.get("out")),
        compare("dq", "bwd", case.dtype, q.grad, dq_ref, me.get("dq")),
        compare("dk", "bwd", case.dtype, k.grad, dk_ref, me.get("dk")),
        compare("dv", "bwd", case.dtype, v.grad, dv_ref, me.get("dv")),
    ]
    return {"checks": checks, "ok": all(c["ok"] for c in checks)}, msgs


def _math_errors(case: Case, inputs, ref) -> dict:
    q, k, v, do = (t.detach().clone().requires_grad_(True) for t in inputs)
    out = _sdpa("math", q, k, v, case.causal)
    out.backward(do.detach())
    o_ref, dq_ref, dk_ref, dv_ref, _ = ref
    return {
        n: float((t.detach().double() - r).abs().max())
        for n, t, r in (("out", out, o_ref), ("dq", q.grad, dq_ref), ("dk", k.grad, dk_ref), ("dv", v.grad, dv_ref))
    }


def _unsupported_reason(exc: Exception, msgs: list[str]) -> str:
    text = " ".join([str(exc).splitlines()[0]] + msgs)
    return re.sub(r"\s+", " ", text)[:400]


def run_sdpa(loaded: LoadedSpec, plat: Platform, backends: list[str], seed: int,
             progress: Callable[[str], None] = lambda m: None, perf: bool = True) -> dict:
    spec = loaded.spec
    if spec.registration.experimental:
        os.environ.setdefault("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "1")
    rocm = plat.kind == "rocm"
    results: list[dict] = []
    warnings_seen: set[str] = set()
    for i, case in enumerate(sdpa_cases(spec)):
        inputs = make_inputs(case, gpu.DEVICE, seed + i)
        ref = reference(*inputs, causal=case.causal)
        math_errs = _math_errors(case, inputs, ref)
        for backend in backends:
            progress(f"{backend} {case.name}")
            row = {
                "name": f"{backend}.{case.name}",
                "backend": backend,
                "dtype": case.dtype,
                "head_dim": case.head_dim,
                "causal": case.causal,
                "gqa": case.shape.gqa,
                "shape": shape_dict(case.shape),
            }
            try:
                res, msgs = _run_case(backend, case, inputs, ref, math_errs)
            except RuntimeError as exc:
                warnings_seen.update(_refused(row, backend, case, inputs, exc, rocm))
                results.append(row)
                continue
            warnings_seen.update(msgs)
            _judge(row, res, msgs)
            results.append(row)

    proof = _proof(plat, backends, spec)
    perf_rows = _perf(spec, backends, progress) if perf else []
    return {
        "mode": "sdpa",
        "cases": results,
        "proof": proof,
        "perf": perf_rows,
        "warnings": sorted(warnings_seen),
        "env": env_snapshot(),
    }


def _refused(row: dict, backend: str, case: Case, inputs, exc: RuntimeError, rocm: bool) -> list[str]:
    """A backend that refused the inputs: a skip where PyTorch documents the limit, else a
    failure; returns the warnings PyTorch gave (re-run once to record them)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with contextlib.suppress(RuntimeError):
            _sdpa(backend, *inputs[:3], case.causal)
    msgs = sorted({str(x.message) for x in w})
    reason = _unsupported_reason(exc, msgs)
    limit = dispatch_limit(backend, case)
    if any(ARCH_WARNING in m for m in msgs):
        row.update(status="fail", reason=f"no kernels for this GPU: {reason}")
    elif limit:
        row.update(status="skip", reason=f"{limit}: {reason}")
    elif not rocm:
        row.update(status="skip", reason=f"not supported by PyTorch's CUDA {backend} kernel: {reason}")
    else:
        row.update(status="fail", reason=f"backend refused the inputs: {reason}")
    return msgs


def _judge(row: dict, res: dict, msgs: list[str]) -> None:
    bad = [m for m in msgs if ARCH_WARNING in m]
    row["checks"] = res["checks"]
    if bad:
        row.update(status="fail", reason=bad[0])
    elif res["ok"]:
        row["status"] = "pass"
    else:
        why = [f"{c['tensor']}: " + ("not finite" if not c["finite"] else "all zeros" if not c["nonzero"]
               else f"err {c['max_abs_err']:.3g} > tol {c['tol']:.3g}") for c in res["checks"] if not c["ok"]]
        row.update(status="fail", reason="; ".join(why))


def _proof(plat: Platform, backends: list[str], spec) -> dict:
    """Kernel names of one flash/efficient forward+backward, and which AOTriton is mapped."""
    dtype = "fp16" if "fp16" in spec.dtypes else spec.dtypes[0]
    case = Case.at(dtype, sorted(spec.head_dims)[0], False, Shape(1, 2, 2, 257, 257))
    out: dict = {"kernels": {}, "checks": []}
    for backend in backends:
        q, k, v, do = make_inputs(case, gpu.DEVICE, 1234)
        for t in (q, k, v):
            t.requires_grad_(True)
        try:
            fwd = profile_kernels(lambda: _sdpa(backend, q, k, v, False))
            o = _sdpa(backend, q, k, v, False)
            bwd = profile_kernels(lambda: o.backward(do))
        except RuntimeError as exc:
            out["kernels"][backend] = {"error": str(exc).splitlines()[0]}
            out["checks"].append({"what": f"{backend} kernels ran", "ok": False,
                                  "detail": str(exc).splitlines()[0]})
            continue
        out["kernels"][backend] = {"fwd": fwd, "bwd": bwd}
        wrong = compare("out", "fwd", case.dtype, o, reference(q, k, v, do, causal=True)[0])
        out["checks"].append({"what": f"negative control: {backend} output vs the causal reference is rejected",
                              "ok": not wrong["ok"],
                              "detail": f"err {wrong['max_abs_err']:.3g} vs tol {wrong['tol']:.3g}"})
        for phase, names in (("fwd", fwd), ("bwd", bwd)):
            pat = EXPECTED_KERNELS.get((plat.kind, backend, phase))
            hit = [n for n in names if pat and re.search(pat, n)]
            out["checks"].append({
                "what": f"{backend} {phase}: a kernel matching /{pat}/ ran",
                "ok": bool(hit),
                "detail": ", ".join(hit[:3]) or "none of: " + ", ".join(names[:6]),
            })
    aot = aotriton_proof(plat.arch)
    out["aotriton"] = aot
    if plat.kind == "rocm":
        out["checks"].append({"what": "an AOTriton library is mapped into the process",
                              "ok": bool(aot.get("mapped_files")),
                              "detail": ", ".join(aot.get("mapped_files", [])) or "none in /proc/self/maps"})
        out["checks"].append({"what": f"kernel images for {plat.arch} next to it",
                              "ok": bool(aot.get("images_files")),
                              "detail": f"{aot.get('images_files', 0)} files in {aot.get('images_dir', '-')}"})
    return out


def _perf(spec, backends: list[str], progress) -> list[dict]:
    rows = []
    s = PERF_SHAPE
    for dtype in spec.dtypes:
        for hd in sorted(spec.head_dims):
            dt = DTYPES[dtype]
            g = torch.Generator(device="cpu").manual_seed(7)
            q, k, v, do = (torch.randn(s.batch, s.heads_q, s.seqlen_q, hd, generator=g).to(gpu.DEVICE, dt)
                           for _ in range(4))
            for t in (q, k, v):
                t.requires_grad_(True)
            for backend in list(backends) + ["math"]:
                progress(f"perf {backend} {dtype} d{hd}")
                row = {"backend": backend, "dtype": dtype, "head_dim": hd, "shape": shape_dict(s)}

                def fwd():
                    return _sdpa(backend, q, k, v, False)

                def fwd_bwd():
                    for t in (q, k, v):
                        t.grad = None
                    fwd().backward(do)

                try:
                    row["fwd_ms"] = time_ms(fwd)
                    row["fwd_bwd_ms"] = time_ms(fwd_bwd)
                    row["peak_mib"] = peak_mib(fwd_bwd)
                except RuntimeError as exc:
                    row["error"] = str(exc).splitlines()[0][:200]
                    torch.cuda.empty_cache()
                rows.append(row)
            del q, k, v, do
            torch.cuda.empty_cache()
    math = {(r["dtype"], r["head_dim"]): r for r in rows if r["backend"] == "math" and "fwd_ms" in r}
    for r in rows:
        m = math.get((r["dtype"], r["head_dim"]))
        if m and "fwd_ms" in r and r["backend"] != "math":
            r["speedup_vs_math"] = m["fwd_bwd_ms"] / r["fwd_bwd_ms"]
            r["memory_vs_math"] = r["peak_mib"] / m["peak_mib"] if m["peak_mib"] else None
    return rows
