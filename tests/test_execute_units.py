"""The fp64 reference of executed attention (codegen.ship.reference), checked independently: its
gradients against central finite differences of its own forward (GQA, causal, bias, dropout
mask), its softmax against a direct evaluation, and the bf16/fp16 spellings against known bit
patterns. Pure numpy, in seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codegen.ship.reference import EPS, attention, from_bytes, max_error, rounded, to_bytes, tolerance

RNG = np.random.default_rng(7)
B, HQ, HK, SQ, SK, D = 1, 4, 2, 5, 6, 3
Q, K, V, DO = (RNG.standard_normal(s) for s in ((B, HQ, SQ, D), (B, HK, SK, D), (B, HK, SK, D), (B, HQ, SQ, D)))
BIAS = RNG.standard_normal((B, HQ, SQ, SK))
KEEP = RNG.random((B, HQ, SQ, SK)) > 0.3


def _numeric(which: str, causal: bool, kw: dict) -> np.ndarray:
    """d(sum(out * DO))/d(which) by central differences."""
    args = {"q": Q, "k": K, "v": V, "b": kw.get("bias")}
    base = args[which]
    grad = np.zeros_like(base)
    h = 1e-6
    for idx in np.ndindex(base.shape):
        vals = []
        for sign in (1, -1):
            t = base.copy()
            t[idx] += sign * h
            a = dict(args, **{which: t})
            extra = {k: v for k, v in kw.items() if k != "bias"}
            out = attention(a["q"], a["k"], a["v"], DO, scale=0.4, causal=causal, bias=a["b"], **extra).out
            vals.append((out * DO).sum())
        grad[idx] = (vals[0] - vals[1]) / (2 * h)
    return grad


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["plain", "bias", "dropout"])
def test_gradients_match_finite_differences(causal, variant):
    kw = {"plain": {}, "bias": {"bias": BIAS}, "dropout": {"keep": KEEP, "dropout_p": 0.3}}[variant]
    r = attention(Q, K, V, DO, scale=0.4, causal=causal, **kw)
    for name, got in (("q", r.dq), ("k", r.dk), ("v", r.dv)) + ((("b", r.db),) if variant == "bias" else ()):
        assert np.abs(_numeric(name, causal, kw) - got).max() < 1e-6, name
    if variant != "bias":
        assert r.db is None


def test_forward_is_softmax_and_lse_is_natural():
    r = attention(Q, K, V, DO, scale=0.4, causal=True)
    for h in range(HQ):
        for i in range(SQ):
            s = [0.4 * float(Q[0, h, i] @ K[0, h // 2, j]) for j in range(i + 1)]   # keys 0..i (top-left)
            lse = math.log(sum(math.exp(x) for x in s))
            out = sum(math.exp(x - lse) * V[0, h // 2, j] for j, x in enumerate(s))
            assert abs(r.lse[h, i] - lse) < 1e-12 and np.abs(r.out[0, h, i] - out).max() < 1e-12


def test_dtype_spellings():
    x = np.array([1.0, -2.0, 1 + 2 ** -9, 1 + 3 * 2 ** -9, 3.0e38], np.float32)
    # bf16: 1+2^-9 rounds to even (1.0), 1+3*2^-9 up to 1+2^-7; the top half of each float32
    assert np.frombuffer(to_bytes(x, "bf16"), np.uint16).tolist() == [0x3F80, 0xC000, 0x3F80, 0x3F81, 0x7F62]
    assert from_bytes(to_bytes(x, "bf16"), "bf16", 5)[:4].tolist() == [1.0, -2.0, 1.0, 1 + 2 ** -7]
    assert np.frombuffer(to_bytes(x[:2], "fp16"), np.uint16).tolist() == [0x3C00, 0xC000]
    y = RNG.standard_normal(1000)
    for dt in ("fp16", "bf16"):
        assert np.abs(rounded(y, dt) - y).max() <= EPS[dt] * np.abs(y).max()
        assert np.array_equal(rounded(rounded(y, dt), dt), rounded(y, dt))


def test_max_error_and_tolerance():
    ref = np.array([1.0, 2.0, np.inf])
    assert max_error(np.array([1.0, 2.5, np.inf]), ref) == 0.5
    assert max_error(np.array([np.nan, 2.0, np.inf]), ref) == math.inf
    assert max_error(np.array([1.0, 2.0]), ref) == math.inf
    assert tolerance("out", "fp16", np.array([0.5])) == 8 * 2.0 ** -11      # magnitude below 1 counts as 1
    assert tolerance("out", "bf16", np.array([-4.0])) == 8 * 2.0 ** -8 * 4
