"""tune's launchers against every release's real kernels, on the CPU: the tree's kernels are
imported the way tune imports them (`TreeKernels`, i.e. `codegen.upstream.kernel_args`), each
launcher builds its launch without running it, and the bound arguments are checked against the
kernel's own parameter list: every required parameter supplied, no unknown name, constexprs
given compile-time values (the config's tiles among them), tensors where the kernel takes
pointers. The GPU run of the same launchers is tests/test_tune_gpu.py."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from codegen.core.errors import UpstreamError
from codegen.upstream import SUPPORTED_RELEASES, kernel_source_dir
from codegen.upstream.kernel_args import AUX_MODULES, FAMILY_MODULES, bind, block_dmodel

FAMILIES = tuple(FAMILY_MODULES) + tuple(AUX_MODULES)
MODULES = {**FAMILY_MODULES, **AUX_MODULES}


def _source_params(src: Path, family: str) -> tuple[list[str], list[str], set[str]]:
    """(all, required, constexpr) parameter names of the kernel, read from its source with ast
    (independent of Triton's own parsing, which the launchers use)."""
    mod, fn = MODULES[family]
    for node in ast.parse((src / f"{mod}.py").read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            args = [a.arg for a in node.args.args]
            n_def = len(node.args.defaults)
            const = {a.arg for a in node.args.args
                     if a.annotation is not None and ast.unparse(a.annotation).endswith("constexpr")}
            return args, args[: len(args) - n_def], const
    raise AssertionError(f"{fn} not in {src / mod}.py")


def _launches(tk, causal: bool, head_dim: int, dropout: bool = False, bias: bool = False):
    """family -> (Launch, the tensors it must write or read by name, expected tiles)."""
    import torch

    from codegen.gpu.tune.kernels import make_problem

    p = make_problem("fp16", 2, 4, 192, 160, head_dim, causal, 3, device="cpu",
                     dropout_p=0.5 if dropout else 0.0, bias=bias)
    p.k, p.v = p.k[:, :2].contiguous(), p.v[:, :2].contiguous()  # GQA: 4 query heads, 2 kv heads
    fwd, o, L = tk.fwd_launcher(p, 64, 32, True, tk.opts(4, 1, 2))
    delta = torch.empty_like(L)
    pre = tk.preprocess_launcher(o, p.do, delta)
    dkdv, kv = tk.dkdv_launcher(p, L, delta, 32, 16, tk.opts(2, 1, 1))
    dq, q = tk.dq_launcher(p, L, delta, 16, 32, tk.opts(4, 2, 1))
    fuse, f = tk.fuse_launcher(p, o, L, 16, 16, tk.opts(4, 1, 0))
    mask = torch.zeros((1, 3, 192, 160))
    keep = tk._launch("dropout_mask", tk._buffers(p, mask=mask), p, tk._shape(p), 32, 32, False, {})
    db = {"B": p.bias} if bias else {}
    return p, {
        "attn_fwd": (fwd, {"Q": p.q, "K": p.k, "V": p.v, "Out": o, "L": L, **db}, (64, 32)),
        "bwd_preprocess": (pre, {"Out": o, "DO": p.do, "Delta": delta}, (64, None)),
        "bwd_kernel_dk_dv": (dkdv, {"Q": p.q, "DO": p.do, "DK": kv["dk"], "DV": kv["dv"], "L": L, "D": delta, **db},
                             (32, 16)),
        "bwd_kernel_dq": (dq, {"Q": p.q, "DO": p.do, "DQ": q["dq"], "L": L, "D": delta, **db,
                               **({"DB": q["db"]} if bias else {})}, (16, 32)),
        "bwd_kernel_fuse": (fuse, {"Out": o, "DO": p.do, "DK": f["dk"], "DV": f["dv"], "DQ": f["dq"], "L": L, **db,
                                   **({"DB": f["db"]} if bias else {})}, (16, 16)),
        "dropout_mask": (keep, {"R": mask}, (32, 32)),
    }


@pytest.fixture(scope="module")
def cpu_stack():
    pytest.importorskip("torch")
    pytest.importorskip("triton")


@pytest.mark.aotriton
@pytest.mark.parametrize("tag", SUPPORTED_RELEASES)
def test_launchers_bind_every_kernel_parameter_by_name(cpu_stack, pristine_tree, tag):
    import torch

    from codegen.gpu.tune.kernels import TreeKernels

    tree = pristine_tree(tag)
    src = kernel_source_dir(tree)
    tk = TreeKernels(tree)
    assert set(tk.kernels) == set(FAMILIES)
    for causal, head_dim, dropout, bias in ((False, 64, False, False), (True, 64, False, False),
                                            (False, 48, False, False), (True, 48, True, False),
                                            (False, 64, True, True)):
        # 48: BLOCK_DMODEL 48, not padded; both of the kernels' head-dim forms
        p, launches = _launches(tk, causal, head_dim, dropout, bias)
        for family, (launch, tensors, (bm, bn)) in launches.items():
            what = f"{tag} {family} causal={causal} d{head_dim} dropout={dropout} bias={bias}"
            # the tree's own kernel, imported from its own kernel folder (not a cached other tree's)
            fn = launch.kernel.fn
            assert Path(inspect.getsourcefile(fn)).resolve().parent == src.resolve(), what
            names, required, const = _source_params(src, family)
            assert launch.kernel.arg_names == names, what
            assert not set(launch.args) - set(names), f"{what}: unknown {set(launch.args) - set(names)}"
            assert not set(required) - set(launch.args), f"{what}: missing {set(required) - set(launch.args)}"
            inspect.signature(fn).bind(**launch.args)  # and Python agrees
            for n, val in launch.args.items():
                if n in const:
                    assert val is None or isinstance(val, (bool, int, float)), f"{what}: constexpr {n}={val!r}"
            for n, t in tensors.items():
                assert launch.args[n] is t, f"{what}: {n}"
            assert launch.args["BLOCK_M"] == bm and (bn is None or launch.args["BLOCK_N"] == bn), what
            if "dropout_p" in launch.args:  # the same Philox stream in every kernel and in the mask
                assert launch.args["dropout_p"] == (0.5 if dropout else 0.0), what
                seed = launch.args["philox_seed_ptr"]
                assert (seed is p.philox_seed) if dropout else seed.numel() == 0, what
                assert (launch.args["philox_offset1"] is p.philox_offset) if dropout else True, what
                assert launch.args["philox_offset2"] == (p.philox_offset2 if dropout else 0), what
            if family == "dropout_mask":
                assert launch.grid == (6, 3, 1) and launch.args["Num_head_q"] == 4, what
                continue
            bd = block_dmodel(head_dim)
            dmodel = "D_HEAD" if family == "bwd_preprocess" else "BLOCK_DMODEL"
            assert launch.args[dmodel] == bd and launch.args["PADDED_HEAD"] == (bd != head_dim), what
            if family != "bwd_preprocess":
                assert launch.args["CAUSAL_TYPE"] == (3 if causal else 0), what
                assert launch.args.get("sm_scale", launch.args.get("Sm_scale")) == p.sm_scale, what
                assert launch.args["ENABLE_DROPOUT"] is dropout and launch.args["BIAS_TYPE"] == int(bias), what
            if "DB" in tensors:  # the bias gradient is written (all-zero strides would skip it)
                assert launch.args["stride_dbm"] == tensors["DB"].stride(2), what
            if family == "attn_fwd":
                assert launch.args["PRE_LOAD_V"] is True
                assert launch.args["PERSISTENT_TYPE"] == (2 if causal else 0)
                assert bool(launch.reset) == causal  # the persistent grid's counter is zeroed per launch
            for n in ("seq_strides_q", "seq_strides_k"):  # 0.12b+: empty (no padded varlen)
                if n in launch.args:
                    assert isinstance(launch.args[n], torch.Tensor) and launch.args[n].numel() == 0
            if "NUM_XCDS" in launch.args:  # 0.12b+: 1 keeps the grid's order
                assert launch.args["NUM_XCDS"] == 1
            assert all(isinstance(g, int) and g > 0 for g in launch.grid), what
        assert launches["attn_fwd"][0].opts == tk.opts(4, 1, 2)
        assert launches["bwd_preprocess"][0].opts == {}


def test_bind_refuses_a_kernel_with_parameters_it_does_not_know():
    def kernel(Q, K, New_thing, BLOCK_M=16):  # a plain function stands in for a JITFunction
        pass

    assert bind(kernel, {"Q": 1, "K": 2, "New_thing": 3, "Other": 4}) == {"Q": 1, "K": 2, "New_thing": 3}
    with pytest.raises(UpstreamError, match="kernel of this tree takes parameters the launcher does not know: New_thing"):
        bind(kernel, {"Q": 1, "K": 2})


@pytest.mark.aotriton
def test_the_gpu_tests_cover_the_012_kernels_through_013b(pristine_tree):
    """tests/test_tune_gpu.py runs 0.12b and 0.13b, not 0.12.1b: the three releases' kernel
    files (every module of 0.13b's kernel folder) are byte-identical."""
    ref = kernel_source_dir(pristine_tree("0.13b"))
    files = sorted(f.name for f in ref.glob("*.py"))
    assert {f"{m}.py" for m, _ in MODULES.values()} <= set(files)
    for tag in ("0.12b", "0.12.1b"):
        src = kernel_source_dir(pristine_tree(tag))
        assert [n for n in files if (src / n).read_bytes() != (ref / n).read_bytes()] == [], tag


@pytest.mark.aotriton
def test_the_warm_up_compiles_what_the_run_launches(cpu_stack, pristine_tree):
    """The compile warm-up builds each entry's problem on the meta device (no memory): every
    argument Triton keys its cache by (ints, constexprs, dtypes, strides) must equal the real
    problem's, or the measuring workers would compile everything again."""
    import torch

    from codegen.formats.spec import load_spec
    from codegen.gpu.tune.grid import GridEntry
    from codegen.gpu.tune.kernels import TreeKernels
    from codegen.gpu.tune.runner import Settings, candidate_launch
    from codegen.models import expand_family

    tk = TreeKernels(pristine_tree("0.11.2b"))
    tk._num_cu.update({torch.device("meta"): 8, torch.device("cpu"): 8})  # no GPU to ask here
    s = Settings(batch=2, heads=4)
    sp = load_spec(None).spec
    for family in ("attn_fwd", "bwd_kernel_dq", "bwd_kernel_fuse"):
        e = GridEntry(family, sp.arch, "fp16", 64, True, True, True, 256, 128)
        cfg = expand_family(sp, family, "fp16", 64)[0]
        meta, real = (candidate_launch(tk, e, cfg, s, dev) for dev in ("meta", "cpu"))
        assert meta.grid == real.grid and meta.opts == real.opts and set(meta.args) == set(real.args)
        for n, v in real.args.items():
            w = meta.args[n]
            if isinstance(v, torch.Tensor):
                assert w.device.type == "meta" and (w.dtype, w.shape, w.stride()) == (v.dtype, v.shape, v.stride()), n
            else:
                assert w == v, f"{family}: {n}: {w!r} != {v!r}"
