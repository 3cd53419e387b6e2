"""tune's fp64 references for dropout and bias entries, on the CPU: the tree's own kernels (every
family, forward and backward, with dropout, with a bias and with both) run under Triton's
interpreter and pass the same check a GPU run applies, against a reference whose dropout mask
comes from the tree's own mask writer; a wrong mask fails it. The same on a GPU:
tests/test_tune_gpu.py.

The interpreter is chosen when Triton is imported, so the kernels run in a spawned process with
TRITON_INTERPRET=1. There, Triton's interpreter passes float arguments on as Python floats and
lacks `int % constexpr`, where the compiled kernels get an fp32 and constexpr arithmetic: the
process supplies both, and the kernels run unchanged."""

from __future__ import annotations

import multiprocessing as mp
import shutil
from concurrent.futures import ProcessPoolExecutor

import pytest

from codegen.upstream import kernel_source_dir

pytestmark = pytest.mark.aotriton

FAMILIES = ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse")
CASES = ((False, True, True), (True, True, False), (False, False, True))  # (causal, dropout, bias)


def _interpreter_shims() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    plain = interpreter._implicit_cvt

    def cvt(arg):
        if isinstance(arg, float):
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return plain(arg)

    interpreter._implicit_cvt = cvt
    if not hasattr(tl.constexpr, "__rmod__"):
        tl.constexpr.__rmod__ = lambda self, other: tl.constexpr(other % self.value)


def _cfg(family: str, block_m: int, block_n: int):
    from codegen.models import KernelConfig

    return KernelConfig(family, "gfx908", "fp16", 32, block_m, block_n, 1, 4, 1,
                        False if family == "attn_fwd" else None)


def _interpreted(tree: str) -> list[dict]:
    """In the spawned process: every case of CASES, what the checks said."""
    from pathlib import Path

    _interpreter_shims()
    from codegen.gpu.tune.kernels import TreeKernels, check, make_problem, reference

    tk = TreeKernels(Path(tree))
    out = []
    for causal, dropout, bias in CASES:
        res = {"case": (causal, dropout, bias), "checks": {}}
        p = make_problem("fp16", 1, 2, 64, 48, 32, causal, 11, device="cpu", dropout_p=0.5 if dropout else 0.0,
                         bias=bias)
        keep = tk.dropout_keep(p, 2) if dropout else None
        refs = reference(p, 2, want_grads=True, keep=keep)
        res["refs"] = sorted(refs)
        bwd = tk.bwd_inputs(p, (32, 16))
        for family in FAMILIES:
            launch, outs = tk.launcher(family, p, _cfg(family, 32, 16), bwd)
            launch()
            res["checks"][family] = (sorted(outs), *check(outs, refs, 2, "fp16"))
        if dropout:
            res["kept"] = keep.float().mean().item()
            # the mask of another Philox seed is not the kernels' mask: the check must fail
            wrong = tk.dropout_keep(make_problem("fp16", 1, 2, 64, 48, 32, causal, 12, device="cpu",
                                                 dropout_p=0.5), 2)
            res["masks_differ"] = bool((wrong != keep).any())
            launch, outs = tk.launcher("attn_fwd", p, _cfg("attn_fwd", 16, 16), bwd)
            launch()
            res["wrong_mask"] = check(outs, reference(p, 2, want_grads=False, keep=wrong), 2, "fp16")
            try:
                reference(p, 2, want_grads=False)
                res["maskless"] = "accepted"
            except ValueError as exc:
                res["maskless"] = str(exc)
        out.append(res)
    return out


def test_dropout_and_bias_entries_pass_against_fp64(pristine_tree, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    # 0.11.2b: the kernels of 0.10b-0.11.2b (0.12b's need a newer interpreter; the GPU test runs them)
    src = kernel_source_dir(pristine_tree("0.11.2b"))
    tree = tmp_path / "aotriton"
    shutil.copytree(src, tree / "tritonsrc")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        results = ex.submit(_interpreted, str(tree)).result(timeout=600)
    assert [r["case"] for r in results] == list(CASES)
    for r in results:
        causal, dropout, bias = r["case"]
        grads = {"dq", "dk", "dv"} | ({"db"} if bias else set())
        assert set(r["refs"]) == {"out"} | grads
        for family, (names, ok, errs) in r["checks"].items():
            assert ok, f"{r['case']} {family}: {errs}"
        assert set().union(*(set(n) for n, _, _ in r["checks"].values())) == {"out"} | grads
        assert ("db" in r["checks"]["bwd_kernel_dq"][0]) == bias == ("db" in r["checks"]["bwd_kernel_fuse"][0])
        if dropout:
            assert 0.4 < r["kept"] < 0.6 and r["masks_differ"]
            ok, errs = r["wrong_mask"]
            assert not ok and errs.startswith("out="), errs
            assert "needs the kernels' dropout mask" in r["maskless"]
