"""tune on a GPU: the tree's kernels run with a chosen config, pass the fp64 check (dropout and
bias entries too, against the kernels' own dropout mask), wrong output or a wrong mask fails it,
a CLI run resumes without re-measuring, a planted hanging kernel and a killed worker cost one
candidate each, and two workers measure what one does. Needs torch + triton + a GPU and an
AOTriton source tree: AOTRITON_SRC when set (any release), else one tree per kernel-signature
generation from AOTRITON_GIT or the shared release archive: 0.11.2b (the signatures of
0.10b-0.11.2b), 0.12b (0.12b's, in tritonsrc/) and 0.13b (the same kernels in
modules/flash/kernel/; 0.12b, 0.12.1b and 0.13b have byte-identical kernel files). The CPU
side of the same launchers, against every release: tests/test_tune_launch_args.py."""

from __future__ import annotations

import importlib.util
import os
import signal
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


# ---- a planted hang and a killed worker, on the GPU ----------------------------------------
def _spin_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def spin(flag, out):
        i = 0
        while tl.load(flag, volatile=True) == 0:  # flag stays 0: never returns
            i += 1
            tl.store(out, i)

    return spin


class _Planted:
    """The tree's kernels, except that one candidate launches an infinite loop and another one
    kills its worker (as the OOM killer would)."""

    def __init__(self, tk, hang: str, crash: str):
        self.tk, self.hang, self.crash = tk, hang, crash
        self.backend = tk.backend

    def __getattr__(self, name):
        return getattr(self.tk, name)

    def launcher(self, family, p, cfg, bwd):
        import torch

        from codegen.gpu.tune.kernels import Launch

        if cfg.name == self.crash:
            os.kill(os.getpid(), signal.SIGKILL)
        launch, outs = self.tk.launcher(family, p, cfg, bwd)
        if cfg.name == self.hang:
            flag = torch.zeros(2, dtype=torch.int32, device=p.q.device)
            launch = Launch(_spin_kernel(), (1,), {"flag": flag, "out": flag[1:]}, {})
        return launch, outs


def planted_handle(state, job, names, report):
    """measure_handle with the second kernel group of the entry hanging and the third crashing."""
    from codegen.gpu.tune.grid import group_effective
    from codegen.gpu.tune.runner import measure_entry

    tk, prov = state
    entry, configs, gpu, s = job
    groups = group_effective(configs, tk.backend)
    planted = _Planted(tk, groups[1][0].name, groups[2][0].name)
    measure_entry(planted, entry, [c for c in configs if c.name in set(names)], s, gpu, prov, report)


@pytest.fixture(scope="module")
def one_tree(pristine_tree) -> Path:
    _gpu_or_skip()
    return Path(os.environ["AOTRITON_SRC"]) if os.environ.get("AOTRITON_SRC") else pristine_tree("0.11.2b")


def _run(tree, entries, devices, handle=None, timeout_s=30.0):
    from codegen.gpu.tune import runner
    from codegen.models import expand_family

    sp = _spec()
    got = {}
    s = runner.Settings(batch=2, heads=4, warmup_ms=2, rep_ms=10, timeout_s=timeout_s)
    stats = runner.run_entries(tree, sp.arch, sp.primary_gpu,
                               ((e, expand_family(sp, e.family, e.dtype, e.head_dim)) for e in entries), s,
                               devices, lambda e, rows, err, dev: got.__setitem__(e.name, (rows, err, dev)),
                               **({"handle": handle} if handle else {}))
    return got, stats


def test_a_hanging_kernel_and_a_killed_worker_cost_one_candidate_each(one_tree):
    from codegen.gpu.tune.grid import GridEntry, group_effective
    from codegen.models import expand_family
    from codegen.gpu.tune.store import pick_winner

    sp = _spec()
    entry = GridEntry("attn_fwd", sp.arch, "fp16", 64, False, True, False, 512, 512)
    got, stats = _run(one_tree, [entry], [0], planted_handle, timeout_s=20.0)
    rows, err, _ = got[entry.name]
    assert not err
    groups = group_effective(expand_family(sp, "attn_fwd", "fp16", 64), "cuda")
    status = {r["config"]: r["status"] for r in rows}
    assert {status[c.name] for c in groups[1]} == {"timeout"}
    assert {status[c.name] for c in groups[2]} == {"crash"}
    assert {status[c.name] for g in groups[:1] + groups[3:] for c in g} == {"ok"}  # the rest went on
    assert pick_winner(rows)["config"] not in {c.name for g in groups[1:3] for c in g}
    assert stats[0].timeouts == 1 and stats[0].crashes == 1 and stats[0].restarts == 2


def test_two_workers_on_one_gpu_measure_what_one_does(one_tree):
    from codegen.gpu.tune.grid import GridEntry

    sp = _spec()
    entries = [GridEntry(f, sp.arch, "bf16", 32, c, d, b, 512, 512)
               for f in ("attn_fwd", "bwd_kernel_dq") for c, d, b in ((False, False, False), (False, True, True))]
    one, _ = _run(one_tree, entries, [0])
    two, stats = _run(one_tree, entries, [0, 0])
    assert sorted(one) == sorted(two) == sorted(e.name for e in entries)
    assert sum(st.jobs for st in stats) == len(entries) and all(st.jobs for st in stats)
    for name in one:
        st1 = {r["config"]: r["status"] for r in one[name][0]}
        st2 = {r["config"]: r["status"] for r in two[name][0]}
        assert st1 == st2 and set(st1.values()) == {"ok"}, name
