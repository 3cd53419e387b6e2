"""The tree's own Triton kernels, called by name: how `tune` and `validate --kernels` import them
and which value each of their parameters gets. One owner for both stages.

The kernels are imported flat from the release's kernel folder (`kernel_source_dir`:
`tritonsrc/` up to 0.12.1b, `modules/flash/kernel/` for 0.13b), never copied. Arguments are
passed by name: `param_values` holds a value for every parameter name any supported release's
kernels take, and `bind` keeps those the kernel's own parameter list (the JITFunction's
`arg_names`) names, refusing a kernel whose required parameters it does not know.

How the signatures differ between releases (positions as well as names, so positional calls
break where named ones do not):

- 0.10b, 0.11b, 0.11.1b, 0.11.2b: identical for all five kernels.
- 0.12b (0.12.1b and 0.13b keep 0.12b's): the head dimension is split in two, `Head_dim` ->
  `Hdim_qk` + `Hdim_vo` (attn_fwd) and `head_dim` -> `hdim_qk` + `hdim_vo` (backward kernels;
  bwd_kernel_fuse's was a constexpr, the new two are not); attn_fwd, bwd_kernel_dk_dv,
  bwd_kernel_dq and bwd_kernel_fuse gain `seq_strides_q`/`seq_strides_k` (padded varlen
  layout, empty here); attn_fwd, bwd_kernel_dk_dv and bwd_kernel_dq gain the constexpr
  `NUM_XCDS` (1: no XCD remapping, the grid keeps its order); bwd_preprocess replaces
  `seqlen_q`/`head_dim` with `cu_seqlens_q`, `num_seqlens`, `max_seqlen_q`, `hdim_vo`.
- Dropout and bias take the same names in every release (`ENABLE_DROPOUT`, `dropout_p`,
  `philox_seed_ptr`, `philox_offset1`, `philox_offset2`; `BIAS_TYPE`, `B`, `DB` and their
  strides), and so does `dropout_rng.debug_simulate_encoded_softmax`, upstream's own writer of
  the dropout mask its kernels draw (its tests build their reference's mask with it).

Pure Python: `t` maps buffer names to tensors, or to anything with `.stride()` (tests use
stand-ins), so the binding is checked on CPU against every release tree.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

from codegen.core.errors import UpstreamError

# family -> (module of the kernel folder, kernel function)
FAMILY_MODULES: dict[str, tuple[str, str]] = {
    "attn_fwd": ("fwd_kernel", "attn_fwd"),
    "bwd_preprocess": ("bwd_preprocess", "bwd_preprocess"),
    "bwd_kernel_dk_dv": ("bwd_kernel_dk_dv", "bwd_kernel_dk_dv"),
    "bwd_kernel_dq": ("bwd_kernel_dq", "bwd_kernel_dq"),
    "bwd_kernel_fuse": ("bwd_kernel_fuse", "bwd_kernel_fuse"),
}
# kernels of the tree that are not tuned but that tune launches: the dropout mask the kernels
# draw from Philox, written as the sign of an "encoded softmax" (>= 0: kept)
AUX_MODULES: dict[str, tuple[str, str]] = {
    "dropout_mask": ("dropout_rng", "debug_simulate_encoded_softmax"),
}
# the buffers `param_values` reads from `t`; with dropout also `philox_seed` and
# `philox_offset` (one uint64 each), for "dropout_mask" the mask tensor `mask`
BUFFERS = ("q", "k", "v", "do", "o", "L", "delta", "dq", "dk", "dv", "db", "b", "alibi",
           "i32null", "u64null", "counter")
PREPROCESS_BLOCK_M = 16  # bwd_preprocess's tile (it only computes delta; not a tuned kernel)



def block_dmodel(head_dim: int) -> int:
    """The kernels' BLOCK_DMODEL: head_dim rounded up to a multiple of 16 that splits into at
    most three powers of two (how the Triton kernels factor the head dimension)."""
    m = max(16, (head_dim + 15) // 16 * 16)
    while bin(m // 16).count("1") > 3:
        m += 16
    return m


def import_flat(folder: Path, module: str):
    """`module` of the kernel folder `folder`, imported flat (kernels import each other by bare
    module name, so the folder goes first on sys.path). Every flat module the folder holds a file
    of but that was imported from elsewhere (another tree's kernel folder, by this function or
    anyone) is dropped first, so one process can load the kernels of several trees in turn."""
    src = Path(folder).resolve()
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if "." not in name and f and (src / f"{name}.py").is_file() and Path(f).resolve() != src / f"{name}.py":
            del sys.modules[name]
    if str(src) in sys.path:
        sys.path.remove(str(src))
    sys.path.insert(0, str(src))
    importlib.invalidate_caches()
    return importlib.import_module(module)


def load_kernels(src: Path) -> dict[str, object]:
    """family -> the kernel (a Triton JITFunction) of the kernel folder `src` (`import_flat`). A
    family whose module the folder lacks is left out."""
    kernels: dict[str, object] = {}
    for fam, (mod, fn) in {**FAMILY_MODULES, **AUX_MODULES}.items():
        try:
            m = import_flat(src, mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        if hasattr(m, fn):
            kernels[fam] = getattr(m, fn)
    return kernels


@dataclass(frozen=True)
class Param:
    name: str
    required: bool  # no default in the signature
    constexpr: bool  # annotated tl.constexpr: a compile-time value, part of the kernel's identity


def kernel_params(kernel) -> list[Param]:
    """The kernel's own parameter list, in order: a JITFunction's `params` (names as in
    `arg_names`), else the plain function's signature."""
    params = getattr(kernel, "params", None)
    if params is not None and all(hasattr(p, "is_constexpr") for p in params):
        return [Param(p.name, not p.has_default, bool(p.is_constexpr)) for p in params]
    sig = inspect.signature(getattr(kernel, "fn", kernel))
    return [Param(n, p.default is p.empty, "constexpr" in str(p.annotation))
            for n, p in sig.parameters.items()]


def bind(kernel, values: dict) -> dict:
    """The keyword arguments for `kernel`: of `values`, the names its parameter list has.
    UpstreamError naming them when it requires parameters `values` does not hold."""
    params = kernel_params(kernel)
    missing = [p.name for p in params if p.required and p.name not in values]
    if missing:
        name = getattr(getattr(kernel, "fn", kernel), "__name__", "kernel")
        raise UpstreamError(f"{name} of this tree takes parameters the launcher does not know: "
                            f"{', '.join(missing)}")
    return {p.name: values[p.name] for p in params if p.name in values}


def _strides(prefix: str, t, names: str = "zhmk") -> dict:
    return {f"stride_{prefix}{c}": s for c, s in zip(names, t.stride())}


def param_values(family: str, t: dict, cfg: dict, causal: bool, shape: tuple, n_cu: int,
                 sm_scale: float | None = None,
                 preprocess_block_m: int = PREPROCESS_BLOCK_M, dropout_p: float = 0.0,
                 philox_offset2: int = 0, bias: bool = False) -> tuple[dict, tuple]:
    """Every parameter a kernel of `family` may take, by name (a superset of the names of
    releases 0.10b–0.13b), and the launch grid. `t` maps each of BUFFERS to a tensor; `cfg`
    holds the config's head_dim, block_m, block_n and pre_load_v; `shape` is (batch, heads_q,
    heads_k, seqlen_q, seqlen_k); `n_cu` the GPU's compute units (causal attn_fwd runs
    upstream's persistent grid); sm_scale defaults to 1/sqrt(head_dim). `dropout_p` > 0 turns
    dropout on (Philox seed and offset from `t`, plus `philox_offset2`); `bias` adds `t["b"]`
    (BIAS_TYPE 1) and has the backward write its gradient into `t["db"]`. "dropout_mask" runs
    over the batches and heads `t["mask"]` holds (from 0), with the problem's head count."""
    B, Hq, Hk, Sq, Sk = shape
    hd = cfg["head_dim"]
    bd = block_dmodel(hd)
    bm, bn = cfg["block_m"], cfg["block_n"]
    scale = 1.0 / hd ** 0.5 if sm_scale is None else sm_scale
    q, k, v, do, o, b, alibi = (t[n] for n in ("q", "k", "v", "do", "o", "b", "alibi"))
    vals = dict(
        Q=q, K=k, V=v, B=b, A=alibi, DO=do, Out=o, L=t["L"], D=t["delta"], Delta=t["delta"],
        DQ=t["dq"], DK=t["dk"], DV=t["dv"], DB=t["db"],
        Sm_scale=scale, sm_scale=scale,
        Num_head_q=Hq, Num_head_k=Hk, num_head_q=Hq, num_head_k=Hk,
        Num_seqlens=0, num_seqlens=0, cu_seqlens_q=t["i32null"], cu_seqlens_k=t["i32null"],
        seq_strides_q=t["i32null"], seq_strides_k=t["i32null"],
        Max_seqlen_q=Sq, Max_seqlen_k=Sk, max_seqlen_q=Sq, max_seqlen_k=Sk, seqlen_q=Sq,
        BLOCK_DMODEL=bd, D_HEAD=bd, PADDED_HEAD=bd != hd,
        Head_dim=hd, head_dim=hd, Hdim_qk=hd, Hdim_vo=hd, hdim_qk=hd, hdim_vo=hd,
        philox_seed_output=t["u64null"], philox_offset_output=t["u64null"],
        RETURN_ENCODED_SOFTMAX=False, encoded_softmax=None,
        CAUSAL_TYPE=3 if causal else 0, Window_left=Sq if causal else 0, Window_right=0,
        USE_ALIBI=False, INT8=False, INT8_KV=False, USE_P_SCALE=False,
        Q_descale=0, K_descale=0, P_scale=0, P_descale=0, V_descale=0,
        GRID_CU_MULTIP=2, Batch=B, NUM_XCDS=1,
        BLOCK_M=bm, BLOCK_N=bn, PRE_LOAD_V=bool(cfg.get("pre_load_v")),
        PERSISTENT_TYPE=0, persistent_atomic_counter=t["i32null"], Num_CU=0,
        **_strides("q", q), **_strides("k", k, "zhnk"), **_strides("v", v, "zhkn"),
        **_strides("b", b, "zhmn"), stride_az=alibi.stride()[0], stride_ah=alibi.stride()[1],
        **_strides("o", o, "zhmn"), stride_ok=o.stride()[3],
        **_strides("do", do, "zhmk"), stride_don=do.stride()[3],
        **_strides("dq", t["dq"]), **_strides("dk", t["dk"], "zhnk"), **_strides("dv", t["dv"], "zhkn"),
        **_features(t, dropout_p, philox_offset2, bias),
    )
    return vals, _grid(family, vals, t, shape, bm, bn, causal, n_cu, preprocess_block_m)


def _features(t: dict, dropout_p: float, philox_offset2: int, bias: bool) -> dict:
    """The dropout and bias parameters: off, or on with the Philox seed/offsets and the bias
    and its gradient from `t` (all-zero gradient strides tell the backward not to write one)."""
    drop = dropout_p > 0.0
    return dict(
        ENABLE_DROPOUT=drop, dropout_p=dropout_p,
        philox_seed_ptr=t["philox_seed"] if drop else t["u64null"],
        philox_offset1=t["philox_offset"] if drop else t["u64null"],
        philox_offset2=philox_offset2 if drop else 0,
        BIAS_TYPE=1 if bias else 0,
        **(_strides("db", t["db"], "zhmn") if bias else dict.fromkeys(
            ("stride_dbz", "stride_dbh", "stride_dbm", "stride_dbn"), 0)),
    )


def _grid(family: str, vals: dict, t: dict, shape: tuple, bm: int, bn: int, causal: bool, n_cu: int,
          preprocess_block_m: int) -> tuple:
    """The launch grid of `family` (updating `vals` where the grid takes parameters of its own)."""
    B, Hq, Hk, Sq, Sk = shape
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    if family == "attn_fwd":
        if causal:  # upstream's choice for causal: a dynamic persistent grid
            vals.update(PERSISTENT_TYPE=2, persistent_atomic_counter=t["counter"], Num_CU=n_cu)
            grid = (min(n_cu * 2, cdiv(Sq, bm) * Hq * B),)
        else:
            grid = (cdiv(Sq, bm), Hq, B)
    elif family == "bwd_preprocess":
        vals["BLOCK_M"] = preprocess_block_m
        grid = (cdiv(Sq, preprocess_block_m), Hq, B)
    elif family == "bwd_kernel_dk_dv":
        grid = (cdiv(Sk, bn), Hk, B)
    elif family == "bwd_kernel_dq":
        grid = (cdiv(Sq, bm), Hq, B)
    elif family == "bwd_kernel_fuse":
        grid = (cdiv(Sk, bn) + cdiv(Sq, bn) * (Hq // Hk), Hk, B)
    elif family == "dropout_mask":
        r = t["mask"]
        vals.update(R=r, **_strides("r", r, "zhmn"))
        grid = (cdiv(Sq, bm), r.shape[1], r.shape[0])
    else:
        raise ValueError(family)
    return grid
