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
FUDGE = {"out": 14.0, "dq": 148.0, "dk": 48.0, "dv": 36.0, "db": 17.0}


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
    """Inputs of one measured problem. With dropout the kernels draw their mask from Philox
    (`philox_seed`, `philox_offset`: one uint64 tensor each, plus the integer `philox_offset2`);
    `bias` is the (batch, heads, seqlen_q, seqlen_k) matrix added to the scaled scores."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    causal: bool
    sm_scale: float
    dropout_p: float = 0.0
    philox_seed: torch.Tensor | None = None
    philox_offset: torch.Tensor | None = None
    philox_offset2: int = 0
    bias: torch.Tensor | None = None


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

    def compile(self) -> None:
        """Compile it into Triton's cache without running anything on the GPU (Triton's warmup),
        and its host-side launcher, which would otherwise be built at its first launch in a
        measuring worker (best effort: the launcher class is an internal of Triton's driver)."""
        compiled = self.kernel.warmup(grid=self.grid, **self.args, **self.opts)
        try:
            triton.runtime.driver.active.launcher_cls(compiled.src, compiled.metadata)
        except Exception:  # another Triton's driver: the first launch builds it
            pass


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
        """Compute units of the GPU `dev` (meta tensors: the current GPU; cpu: Triton's interpreter)."""
        if dev not in self._num_cu:
            gpu = dev if dev.type == "cuda" else torch.cuda.current_device() if dev.type == "meta" else None
            self._num_cu[dev] = torch.cuda.get_device_properties(gpu).multi_processor_count if gpu is not None else 8
        return self._num_cu[dev]

    def _launch(self, family: str, t: dict, p: "Problem", shape: tuple, block_m: int, block_n: int,
                pre_load_v: bool, opts: dict) -> Launch:
        kern = self.kernels.get(family)
        if kern is None:
            raise UpstreamError(f"this tree has no {family} kernel")
        cfg = {"head_dim": p.q.shape[3], "block_m": block_m, "block_n": block_n, "pre_load_v": pre_load_v}
        vals, grid = param_values(family, t, cfg, p.causal, shape, self.num_cu(t["q"].device),
                                  sm_scale=p.sm_scale, preprocess_block_m=block_m, dropout_p=p.dropout_p,
                                  philox_offset2=p.philox_offset2, bias=p.bias is not None)
        reset = (t["counter"],) if vals["persistent_atomic_counter"] is t["counter"] else ()
        return Launch(kern, grid, bind(kern, vals), opts, reset)

    @staticmethod
    def _buffers(p: Problem, **have) -> dict:
        """The tensors `param_values` reads: the problem's, the given outputs, empty stand-ins
        for the unused bias/alibi/varlen/dropout ones."""
        q = p.q
        dev = q.device
        b = torch.empty((0, 0, 0, 0), device=dev, dtype=q.dtype)
        u64null = torch.empty((0,), device=dev, dtype=torch.uint64)
        t = dict(q=q, k=p.k, v=p.v, do=p.do, o=q, L=None, delta=None, dq=q, dk=p.k, dv=p.v,
                 b=b if p.bias is None else p.bias, db=b,
                 alibi=torch.empty((0, 0), device=dev, dtype=q.dtype),
                 i32null=torch.empty((0,), device=dev, dtype=torch.int32), u64null=u64null,
                 philox_seed=u64null if p.philox_seed is None else p.philox_seed,
                 philox_offset=u64null if p.philox_offset is None else p.philox_offset,
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
        launch = self._launch("attn_fwd", t, p, self._shape(p), block_m, block_n, bool(pre_load_v), opts)
        return launch, o, L

    def dropout_keep(self, p: Problem, heads: int, compile_only: bool = False) -> torch.Tensor:
        """The dropout mask the kernels draw for batch 0, heads [0, heads): True = kept. Written
        by the tree's own `debug_simulate_encoded_softmax` from the problem's Philox seed and
        offsets (the sign of its output is the mask)."""
        Sq, Sk = p.q.shape[2], p.k.shape[2]
        r = torch.zeros((1, heads, Sq, Sk), device=p.q.device, dtype=torch.float32)
        launch = self._launch("dropout_mask", self._buffers(p, mask=r), p, self._shape(p), 32, 32, False, {})
        launch.compile() if compile_only else launch()
        return r >= 0

    def launcher(self, family: str, p: Problem, cfg, bwd: tuple = (None, None, None)):
        """(launch, its outputs by name) of a tuned family with config `cfg`; backward families
        read `bwd` = (o, L, delta) of the same problem (`bwd_inputs`)."""
        opts = self.opts(cfg.num_warps, cfg.num_stages, cfg.waves_per_eu)
        o, L, delta = bwd
        if family == "attn_fwd":
            launch, out, _ = self.fwd_launcher(p, cfg.block_m, cfg.block_n, cfg.pre_load_v, opts)
            return launch, {"out": out}
        if family == "bwd_kernel_dk_dv":
            return self.dkdv_launcher(p, L, delta, cfg.block_m, cfg.block_n, opts)
        if family == "bwd_kernel_dq":
            return self.dq_launcher(p, L, delta, cfg.block_m, cfg.block_n, opts)
        return self.fuse_launcher(p, o, L, cfg.block_m, cfg.block_n, opts)

    def bwd_inputs(self, p: Problem, tile: tuple[int, int], compile_only: bool = False):
        """(o, L, delta) the backward kernels read, as upstream's split backward makes them: o and
        L from the forward kernel with `tile`, delta from bwd_preprocess (compile_only: both
        kernels compiled, nothing run)."""
        fwd, o, L = self.fwd_launcher(p, tile[0], tile[1], False, self.opts(4, 1, 1))
        delta = torch.empty_like(L)
        for launch in (fwd, self.preprocess_launcher(o, p.do, delta)):
            launch.compile() if compile_only else launch()
        return o, L, delta

    # ---- backward ------------------------------------------------------------------------
    def preprocess_launcher(self, o, do, delta, block_m: int = 64):
        B, H, Sq, D = o.shape
        p = Problem(o, o, o, do, False, 1.0)
        t = self._buffers(p, o=o, L=delta, delta=delta)
        return self._launch("bwd_preprocess", t, p, (B, H, H, Sq, Sq), block_m, block_m, False, {})

    def _bwd_launcher(self, family: str, p: Problem, bufs: dict, block_m, block_n, opts) -> Launch:
        t = self._buffers(p, **bufs)
        return self._launch(family, t, p, self._shape(p), block_m, block_n, False, opts)

    def _db(self, p: Problem, outs: dict) -> dict:
        """With a bias, the backward kernels that write its gradient get a `db` buffer."""
        if p.bias is not None:
            outs["db"] = torch.empty_like(p.bias)
        return outs

    def dkdv_launcher(self, p: Problem, L, delta, block_m, block_n, opts):
        """Returns (launch, outputs by name: dk, dv)."""
        outs = {"dk": torch.empty_like(p.k), "dv": torch.empty_like(p.v)}
        return self._bwd_launcher("bwd_kernel_dk_dv", p, dict(L=L, delta=delta, **outs), block_m, block_n,
                                  opts), outs

    def dq_launcher(self, p: Problem, L, delta, block_m, block_n, opts):
        """Returns (launch, outputs by name: dq, and db with a bias)."""
        outs = self._db(p, {"dq": torch.empty_like(p.q)})
        return self._bwd_launcher("bwd_kernel_dq", p, dict(L=L, delta=delta, **outs), block_m, block_n,
                                  opts), outs

    def fuse_launcher(self, p: Problem, o, L, block_m, block_n, opts):
        """Returns (launch, outputs by name: dk, dv, dq, and db with a bias)."""
        outs = self._db(p, {"dk": torch.empty_like(p.k), "dv": torch.empty_like(p.v),
                            "dq": torch.empty_like(p.q)})
        return self._bwd_launcher("bwd_kernel_fuse", p, dict(o=o, L=L, delta=L, **outs), block_m, block_n,
                                  opts), outs


# ---- problems and references ------------------------------------------------------------
def seed_of(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def make_problem(dtype: str, batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
                 causal: bool, seed: int, device="cuda", dropout_p: float = 0.0,
                 bias: bool = False) -> Problem:
    """Normal inputs drawn from `seed`; with dropout a Philox seed and offset drawn from it too,
    with a bias a normal bias matrix. device "meta": the shapes, strides and dtypes alone (what a
    kernel is compiled for), no memory."""
    g = torch.Generator(device=device).manual_seed(seed) if device != "meta" else None
    dt = TORCH_DTYPES[dtype]

    def rnd(*shape):
        if g is None:
            return torch.empty(shape, device=device, dtype=dt)
        return torch.randn(shape, generator=g, device=device, dtype=dt)

    p = Problem(rnd(batch, heads, seqlen_q, head_dim), rnd(batch, heads, seqlen_k, head_dim),
                rnd(batch, heads, seqlen_k, head_dim), rnd(batch, heads, seqlen_q, head_dim), causal,
                1.0 / math.sqrt(head_dim))
    if bias:
        p.bias = rnd(batch, heads, seqlen_q, seqlen_k)
    if dropout_p > 0.0:
        philox = seed_of(f"philox {seed}")
        p.dropout_p = dropout_p
        p.philox_seed = torch.tensor([philox], device=device, dtype=torch.uint64)
        p.philox_offset = torch.tensor([philox >> 8], device=device, dtype=torch.uint64)
        p.philox_offset2 = 0x1000
    return p


def attention_math(q, k, v, causal: bool, sm_scale: float, bias=None, keep=None, dropout_p: float = 0.0):
    """Plain attention in the inputs' dtype (top-left causal, as the tree's launcher): the bias
    added to the scaled scores, the dropout mask `keep` applied to the softmax (kept entries
    scaled by 1/(1-dropout_p))."""
    s = torch.matmul(q, k.transpose(-2, -1)) * sm_scale
    if bias is not None:
        s = s + bias
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        mask = torch.ones((sq, sk), dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s.float() if s.dtype != torch.float64 else s, dim=-1)
    if keep is not None:
        p = p * keep / (1.0 - dropout_p)
    return torch.matmul(p.to(q.dtype), v)


def reference(p: Problem, heads: int, want_grads: bool, keep: torch.Tensor | None = None):
    """fp64 and same-dtype references on batch 0, heads [0, heads): dict name -> (ref, lp).
    `keep`: the dropout mask of those heads (`TreeKernels.dropout_keep`), needed with dropout;
    with a bias the gradients include `db`."""
    if p.dropout_p > 0.0 and keep is None:
        raise ValueError("a problem with dropout needs the kernels' dropout mask for its reference")
    warnings.filterwarnings("ignore", message="Attempting to run cuBLAS")  # harmless, first use
    sl = (slice(0, 1), slice(0, heads))
    res = {}
    for kind, dt in (("ref", torch.float64), ("lp", p.q.dtype)):
        ins = [t[sl].detach().to(dt).requires_grad_(want_grads) for t in (p.q, p.k, p.v)]
        if p.bias is not None:
            ins.append(p.bias[sl].detach().to(dt).requires_grad_(want_grads))
        o = attention_math(*ins[:3], p.causal, p.sm_scale, bias=ins[3] if len(ins) > 3 else None,
                           keep=keep, dropout_p=p.dropout_p)
        res[kind] = {"out": o.detach()}
        if want_grads:
            grads = torch.autograd.grad(o, ins, p.do[sl].to(dt))
            res[kind].update(zip(("dq", "dk", "dv", "db"), (g.detach() for g in grads)))
        del ins, o
    return {name: (res["ref"][name], res["lp"][name]) for name in res["ref"]}


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
