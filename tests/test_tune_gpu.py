"""tune on a GPU: the tree's kernels run with a chosen config, pass the fp64 check (dropout and
bias entries too, against the kernels' own dropout mask), wrong output or a wrong mask fails it,
and a CLI run resumes without re-measuring. Needs torch + triton + a GPU and an
AOTriton source tree: AOTRITON_SRC when set (any release), else one tree per kernel-signature
generation from AOTRITON_GIT or the shared release archive: 0.11.2b (the signatures of
0.10b-0.11.2b), 0.12b (0.12b's, in tritonsrc/) and 0.13b (the same kernels in
modules/flash/kernel/; 0.12b, 0.12.1b and 0.13b have byte-identical kernel files). The CPU
side of the same launchers, against every release: tests/test_tune_launch_args.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _gpu_or_skip() -> None:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
        pytest.skip("needs torch and triton")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU visible to torch")


GPU_RELEASES = ("0.11.2b", "0.12b", "0.13b")


@pytest.fixture(scope="module", params=["AOTRITON_SRC"] if os.environ.get("AOTRITON_SRC") else GPU_RELEASES)
def tree(request, pristine_tree) -> Path:
    """AOTRITON_SRC when set, else each of GPU_RELEASES from the usual sources (AOTRITON_GIT or
    the shared release archive, see conftest)."""
    _gpu_or_skip()
    if request.param == "AOTRITON_SRC":
        return Path(os.environ["AOTRITON_SRC"])
    return pristine_tree(request.param)


@pytest.fixture(scope="module")
def tk(tree):
    from codegen.gpu.tune.kernels import TreeKernels

    return TreeKernels(tree)


def _spec():
    from codegen.formats.spec import load_spec

    return load_spec(None).spec


@pytest.mark.parametrize("family", ["attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse"])
@pytest.mark.parametrize("causal", [False, True])
def test_measure_entry_passes_reference(tk, family, causal):
    from codegen.models import expand_family
    from codegen.gpu.tune.grid import GridEntry
    from codegen.gpu.tune.runner import Settings, measure_entry, provenance

    sp = _spec()
    entry = GridEntry(family, sp.arch, "fp16", 64, causal, False, False, 256, 256)
    configs = expand_family(sp, family, "fp16", 64)[:3]
    rows = measure_entry(tk, entry, configs, Settings(batch=2, heads=4, warmup_ms=2, rep_ms=5),
                         sp.primary_gpu, provenance(sp.arch))
    assert [r["config"] for r in rows] and {r["status"] for r in rows} == {"ok"}, rows
    assert all(r["time_ms"] > 0 for r in rows)


def test_check_rejects_wrong_output(tk):
    from codegen.gpu.tune.kernels import check, make_problem, reference

    p = make_problem("bf16", 1, 2, 128, 128, 32, True, 7)
    refs = reference(p, 2, want_grads=False)
    fwd, o, _ = tk.fwd_launcher(p, 64, 32, False, tk.opts(4, 1, 1))
    fwd()
    assert check({"out": o}, refs, 2, "bf16")[0]
    bad = o.clone()
    bad[0, 0, 5, :] += 0.25
    ok, errs = check({"out": bad}, refs, 2, "bf16")
    assert not ok and errs.startswith("out=")


def test_cli_run_then_resume_skips_done(tree, tmp_path):
    from typer.testing import CliRunner

    from codegen.cli import app

    args = ["tune", str(tree), "--family", "attn_fwd", "--dtype", "fp16", "--head-dim", "32",
            "--seqlen", "128", "--seqlen", "256", "--square", "--no-causal", "--no-dropout", "--no-bias",
            "--out", str(tmp_path),
            "--batch", "2", "--heads", "2", "--rep-ms", "5", "--warmup-ms", "2", "--compile-jobs", "0"]
    r1 = CliRunner().invoke(app, args)
    assert r1.exit_code == 0, r1.output
    first = (tmp_path / "measurements.csv").read_bytes()
    assert (tmp_path / "winners.csv").read_text().count("\n") == 3  # header + 2 entries
    r2 = CliRunner().invoke(app, args + ["--resume"])
    assert r2.exit_code == 0 and "nothing to do" in r2.output
    assert (tmp_path / "measurements.csv").read_bytes() == first


@pytest.mark.parametrize("family, causal, dropout, bias", [
    *((f, False, True, True) for f in ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse")),
    ("attn_fwd", True, True, False), ("bwd_kernel_fuse", True, True, False)])
def test_dropout_and_bias_entries_pass_reference(tk, family, causal, dropout, bias):
    from codegen.models import expand_family
    from codegen.gpu.tune.grid import GridEntry
    from codegen.gpu.tune.runner import Settings, measure_entry, provenance

    sp = _spec()
    entry = GridEntry(family, sp.arch, "fp16", 64, causal, dropout, bias, 256, 128)
    configs = expand_family(sp, family, "fp16", 64)[:2]
    rows = measure_entry(tk, entry, configs, Settings(batch=2, heads=4, warmup_ms=2, rep_ms=5),
                         sp.primary_gpu, provenance(sp.arch))
    assert {r["status"] for r in rows} == {"ok"}, rows
    checked = {part.split("=")[0] for r in rows for part in r["errors"].split(";")}
    if bias and family in ("bwd_kernel_dq", "bwd_kernel_fuse"):
        assert "db" in checked  # the bias gradient is checked against fp64 too


def test_wrong_dropout_mask_fails(tk):
    from codegen.gpu.tune.kernels import check, make_problem, reference

    p = make_problem("fp16", 2, 4, 256, 256, 64, False, 5, dropout_p=0.5, bias=True)
    keep = tk.dropout_keep(p, 2)
    fwd, o, _ = tk.fwd_launcher(p, 64, 32, False, tk.opts(4, 1, 1))
    fwd()
    assert check({"out": o}, reference(p, 2, False, keep=keep), 2, "fp16")[0]
    other = tk.dropout_keep(make_problem("fp16", 2, 4, 256, 256, 64, False, 6, dropout_p=0.5), 2)
    ok, errs = check({"out": o}, reference(p, 2, False, keep=other), 2, "fp16")
    assert not ok and errs.startswith("out=")
    flipped = keep.clone()
    flipped[0, 1, 7] = ~flipped[0, 1, 7]  # one row of one head
    assert not check({"out": o}, reference(p, 2, False, keep=flipped), 2, "fp16")[0]
