"""The fp64 reference of what `execute` runs: scaled dot-product attention forward (out and the
natural-log logsumexp AOTriton's forward writes to L) and backward (dq, dk, dv, and db with a
bias), computed in numpy float64 from the very low-precision values the kernels read; grouped
query heads (Hq a multiple of Hk), a top-left causal mask (key j hidden from query i when j > i:
what the library's WindowedAttention with both windows TopLeftAligned is), an additive bias, and
dropout through a given keep-mask scaled by 1/(1-p) (the mask the library's kernels draw, as
upstream's tests take it: `debug_simulate_encoded_softmax`'s output >= 0).

Also the one place that spells fp16 and bf16 as bytes (bf16 has no numpy dtype: its bits are the
top half of a float32's, rounded to nearest even), and the tolerance rule of the comparison.

numpy is imported here only (the `upstream` extra brings it); `execute` checks for it first."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# the unit roundoff of each dtype (half an ulp at 1.0)
EPS = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 2.0 ** -24}
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4, "u64": 8, "i32": 4}


def to_bytes(x: np.ndarray, dtype: str) -> bytes:
    """float values as the bytes of `dtype` (rounded to nearest even), C order."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "fp16":
        return x.astype(np.float16).tobytes()
    if dtype == "bf16":
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    if dtype == "fp32":
        return x.tobytes()
    raise ValueError(f"no float spelling for {dtype}")


def from_bytes(data: bytes, dtype: str, count: int) -> np.ndarray:
    """`count` values of `dtype` from `data`, as float64."""
    if dtype == "fp16":
        return np.frombuffer(data, np.float16, count).astype(np.float64)
    if dtype == "bf16":
        u = np.frombuffer(data, np.uint16, count).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    if dtype == "fp32":
        return np.frombuffer(data, np.float32, count).astype(np.float64)
    raise ValueError(f"no float spelling for {dtype}")


def rounded(x: np.ndarray, dtype: str) -> np.ndarray:
    """x rounded to `dtype` and back to float64: the values a kernel reads."""
    return from_bytes(to_bytes(x, dtype), dtype, x.size).reshape(x.shape)


@dataclass(frozen=True)
class Reference:
    out: np.ndarray
    lse: np.ndarray     # (batch * heads_q, seqlen_q), as the library's L
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    db: np.ndarray | None


def attention(q, k, v, do, *, scale: float, causal: bool, bias=None, keep=None, dropout_p: float = 0.0) -> Reference:
    """fp64 forward and backward (module doc). q, do: (B, Hq, Sq, D); k, v: (B, Hk, Sk, D); bias:
    (B, Hq, Sq, Sk) or None; keep: boolean (B, Hq, Sq, Sk) or None (no dropout)."""
    q, k, v, do = (np.asarray(t, np.float64) for t in (q, k, v, do))
    b, hq, sq, _ = q.shape
    hk, sk = k.shape[1], k.shape[2]
    g = hq // hk
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kk) * scale
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    if causal:
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], -np.inf, s)
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    l_ = e.sum(axis=-1, keepdims=True)
    p = e / l_
    lse = (m + np.log(l_))[..., 0]
    drop = np.ones_like(p) if keep is None else np.asarray(keep, np.float64) / (1.0 - dropout_p)
    pd = p * drop
    out = np.einsum("bhij,bhjd->bhid", pd, vv)
    dv = np.einsum("bhij,bhid->bhjd", pd, do).reshape(b, hk, g, sk, -1).sum(axis=2)
    dp = np.einsum("bhid,bhjd->bhij", do, vv) * drop
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = np.einsum("bhij,bhjd->bhid", ds, kk) * scale
    dk = (np.einsum("bhij,bhid->bhjd", ds, q) * scale).reshape(b, hk, g, sk, -1).sum(axis=2)
    return Reference(out, lse.reshape(b * hq, sq), dq, dk, dv, ds if bias is not None else None)


# The tolerance of each compared tensor, in units of its dtype's roundoff (EPS) times the largest
# magnitude of its reference (at least 1): what a correct kernel's rounding stays within, with room
# (docs/emulate.md gives the measured errors). lse is written in fp32 from the dtype's inputs.
TOLERANCE_UNITS = {"out": 8.0, "lse": 8.0, "dq": 32.0, "dk": 32.0, "dv": 16.0, "db": 32.0}


def tolerance(name: str, dtype: str, ref: np.ndarray) -> float:
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    return TOLERANCE_UNITS[name] * EPS[dtype] * scale


def max_error(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest absolute difference; inf where either holds a NaN or an infinity the other lacks."""
    if got.shape != ref.shape:
        return math.inf
    bad = ~np.isfinite(got) & np.isfinite(ref)
    if bad.any():
        return math.inf
    ok = np.isfinite(ref)
    return float(np.abs(got[ok] - ref[ok]).max()) if ok.any() else 0.0


__all__ = ["EPS", "ITEMSIZE", "Reference", "TOLERANCE_UNITS", "attention", "from_bytes", "max_error", "rounded",
           "to_bytes", "tolerance"]
