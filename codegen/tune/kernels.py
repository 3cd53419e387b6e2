"""GPU side: launch the AOTriton tree's own Triton kernels (imported from AOTRITON_DIR/tritonsrc
at run time, never copied) with a chosen config, check them against an fp64 reference and time
them. Needs torch and triton; imported only by GPU paths.

The launch argument lists follow the kernels' signatures in the tree (0.11b `tritonsrc/`:
`fwd_kernel.attn_fwd`, `bwd_preprocess`, `bwd_kernel_dk_dv`, `bwd_kernel_dq`,
`bwd_kernel_fuse`). On NVIDIA the AMD-only launch option `waves_per_eu` is dropped.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")  # the tree's launcher asserts this

import torch  # noqa: E402
import triton  # noqa: E402
from ..upstream import kernel_dirs_text, kernel_source_dir

from ..models.dtypes import DTYPE_INFO  # noqa: E402

# the torch dtypes of the one dtype table (codegen.models.dtypes)
TORCH_DTYPES = {k: getattr(torch, d.torch_attr) for k, d in DTYPE_INFO.items()}
CAUSAL_TYPE_WINDOWED = 3  # what the tree's launcher uses for causal=True (top-left)

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


def load_tree_module(aotriton_dir: Path):
    src = kernel_source_dir(aotriton_dir)
    if src is None or not (src / "flash.py").is_file():
        raise FileNotFoundError(f"{aotriton_dir} has no {kernel_dirs_text()}: not an AOTriton source tree")
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))
    import flash  # noqa: PLC0415  (the tree's own module)

    return flash


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


class TreeKernels:
    """Launchers for the tree's kernels with explicit tiles and compiler options."""

    def __init__(self, aotriton_dir: Path):
        self.flash = load_tree_module(aotriton_dir)
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

    # ---- forward -------------------------------------------------------------------------
    def fwd_launcher(self, p: Problem, block_m, block_n, pre_load_v, opts):
        """Returns (launch, o, L): `launch()` runs the kernel into o/L (fresh each call)."""
        q, k, v = p.q, p.k, p.v
        B, Hq, Sq, D = q.shape
        Hk, Sk = k.shape[1], k.shape[2]
        dev = q.device
        o = torch.empty_like(q)
        L = torch.empty((B * Hq, Sq), device=dev, dtype=torch.float32)
        b = torch.empty((0, 0, 0, 0), device=dev, dtype=q.dtype)
        a = torch.empty((0, 0), device=dev, dtype=q.dtype)
        null = torch.empty((0,), device=dev, dtype=torch.int32)
        u64 = torch.empty((0,), device=dev, dtype=torch.uint64)
        causal_type = CAUSAL_TYPE_WINDOWED if p.causal else 0
        wl, wr = (Sq, 0) if p.causal else (0, 0)
        if p.causal:
            persistent, num_cu = 2, self.num_cu(dev)
            counter = torch.zeros((1,), device=dev, dtype=torch.int32)
            grid = (min(num_cu * 2, _cdiv(Sq, block_m) * Hq * B),)
        else:
            persistent, num_cu, counter = 0, 0, null
            grid = (_cdiv(Sq, block_m), Hq, B)
        kern = self.flash.attn_fwd

        def launch():
            if p.causal:
                counter.zero_()
            kern[grid](
                q, k, v, b, a, p.sm_scale, L, o,
                0, 0, 0, 0, 0,
                *q.stride(), *k.stride(), *v.stride(), *o.stride(), *b.stride(), *a.stride(),
                Num_head_q=Hq, Num_head_k=Hk, Num_seqlens=0, cu_seqlens_q=null, cu_seqlens_k=null,
                Max_seqlen_q=Sq, Max_seqlen_k=Sk, BLOCK_DMODEL=D, Head_dim=D, PADDED_HEAD=False,
                ENABLE_DROPOUT=False, dropout_p=0.0, philox_seed_ptr=u64, philox_offset1=u64,
                philox_offset2=0, philox_seed_output=u64, philox_offset_output=u64,
                RETURN_ENCODED_SOFTMAX=False, encoded_softmax=None,
                CAUSAL_TYPE=causal_type, Window_left=wl, Window_right=wr, BIAS_TYPE=0,
                USE_ALIBI=False, INT8=False, INT8_KV=False, USE_P_SCALE=False,
                PERSISTENT_TYPE=persistent, persistent_atomic_counter=counter, Num_CU=num_cu,
                GRID_CU_MULTIP=2, Batch=B, BLOCK_M=block_m, BLOCK_N=block_n,
                PRE_LOAD_V=bool(pre_load_v), **opts,
            )

        return launch, o, L

    # ---- backward ------------------------------------------------------------------------
    def _bwd_common(self, p: Problem):
        q = p.q
        dev = q.device
        return {
            "b": torch.empty((0, 0, 0, 0), device=dev, dtype=q.dtype),
            "null": torch.empty((0,), device=dev, dtype=torch.int32),
            "u64": torch.empty((0,), device=dev, dtype=torch.uint64),
            "causal_type": CAUSAL_TYPE_WINDOWED if p.causal else 0,
            "window": (q.shape[2], 0) if p.causal else (0, 0),
        }

    @staticmethod
    def _bwd_kwargs(p: Problem, c: dict, block_m: int, block_n: int, opts: dict) -> dict:
        """Keyword arguments the three backward kernels share (by name, so order is free)."""
        B, Hq, Sq, D = p.q.shape
        Hk, Sk = p.k.shape[1], p.k.shape[2]
        return dict(
            num_head_q=Hq, num_head_k=Hk, cu_seqlens_q=c["null"], cu_seqlens_k=c["null"],
            num_seqlens=0, max_seqlen_q=Sq, max_seqlen_k=Sk, head_dim=D, dropout_p=0.0,
            philox_seed_ptr=c["u64"], philox_offset1=c["u64"], philox_offset2=0,
            Window_left=c["window"][0], Window_right=c["window"][1],
            BLOCK_M=block_m, BLOCK_DMODEL=D, BLOCK_N=block_n, CAUSAL_TYPE=c["causal_type"],
            ENABLE_DROPOUT=False, PADDED_HEAD=False, BIAS_TYPE=0, **opts,
        )

    def preprocess_launcher(self, o, do, delta, block_m: int = 64):
        B, H, Sq, D = o.shape
        kern = self.flash.bwd_preprocess

        def launch():
            kern[(_cdiv(Sq, block_m), H, B)](
                o, do, delta, *o.stride(), *do.stride(), Sq, D,
                BLOCK_M=block_m, D_HEAD=D, PADDED_HEAD=False,
            )

        return launch

    def dkdv_launcher(self, p: Problem, L, delta, block_m, block_n, opts):
        q, k, v, do = p.q, p.k, p.v, p.do
        B, Hq, Sq, D = q.shape
        Hk, Sk = k.shape[1], k.shape[2]
        c = self._bwd_common(p)
        kw = self._bwd_kwargs(p, c, block_m, block_n, opts)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        kern = self.flash.bwd_kernel_dk_dv
        b = c["b"]

        def launch():
            kern[(_cdiv(Sk, block_n), Hk, B)](
                q, k, v, b, p.sm_scale, do, dk, dv, L, delta,
                *q.stride(), *k.stride(), *v.stride(), *b.stride(), *do.stride(),
                *dk.stride(), *dv.stride(),
                **kw,
            )

        return launch, (dk, dv)

    def dq_launcher(self, p: Problem, L, delta, block_m, block_n, opts):
        q, k, v, do = p.q, p.k, p.v, p.do
        B, Hq, Sq, D = q.shape
        c = self._bwd_common(p)
        kw = self._bwd_kwargs(p, c, block_m, block_n, opts)
        dq = torch.empty_like(q)
        db = c["b"]
        kern = self.flash.bwd_kernel_dq
        b = c["b"]

        def launch():
            kern[(_cdiv(Sq, block_m), Hq, B)](
                q, k, v, b, p.sm_scale, do, dq, db, L, delta,
                *q.stride(), *k.stride(), *v.stride(), *b.stride(), *do.stride(), *dq.stride(),
                0, 0, 0, 0,
                **kw,
            )

        return launch, (dq,)

    def fuse_launcher(self, p: Problem, o, L, block_m, block_n, opts):
        q, k, v, do = p.q, p.k, p.v, p.do
        B, Hq, Sq, D = q.shape
        Hk, Sk = k.shape[1], k.shape[2]
        c = self._bwd_common(p)
        kw = self._bwd_kwargs(p, c, block_m, block_n, opts)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        db = c["b"]
        kern = self.flash.bwd_kernel_fuse
        b = c["b"]
        grid = (_cdiv(Sk, block_n) + _cdiv(Sq, block_n) * (Hq // Hk), Hk, B)

        def launch():
            kern[grid](
                q, k, v, b, p.sm_scale, o, do, dk, dv, dq, db, L,
                *q.stride(), *k.stride(), *v.stride(), *b.stride(), *o.stride(), *do.stride(),
                *dk.stride(), *dv.stride(), *dq.stride(), 0, 0, 0, 0,
                **kw,
            )

        return launch, (dk, dv, dq)


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
