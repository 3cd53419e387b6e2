"""GPU-side helpers shared by both checks: environment, fp64 reference, comparisons, proof.

Imported only once torch is known to be importable.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from codegen.core.errors import EnvironmentMissing
from codegen.models.dtypes import DTYPE_INFO
from codegen.core.fsutil import sha256_file
from codegen.ship.layout import images_signature
from codegen.upstream.releases import IMAGES_DIR
from codegen.models.cases import Case, Shape, tolerance

DEVICE = "cuda"  # tests and CPU dry runs switch it
# the torch dtypes of the one dtype table (codegen.models.dtypes)
DTYPES = {k: getattr(torch, d.torch_attr) for k, d in DTYPE_INFO.items()}


@dataclass(frozen=True)
class Platform:
    kind: str  # "rocm" | "cuda"
    device_name: str
    arch: str  # gfx908 / sm_90
    arch_full: str
    torch_version: str
    hip_version: str | None
    cuda_version: str | None
    compute_units: int | None = None  # CUs (SMs on NVIDIA)

    @property
    def self_test(self) -> bool:
        return self.kind != "rocm"

    def as_dict(self) -> dict:
        d = asdict(self)
        return {"platform": d.pop("kind"), **d}


def detect_platform() -> Platform:
    if not torch.cuda.is_available():
        build = f"a ROCm build (HIP {torch.version.hip})" if torch.version.hip else (
            f"a CUDA build (CUDA {torch.version.cuda})" if torch.version.cuda else "a CPU-only build")
        raise EnvironmentMissing(
            f"no GPU: torch {torch.__version__} ({build}) sees no device "
            "(torch.cuda.is_available() is False); validate runs kernels on a GPU",
            hint="run it on the MI100 machine (ROCm torch), or on any NVIDIA GPU for the harness self-test",
        )
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip:
        full = getattr(props, "gcnArchName", "") or "unknown"
        return Platform("rocm", props.name, full.split(":")[0], full, torch.__version__,
                        torch.version.hip, None, props.multi_processor_count)
    cap = f"sm_{props.major}{props.minor}"
    return Platform("cuda", props.name, cap, cap, torch.__version__, None, torch.version.cuda,
                    props.multi_processor_count)


# --- reference -----------------------------------------------------------------------------------
def make_inputs(case: Case, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cpu").manual_seed(seed)
    s = case.shape
    dt = DTYPES[case.dtype]
    q = torch.randn(s.batch, s.heads_q, s.seqlen_q, case.head_dim, generator=g)
    k = torch.randn(s.batch, s.heads_k, s.seqlen_k, case.head_dim, generator=g)
    v = torch.randn(s.batch, s.heads_k, s.seqlen_k, case.head_dim, generator=g)
    do = torch.randn(s.batch, s.heads_q, s.seqlen_q, case.head_dim, generator=g)
    return tuple(t.to(device=device, dtype=dt) for t in (q, k, v, do))


def reference(q, k, v, do, causal: bool):
    """Attention and its gradients in float64 (GQA by repeating K/V heads; causal = top-left)."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kk = k64.repeat_interleave(rep, dim=1)
    vv = v64.repeat_interleave(rep, dim=1)
    scale = 1.0 / (q.shape[-1] ** 0.5)
    s = torch.matmul(q64, kk.transpose(-2, -1)) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(0)
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    o = torch.matmul(p, vv)
    lse = torch.logsumexp(s, dim=-1)
    o.backward(do.double())
    return o.detach(), q64.grad, k64.grad, v64.grad, lse.detach()


def compare(name: str, kind: str, dtype: str, got: torch.Tensor, ref: torch.Tensor,
            math_err: float | None = None) -> dict:
    g = got.detach().double()
    finite = bool(torch.isfinite(g).all())
    ref_max = float(ref.abs().max()) if ref.numel() else 0.0
    # all zeros is the signature of missing kernel images; demand non-zero where the exact
    # answer is non-zero (a causal single query row has zero dq/dk: one key, softmax = 1)
    nonzero = bool(g.abs().max() > 0) if g.numel() else False
    if ref_max < 1e-6:
        nonzero = True
    err = float((g - ref).abs().max()) if finite else float("inf")
    tol = tolerance(kind, dtype, ref_max, math_err)
    ok = finite and nonzero and err <= tol
    return {
        "tensor": name,
        "max_abs_err": err,
        "ref_max": ref_max,
        "math_err": math_err,
        "tol": tol,
        "finite": finite,
        "nonzero": nonzero,
        "ok": ok,
    }


# --- proof ---------------------------------------------------------------------------------------
_MAP_RE = re.compile(r"(/\S*libaotriton\S*\.so[\S]*)$")


def mapped_aotriton(maps_text: str | None = None) -> list[str]:
    """Paths of AOTriton libraries mapped into this process (from /proc/self/maps)."""
    if maps_text is None:
        try:
            maps_text = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    found = set()
    for line in maps_text.splitlines():
        m = _MAP_RE.search(line.strip())
        if m:
            found.add(m.group(1))
    return sorted(found)


def aotriton_proof(arch: str) -> dict:
    libs = mapped_aotriton()
    out: dict = {"mapped_files": libs}
    if not libs:
        return out
    lib = Path(libs[0])
    out["file"] = lib.name
    out["path"] = str(lib)
    with contextlib.suppress(OSError):
        out["sha256"] = sha256_file(lib)
    img = lib.parent / IMAGES_DIR / f"amd-{arch}"
    out["images_dir"] = str(img)
    if img.is_dir():
        sig, n = images_signature(img)
        out["images_signature"] = sig
        out["images_files"] = n
    else:
        out["images_signature"] = None
        out["images_files"] = 0
    return out


def profile_run(fn) -> tuple[list[str], list[str]]:
    """Names of the GPU kernels `fn` launches and of the ATen ops it calls, as torch's profiler
    sees them (on a machine without a GPU: the ops alone)."""
    on_gpu = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])) as prof:
        fn()
        if on_gpu:
            torch.cuda.synchronize()
    kernels, ops = set(), set()
    for e in prof.events():
        if getattr(e, "device_type", None) == DeviceType.CUDA:
            kernels.add(e.name)
        elif e.name.startswith("aten::"):
            ops.add(e.name)
    return sorted(kernels), sorted(ops)


def profile_kernels(fn) -> list[str]:
    """Names of the GPU kernels `fn` launches, as torch's profiler sees them."""
    return profile_run(fn)[0]


def time_ms(fn, reps: int = 10) -> float:
    """Median wall time on the GPU (CUDA/HIP events) over `reps` runs after one warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def peak_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / (1 << 20)


def env_snapshot() -> dict:
    keys = ("TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
            "TRITON_F32_DEFAULT", "LD_PRELOAD")
    return {k: os.environ[k] for k in keys if k in os.environ}


def shape_dict(s: Shape) -> dict:
    return {"batch": s.batch, "heads_q": s.heads_q, "heads_k": s.heads_k,
            "seqlen_q": s.seqlen_q, "seqlen_k": s.seqlen_k}
