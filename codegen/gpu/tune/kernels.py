"""GPU side: launch the AOTriton tree's own Triton kernels (imported at run time from the
release's kernel folder, `tritonsrc/` or 0.13b's `modules/flash/kernel/`, never copied) with a
chosen config, check them against an fp64 reference and time them. Needs torch and triton;
imported only by GPU paths.

Arguments are passed by name, bound to each kernel's own parameter list
(`codegen.upstream.kernel_args`, shared with `validate --kernels`), so the kernels of every
supported release (0.10b-0.13b: `attn_fwd`, `bwd_preprocess`, `bwd_kernel_dk_dv`,
`bwd_kernel_dq`, `bwd_kernel_fuse`) launch with the same code. On NVIDIA the AMD-only launch
option `waves_per_eu` is dropped.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")  # the tree's launcher asserts this

import torch  # noqa: E402
import triton  # noqa: E402
from codegen.core.errors import UpstreamError  # noqa: E402
from codegen.models.dtypes import DTYPE_INFO  # noqa: E402
from codegen.upstream import kernel_dirs_text, kernel_source_dir  # noqa: E402
from codegen.upstream.kernel_args import bind, load_kernels, param_values  # noqa: E402

# the torch dtypes of the one dtype table (codegen.models.dtypes)
TORCH_DTYPES = {k: getattr(torch, d.torch_attr) for k, d in DTYPE_INFO.items()}

# Tolerances, after upstream's test harness: an output passes when its max abs error against
# the fp64 reference is <= max(ATOL[dtype], FUDGE[tensor] * error of a PyTorch computation in
# the same low precision). FUDGE are upstream's "maximal" fudge factors (tritonsrc/_common_test).
ATOL = {"fp16": 1e-3, "bf16": 8e-3, "fp32": 1e-5}
FUDGE = {"out": 14.0, "dq": 148.0, "dk": 48.0, "dv": 36.0}

FAMILY_OUTPUTS = {
    "attn_fwd": ("out",),
    "bwd_kernel_dk_dv": ("dk", "dv"),
    "bwd_kernel_dq": ("dq",),
    "bwd_kernel_fuse": ("dk", "dv", "dq"),
}


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def load_tree_kernels(aotriton_dir: Path) -> dict:
    """family -> the tree's own kernel (imported by `codegen.upstream.kernel_args.load_kernels`)."""
    src = kernel_source_dir(aotriton_dir)
    if src is None or not (src / "flash.py").is_file():
        raise FileNotFoundError(f"{aotriton_dir} has no {kernel_dirs_text()}: not an AOTriton source tree")
    return load_kernels(src)


def backend() -> str:
    return "hip" if torch.version.hip else "cuda"


@dataclass
class Problem:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    causal: bool
    sm_scale: float


@dataclass
class Launch:
    """One kernel launch, ready to repeat: `launch()` runs `kernel[grid](**args, **opts)`
    (zeroing `reset` first: the persistent grid's atomic counter). `args` are bound by name to
    the kernel's own parameter list (`codegen.upstream.kernel_args.bind`)."""

    kernel: object
    grid: tuple
    args: dict
    opts: dict
    reset: tuple = ()

    def __call__(self) -> None:
        for t in self.reset:
            t.zero_()
        self.kernel[self.grid](**self.args, **self.opts)


class TreeKernels:
    """Launchers for the tree's kernels with explicit tiles and compiler options. Every
    argument is passed by name (`codegen.upstream.kernel_args`), so the kernels of every
    supported release (0.10b-0.13b) launch with the same code."""

    def __init__(self, aotriton_dir: Path):
        self.kernels = load_tree_kernels(aotriton_dir)
        self.backend = backend()
        self._num_cu = {}

    def opts(self, num_warps: int, num_stages: int, waves_per_eu: int) -> dict:
        kw = {"num_warps": num_warps, "num_stages": num_stages}
        if self.backend == "hip":
            kw["waves_per_eu"] = waves_per_eu
        return kw

    def num_cu(self, dev) -> int:
        if dev not in self._num_cu:
            self._num_cu[dev] = (torch.cuda.get_device_properties(dev).multi_processor_count
                                 if dev.type == "cuda" else 8)  # cpu: Triton's interpreter
        return self._num_cu[dev]

    def _launch(self, family: str, t: dict, shape: tuple, causal: bool, sm_scale: float, head_dim: int,
                block_m: int, block_n: int, pre_load_v: bool, opts: dict) -> Launch:
        kern = self.kernels.get(family)
        if kern is None:
            raise UpstreamError(f"this tree has no {family} kernel")
        cfg = {"head_dim": head_dim, "block_m": block_m, "block_n": block_n, "pre_load_v": pre_load_v}
        vals, grid = param_values(family, t, cfg, causal, shape, self.num_cu(t["q"].device),
                                  sm_scale=sm_scale, preprocess_block_m=block_m)
        reset = (t["counter"],) if vals["persistent_atomic_counter"] is t["counter"] else ()
        return Launch(kern, grid, bind(kern, vals), opts, reset)

    @staticmethod
    def _buffers(p: Problem, **have) -> dict:
        """The tensors `param_values` reads: the problem's, the given outputs, empty stand-ins
        for the unused bias/alibi/varlen/dropout ones."""
        q = p.q
        dev = q.device
        b = torch.empty((0, 0, 0, 0), device=dev, dtype=q.dtype)
        t = dict(q=q, k=p.k, v=p.v, do=p.do, o=q, L=None, delta=None, dq=q, dk=p.k, dv=p.v, b=b, db=b,
                 alibi=torch.empty((0, 0), device=dev, dtype=q.dtype),
                 i32null=torch.empty((0,), device=dev, dtype=torch.int32),
                 u64null=torch.empty((0,), device=dev, dtype=torch.uint64),
                 counter=torch.zeros((1,), device=dev, dtype=torch.int32))
        t.update(have)
        return t

    @staticmethod
    def _shape(p: Problem) -> tuple[int, int, int, int, int]:
        B, Hq, Sq, _ = p.q.shape
        return (B, Hq, p.k.shape[1], Sq, p.k.shape[2])

    # ---- forward -------------------------------------------------------------------------
    def fwd_launcher(self, p: Problem, block_m, block_n, pre_load_v, opts):
        """Returns (launch, o, L): `launch()` runs the kernel into o/L (fresh each call)."""
        B, Hq, Sq, D = p.q.shape
        o = torch.empty_like(p.q)
        L = torch.empty((B * Hq, Sq), device=p.q.device, dtype=torch.float32)
        t = self._buffers(p, o=o, L=L, delta=L)
        launch = self._launch("attn_fwd", t, self._shape(p), p.causal, p.sm_scale, D, block_m, block_n,
                              bool(pre_load_v), opts)
        return launch, o, L

    # ---- backward ------------------------------------------------------------------------
    def preprocess_launcher(self, o, do, delta, block_m: int = 64):
        B, H, Sq, D = o.shape
        p = Problem(o, o, o, do, False, 1.0)
        t = self._buffers(p, o=o, L=delta, delta=delta)
        return self._launch("bwd_preprocess", t, (B, H, H, Sq, Sq), False, 1.0, D, block_m, block_m,
                            False, {})

    def _bwd_launcher(self, family: str, p: Problem, bufs: dict, block_m, block_n, opts) -> Launch:
        t = self._buffers(p, **bufs)
        return self._launch(family, t, self._shape(p), p.causal, p.sm_scale, p.q.shape[3], block_m, block_n,
                            False, opts)

    def dkdv_launcher(self, p: Problem, L, delta, block_m, block_n, opts):
        dk, dv = torch.empty_like(p.k), torch.empty_like(p.v)
        bufs = dict(L=L, delta=delta, dk=dk, dv=dv)
        return self._bwd_launcher("bwd_kernel_dk_dv", p, bufs, block_m, block_n, opts), (dk, dv)

    def dq_launcher(self, p: Problem, L, delta, block_m, block_n, opts):
        dq = torch.empty_like(p.q)
        bufs = dict(L=L, delta=delta, dq=dq)
        return self._bwd_launcher("bwd_kernel_dq", p, bufs, block_m, block_n, opts), (dq,)

    def fuse_launcher(self, p: Problem, o, L, block_m, block_n, opts):
        dq, dk, dv = torch.empty_like(p.q), torch.empty_like(p.k), torch.empty_like(p.v)
        bufs = dict(o=o, L=L, delta=L, dq=dq, dk=dk, dv=dv)
        return self._bwd_launcher("bwd_kernel_fuse", p, bufs, block_m, block_n, opts), (dk, dv, dq)


# ---- problems and references ------------------------------------------------------------
def seed_of(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def make_problem(dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                 causal: bool, seed: int, device="cuda") -> Problem:
    g = torch.Generator(device=device).manual_seed(seed)
    dt = TORCH_DTYPES[dtype]

    def rnd(s):
        return torch.randn((batch, heads, s, head_dim), generator=g, device=device, dtype=dt)

    return Problem(rnd(seqlen_q), rnd(seqlen_k), rnd(seqlen_k), rnd(seqlen_q), causal,
                   1.0 / math.sqrt(head_dim))


def attention_math(q, k, v, causal: bool, sm_scale: float):
    """Plain attention in the inputs' dtype (top-left causal, as the tree's launcher)."""
    s = torch.matmul(q, k.transpose(-2, -1)) * sm_scale
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        mask = torch.ones((sq, sk), dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float(), dim=-1).to(q.dtype)
    return torch.matmul(p, v)


def reference(p: Problem, heads: int, want_grads: bool):
    """fp64 and same-dtype references on batch 0, heads [0, heads): dict name -> (ref, lp)."""
    warnings.filterwarnings("ignore", message="Attempting to run cuBLAS")  # harmless, first use
    sl = (slice(0, 1), slice(0, heads))
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    res = {}
    for kind, dt in (("ref", torch.float64), ("lp", p.q.dtype)):
        q, k, v = (t[sl].detach().to(dt).requires_grad_(want_grads) for t in (p.q, p.k, p.v))
        o = attention_math(q, k, v, p.causal, p.sm_scale)
        grads = {}
        if want_grads:
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), p.do[sl].to(dt))
            grads = {"dq": dq.detach(), "dk": dk.detach(), "dv": dv.detach()}
        res[kind] = {"out": o.detach(), **grads}
        del q, k, v, o
    for name in res["ref"]:
        out[name] = (res["ref"][name], res["lp"][name])
    return out


def check(outputs: dict[str, torch.Tensor], refs, heads: int, dtype: str):
    """-> (passed, 'name=err/tol;...')."""
    parts, ok = [], True
    for name, t in sorted(outputs.items()):
        ref, lp = refs[name]
        got = t[0:1, 0:heads].to(torch.float64)
        err = (got - ref).abs().max().item()
        lp_err = (lp.to(torch.float64) - ref).abs().max().item()
        tol = max(ATOL[dtype], FUDGE[name] * lp_err)
        if not (err <= tol):  # NaN fails too
            ok = False
        parts.append(f"{name}={err:.3g}/{tol:.3g}")
    return ok, ";".join(parts)


def bench(fn, warmup_ms: int, rep_ms: int) -> float:
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def device_info(target_arch: str) -> tuple[str, str]:
    """-> (device name, proxy label: '' when the GPU is the target arch itself)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = props.name
    if torch.version.hip:
        arch = getattr(props, "gcnArchName", "").split(":")[0]
        return name, "" if arch == target_arch else f"amd-{arch}-proxy"
    return name, "nvidia-proxy"
