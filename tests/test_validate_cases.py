"""`mi100-codegen validate`: the pure parts (matrix, tolerances, task planning, report, proof
parsing), the kernel-parameter coverage against real AOTriton trees, and the no-GPU refusal."""

from __future__ import annotations

import ast
import importlib.util
import json

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.formats.spec import load_spec
from codegen.upstream import SUPPORTED_RELEASES
from codegen.upstream.kernel_args import FAMILY_MODULES, block_dmodel, param_values
from codegen.models.cases import KERNEL_SHAPES, SHAPES, sdpa_cases, tolerance
from codegen.gpu.validate.kernels import plan_tasks, tree_source_dir
from codegen.gpu.validate.report import render_markdown, summarize

runner = CliRunner()
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def spec():
    return load_spec(None).spec


def test_seqlens_are_not_multiples_of_any_block_size():
    for s in SHAPES + KERNEL_SHAPES:
        for n in (s.seqlen_q, s.seqlen_k):
            if n == 1:
                continue
            assert all(n % b for b in (16, 32, 64, 128, 256)), n
    assert any(s.gqa for s in SHAPES) and any(s.gqa for s in KERNEL_SHAPES)


def test_matrix_covers_spec(spec):
    cases = sdpa_cases(spec)
    assert {c.dtype for c in cases} == set(spec.dtypes)
    assert {c.head_dim for c in cases} == set(spec.head_dims)
    assert {c.causal for c in cases} == {False, True}
    assert len(cases) == len(spec.dtypes) * len(spec.head_dims) * 2 * len(SHAPES)
    assert len({c.name for c in cases}) == len(cases)


def test_block_dmodel_factors_into_three_powers_of_two():
    assert [block_dmodel(d) for d in (8, 16, 32, 40, 64, 72, 80, 96, 112, 128, 240, 256)] == \
        [16, 16, 32, 48, 64, 80, 80, 96, 112, 128, 256, 256]


def test_tolerance_uses_math_error_fudge():
    assert tolerance("fwd", "fp16", 1.0, None) == pytest.approx(2e-3 + 1e-2)
    assert tolerance("fwd", "fp16", 1.0, 1.0) == pytest.approx(5.0)


def test_nvidia_merges_configs_differing_only_in_waves_per_eu(spec):
    amd = plan_tasks(spec, amd=True)
    nv = plan_tasks(spec, amd=False)
    names_amd = sorted(n for t in amd for n in t.names)
    names_nv = sorted(n for t in nv for n in t.names)
    assert names_amd == names_nv  # every spec config is covered either way
    assert len(nv) < len(amd)
    assert all(len(t.names) == 1 for t in amd)
    # every task's config is one the spec ships
    from codegen.models import expand_space

    shipped = {c.name for cfgs in expand_space(spec).values() for c in cfgs}
    assert set(names_amd) == shipped


class _T:
    """A stand-in tensor: only strides matter for the parameter table."""

    def __init__(self, *strides):
        self._s = strides or (1, 1, 1, 1)

    def stride(self):
        return self._s


def _kernel_params(tree, family):
    mod, fn = FAMILY_MODULES[family]
    src = tree_source_dir(tree) / f"{mod}.py"
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            n_def = len(node.args.defaults)
            args = [a.arg for a in node.args.args]
            return args[: len(args) - n_def] if n_def else args
    raise AssertionError(f"{fn} not in {src}")


@pytest.mark.aotriton
@pytest.mark.parametrize("tag", SUPPORTED_RELEASES)  # 0.13b: kernels in modules/flash/kernel/
def test_harness_supplies_every_kernel_parameter(pristine_tree, tag):
    tree = pristine_tree(tag)
    t = {n: _T() for n in ("q", "k", "v", "do", "o", "L", "delta", "dq", "dk", "dv", "db", "b",
                          "alibi", "i32null", "u64null", "counter")}
    cfg = {"head_dim": 64, "block_m": 64, "block_n": 32, "pre_load_v": False}
    for family in FAMILY_MODULES:
        vals, grid = param_values(family, t, cfg, True, (2, 8, 2, 331, 149), 120)
        missing = [p for p in _kernel_params(tree, family) if p not in vals]
        assert not missing, f"{tag} {family}: {missing}"
        assert all(isinstance(g, int) and g > 0 for g in grid)


def test_tree_errors(tmp_path):
    with pytest.raises(Exception, match="not an AOTriton source tree"):
        tree_source_dir(tmp_path)


def test_mapped_aotriton_parses_proc_maps():
    pytest.importorskip("torch")
    from codegen.gpu.validate.gpu import mapped_aotriton

    maps = (
        "7f00-7f10 r--p 00000000 08:01 123 /venv/lib/python3.12/site-packages/torch/lib/libaotriton_v2.so.0.11.0\n"
        "7f10-7f20 r-xp 00010000 08:01 123 /venv/lib/python3.12/site-packages/torch/lib/libaotriton_v2.so.0.11.0\n"
        "7f20-7f30 r--p 00000000 08:01 124 /venv/lib/python3.12/site-packages/torch/lib/libtorch_hip.so\n"
        "7f30-7f40 rw-p 00000000 00:00 0 \n"
    )
    assert mapped_aotriton(maps) == ["/venv/lib/python3.12/site-packages/torch/lib/libaotriton_v2.so.0.11.0"]


def _report(status_list, proof_ok=True):
    cases = [{"name": f"c{i}", "status": s, "checks": [{"tensor": "out", "max_abs_err": 1e-3, "tol": 1e-2}]}
             for i, s in enumerate(status_list)]
    r = {
        "mode": "sdpa", "label": "self-test", "cases": cases,
        "platform": {"platform": "cuda", "device_name": "X", "arch_full": "sm_90", "torch_version": "2.11",
                     "hip_version": None, "cuda_version": "12.8"},
        "spec": {"display": "rules/mi100.yaml", "sha256": "ab" * 32, "arch": "gfx908", "head_dims": [32, 64],
                 "dtypes": ["fp16"]},
        "proof": {"checks": [{"what": "w", "ok": proof_ok, "detail": "d"}], "kernels": {}, "aotriton": {}},
        "perf": [],
    }
    r["summary"] = summarize(r)
    return r


def test_summary_and_markdown():
    r = _report(["pass", "skip"])
    assert r["summary"]["ok"] is True
    md = render_markdown(r)
    assert "**Result: PASS**" in md and "> self-test" in md and "| `c1` | skip |" in md
    assert _report(["pass", "fail"])["summary"]["ok"] is False
    assert _report(["pass"], proof_ok=False)["summary"]["ok"] is False
    assert _report(["skip"])["summary"]["ok"] is False  # nothing passed is not a pass


def test_validate_without_gpu_or_torch_is_clear():
    if HAS_TORCH:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present")
    r = runner.invoke(app, ["validate"])
    assert r.exit_code == 3, r.output  # a missing environment: exit 3, as in tune
    if HAS_TORCH:
        assert "no GPU" in r.output
    else:
        assert "validate needs torch" in r.output
    assert "Traceback" not in r.output


def test_validate_kernels_bad_tree_is_clear(tmp_path):
    r = runner.invoke(app, ["validate", "--kernels", str(tmp_path)])
    assert r.exit_code == 2 and "not an AOTriton source tree" in r.output


def test_cpu_reference_and_compare_plumbing():
    """The comparison path on CPU with PyTorch's math backend (no GPU needed)."""
    torch = pytest.importorskip("torch")
    from codegen.models.cases import Case, Shape
    from codegen.gpu.validate.gpu import make_inputs, reference
    from codegen.gpu.validate.sdpa import _math_errors, _run_case

    case = Case.at("fp32", 32, True, Shape(1, 4, 2, 37, 53))
    inputs = make_inputs(case, "cpu", 0)
    ref = reference(*inputs, causal=case.causal)
    me = _math_errors(case, inputs, ref)
    assert all(v < 1e-4 for v in me.values())
    res, msgs = _run_case("math", case, inputs, ref, me)
    assert res["ok"], json.dumps(res, indent=1)
    # a wrong result is caught: zeros
    bad = (inputs[0], inputs[1], inputs[2] * 0, inputs[3])
    res, _ = _run_case("math", case, bad, ref, me)
    assert not res["ok"]
    assert torch.isfinite(ref[0]).all()


def test_dispatch_limits_are_skips_not_failures():
    from codegen.models.cases import Case, Shape, dispatch_limit

    sq = Shape(2, 4, 4, 211, 211)
    assert dispatch_limit("flash", Case.at("fp16", 64, True, sq)) is None
    assert "seqlen_q == seqlen_k" in dispatch_limit("flash", Case.at("fp16", 64, True, Shape(2, 4, 4, 97, 211)))
    assert dispatch_limit("efficient", Case.at("fp16", 64, True, Shape(2, 4, 4, 97, 211))) is None
    assert "fp16/bf16" in dispatch_limit("flash", Case.at("fp32", 64, False, sq))
    assert dispatch_limit("efficient", Case.at("fp32", 64, False, sq)) is None
    assert "GQA" in dispatch_limit("efficient", Case.at("fp16", 64, False, Shape(2, 8, 2, 331, 149)))


def test_report_compares_the_gpus_compute_units_with_the_spec():
    pytest.importorskip("torch")  # codegen.gpu.validate.gpu imports it
    from codegen.formats.spec import load_spec
    from codegen.gpu.validate.gpu import Platform
    from codegen.gpu.validate.run import build_report

    loaded = load_spec(None)
    cus = loaded.spec.hardware.compute_units
    mode = {"mode": "sdpa", "cases": [], "proof": {"checks": [], "kernels": {}, "aotriton": {}}, "perf": []}
    same = Platform("rocm", "MI100", "gfx908", "gfx908:sramecc+:xnack-", "2.8", "6.4", None, cus)
    assert build_report(loaded, mode, same, None)["compute_units_match_spec"] is True
    fewer = Platform("rocm", "MI100", "gfx908", "gfx908", "2.8", "6.4", None, cus - 8)
    rep = build_report(loaded, mode, fewer, None)
    assert rep["compute_units_match_spec"] is False and rep["platform"]["compute_units"] == cus - 8
    assert f"this GPU has {cus - 8} compute units, the spec's hardware {cus}" in render_markdown(rep)
    proxy = Platform("cuda", "H100", "sm_90", "sm_90", "2.8", None, "12.8", 132)
    assert build_report(loaded, mode, proxy, None)["compute_units_match_spec"] is None


@pytest.mark.aotriton
@pytest.mark.parametrize("tag, folder", [("0.11.2b", "tritonsrc"), ("0.12.1b", "tritonsrc"),
                                         ("0.13b", "modules/flash/kernel"),
                                         ("0.14.0-dev", "modules/flash/kernel")])
def test_kernel_folder_comes_from_the_adapter(pristine_tree, tag, folder):
    """tune and validate --kernels import the release's own kernel folder (0.13b: modules/flash/kernel);
    tune accepts every release's tree (its launchers pass arguments by name)."""
    from codegen.gpu.tune.run import _check_tree

    tree = pristine_tree(tag)
    assert tree_source_dir(tree) == tree / folder
    _check_tree(tree)  # accepted: flash.py is there
