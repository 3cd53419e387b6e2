#!/usr/bin/env python3
"""Attention throughput on the GPU at hand, in one table: the AOTriton tree's Triton kernels at
the tuned configs (tuning/<arch>/winners.csv) and at the untuned default config, PyTorch SDPA
forced to the math backend, and PyTorch's native flash backend; fwd and fwd+bwd, TFLOP/s and ms,
with ratios.

  python scripts/bench_attention.py AOTRITON_DIR [--tuning-dir tuning/gfx908] [--json OUT.json]

"default" is what the tree's own launcher (tritonsrc/attn_torch_function.py) uses without
tuning: fwd BLOCK 128x64 (64x64/halved for fp32 … here fp16/bf16 only), 4 warps, 1 stage, no
PRE_LOAD_V; bwd split kernels 32x32, 4 warps, 1 stage. The fwd+bwd of the tree's kernels is
fwd + bwd_preprocess + bwd_kernel_dk_dv + bwd_kernel_dq (upstream's split backward).
FLOPs: fwd 4*B*H*Sq*Sk*D (halved when causal), fwd+bwd 3.5x that (bwd = 2.5x fwd).
Timings: triton.testing.do_bench medians (warm-up excluded), fresh random inputs per row.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from codegen.formats.tuning_db import SEQLEN_BINS, bin_of  # noqa: E402
from codegen.gpu.tune.kernels import TreeKernels, make_problem, seed_of  # noqa: E402

DEFAULT_FWD = dict(block_m=128, block_n=64, num_warps=4, num_stages=1, waves_per_eu=2, pre_load_v=False)
DEFAULT_BWD = dict(block_m=32, block_n=32, num_warps=4, num_stages=1, waves_per_eu=1)


def load_winners(folder: Path) -> dict:
    out = {}
    path = folder / "winners.csv"
    if not path.is_file():
        return out
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            key = (r["family"], r["dtype"], int(r["head_dim"]), int(r["causal"]),
                   int(r["dropout"]), int(r["bias"]), int(r["seqlen_q"]), int(r["seqlen_k"]))
            out[key] = {
                "block_m": int(r["block_m"]), "block_n": int(r["block_n"]),
                "num_warps": int(r["num_warps"]), "num_stages": int(r["num_stages"]),
                "waves_per_eu": int(r["waves_per_eu"]),
                "pre_load_v": r.get("pre_load_v") in ("1", "True", "true"),
                "config": r["config"],
            }
    return out


def bench(fn, grad_to_none=None) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                         return_mode="median"))


def tree_fns(tk: TreeKernels, p, fwd_cfg: dict, dkdv_cfg: dict, dq_cfg: dict, fuse_cfg=None):
    """(fwd, fwd+bwd split, fwd+bwd fused or None, o) over the tree's kernels."""
    fo = tk.opts(fwd_cfg["num_warps"], fwd_cfg["num_stages"], fwd_cfg["waves_per_eu"])
    fwd, o, L = tk.fwd_launcher(p, fwd_cfg["block_m"], fwd_cfg["block_n"], fwd_cfg["pre_load_v"], fo)
    delta = torch.empty_like(L)
    pre = tk.preprocess_launcher(o, p.do, delta)
    kv, _ = tk.dkdv_launcher(p, L, delta, dkdv_cfg["block_m"], dkdv_cfg["block_n"],
                             tk.opts(dkdv_cfg["num_warps"], dkdv_cfg["num_stages"], dkdv_cfg["waves_per_eu"]))
    dq, _ = tk.dq_launcher(p, L, delta, dq_cfg["block_m"], dq_cfg["block_n"],
                           tk.opts(dq_cfg["num_warps"], dq_cfg["num_stages"], dq_cfg["waves_per_eu"]))

    def fwdbwd():
        fwd()
        pre()
        kv()
        dq()

    if fuse_cfg is None:
        return fwd, fwdbwd, None, o
    fu, _ = tk.fuse_launcher(p, o, L, fuse_cfg["block_m"], fuse_cfg["block_n"],
                             tk.opts(fuse_cfg["num_warps"], fuse_cfg["num_stages"], fuse_cfg["waves_per_eu"]))

    def fused():
        fwd()
        fu()

    return fwd, fwdbwd, fused, o


def sdpa_fns(p, backend):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (p.q, p.k, p.v))

    def fwd():
        with sdpa_kernel([backend]), torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=p.causal, scale=p.sm_scale)

    def fwdbwd():
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=p.causal, scale=p.sm_scale)
        o.backward(p.do)

    return fwd, fwdbwd, (q, k, v)


def safe(fn, *a, **kw):
    try:
        return fn(*a, **kw)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "oom"
    except Exception as exc:  # a backend that refuses the shape, a kernel that fails
        torch.cuda.empty_cache()
        return f"err:{type(exc).__name__}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("aotriton_dir", type=Path)
    ap.add_argument("--tuning-dir", type=Path, default=Path("tuning/gfx908"),
                    help="winners.csv of the 'tuned' column (default: tuning/gfx908).")
    ap.add_argument("--extra", action="append", default=[], metavar="LABEL=DIR",
                    help="Another winners.csv to bench as its own column (repeatable).")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dims", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--dtypes", nargs="+", default=["fp16", "bf16"])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--no-math", action="store_true", help="Skip the math backend (slow, memory-hungry).")
    ap.add_argument("--json", type=Path, default=None, help="Also write the rows as JSON.")
    a = ap.parse_args()

    tk = TreeKernels(a.aotriton_dir)
    tuned_sources = [("tuned", a.tuning_dir)]
    for item in a.extra:
        label, _, folder = item.partition("=")
        tuned_sources.append((label, Path(folder)))
    winners = {label: load_winners(folder) for label, folder in tuned_sources}
    dev = torch.cuda.get_device_name()
    print(f"# device {dev}; torch {torch.__version__}; triton {triton.__version__}; "
          f"B={a.batch} H={a.heads}; " +
          "; ".join(f"{lab}: {fol}/winners.csv ({len(winners[lab])} rows)" for lab, fol in tuned_sources),
          flush=True)
    labels = [lab for lab, _ in tuned_sources]
    rows = []
    for hd in a.head_dims:
        for dt in a.dtypes:
            for causal in a.causal:
                for s in a.seqlens:
                    p = make_problem(dt, a.batch, a.heads, s, s, hd, bool(causal), seed_of(f"bench.{hd}.{dt}.{causal}.{s}"))
                    flops = 4.0 * a.batch * a.heads * s * s * hd * (0.5 if causal else 1.0)
                    sb = bin_of(SEQLEN_BINS, s)
                    res = {"head_dim": hd, "dtype": dt, "causal": causal, "seqlen": s, "bin": sb,
                           "labels": labels}
                    fns = {}
                    for lab in labels:
                        w = winners[lab]

                        def pick(fam, default):
                            return w.get((fam, dt, hd, causal, 0, 0, sb, sb)) or default

                        tf, tkv = pick("attn_fwd", None), pick("bwd_kernel_dk_dv", None)
                        tdq, tfu = pick("bwd_kernel_dq", None), pick("bwd_kernel_fuse", None)
                        res[f"{lab}_configs"] = [c["config"] if c else "MISSING(default)" for c in (tf, tkv, tdq, tfu)]
                        fns[lab] = safe(tree_fns, tk, p, tf or DEFAULT_FWD, tkv or DEFAULT_BWD,
                                        tdq or DEFAULT_BWD, tfu)
                    fns["default"] = safe(tree_fns, tk, p, DEFAULT_FWD, DEFAULT_BWD, DEFAULT_BWD)
                    fns["flash"] = sdpa_fns(p, SDPBackend.FLASH_ATTENTION)
                    if not a.no_math:
                        fns["math"] = sdpa_fns(p, SDPBackend.MATH)
                    for name, f in fns.items():
                        if isinstance(f, str):
                            res[f"{name}_fwd_ms"] = res[f"{name}_fwdbwd_ms"] = f
                            continue
                        if name in ("flash", "math"):
                            fwd, fb, extra = f
                            res[f"{name}_fwd_ms"] = safe(bench, fwd)
                            res[f"{name}_fwdbwd_ms"] = safe(bench, fb, grad_to_none=list(extra))
                            continue
                        fwd, split, fused, _ = f
                        res[f"{name}_fwd_ms"] = safe(bench, fwd)
                        t_split = safe(bench, split)
                        t_fused = safe(bench, fused) if fused is not None else "-"
                        res[f"{name}_split_ms"], res[f"{name}_fused_ms"] = t_split, t_fused
                        # upstream's op database picks split or fused backward per input
                        cands = [(t, k) for t, k in ((t_split, "split"), (t_fused, "fused")) if isinstance(t, float)]
                        if cands:
                            res[f"{name}_fwdbwd_ms"], res[f"{name}_bwd"] = min(cands)
                        else:
                            res[f"{name}_fwdbwd_ms"] = t_split
                    # agreement of the tree's fwd (tuned) with native flash, as a sanity check
                    if not isinstance(fns["tuned"], str):
                        fns["tuned"][0]()
                        ref = fns["flash"][0]()
                        res["tuned_vs_flash_fwd_maxdiff"] = (fns["tuned"][3].float() - ref.float()).abs().max().item()
                    for k in list(res):
                        if k.endswith("_ms") and isinstance(res[k], float):
                            mult = 1.0 if k.endswith("_fwd_ms") else 3.5
                            res[k[:-3] + "_tflops"] = flops * mult / (res[k] * 1e-3) / 1e12
                    rows.append(res)
                    print(fmt_row(res, labels), flush=True)
                    del fns, p
                    torch.cuda.empty_cache()
    print()
    print_table(rows, dev, labels)
    if a.json:
        a.json.write_text(json.dumps({"device": dev, "torch": torch.__version__,
                                      "triton": triton.__version__, "rows": rows}, indent=1) + "\n")


def _f(v, fmt="{:.3f}"):
    return fmt.format(v) if isinstance(v, float) else str(v)


def _ratio(a, b):
    return f"{b / a:.2f}x" if isinstance(a, float) and isinstance(b, float) else "-"


def fmt_row(r, labels) -> str:
    return (f"d{r['head_dim']} {r['dtype']} causal={r['causal']} s={r['seqlen']}: " +
            " ".join(f"{m}={_f(r.get(m + '_fwd_ms'))}/{_f(r.get(m + '_fwdbwd_ms'))}ms"
                     for m in (*labels, "default", "flash", "math")))


def print_table(rows, dev, labels) -> None:
    sources = (*labels, "default", "flash", "math")
    hdr = ["hd", "dtype", "causal", "seqlen", "pass"]
    for m in sources:
        hdr += [f"{m} ms", "TF/s"]
    for lab in labels:
        hdr += [f"{lab}/default", f"{lab}/flash", f"{lab}/math"]
    lines = []
    for r in rows:
        for pas in ("fwd", "fwdbwd"):
            g = lambda m, what: r.get(f"{m}_{pas}_{what}", "-")  # noqa: E731
            line = [str(r["head_dim"]), r["dtype"], str(r["causal"]), str(r["seqlen"]),
                    "fwd" if pas == "fwd" else "fwd+bwd"]
            for m in sources:
                ms = _f(g(m, "ms"))
                if pas == "fwdbwd" and r.get(f"{m}_bwd") == "fused":
                    ms += "*"
                line += [ms, _f(g(m, "tflops"), "{:.1f}")]
            for lab in labels:
                line += [_ratio(g(lab, "ms"), g(o, "ms")) for o in ("default", "flash", "math")]
            lines.append(line)
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(hdr)]
    print(f"## {dev}: X/Y = time of Y / time of X (>1: X faster); * = fused backward kernel won")
    print(" | ".join(h.rjust(w) for h, w in zip(hdr, widths)))
    print("-+-".join("-" * w for w in widths))
    for l in lines:
        print(" | ".join(c.rjust(w) for c, w in zip(l, widths)))


if __name__ == "__main__":
    main()
