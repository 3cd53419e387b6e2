"""gfx906 (GFX9 without MFMA, Triton 3.8 compiles it) on the same emulator and layer (issue 35
item 5): the closed-form kernels of the gfx908 tests (a vector add, 1- and 4-warp reductions,
tl.dot in fp16 through v_dot2_f32_f16 and in bf16/fp32 through FMAs) are exact; AOTriton 0.11b's
d64 forward and backward (the gfx908 plan's kernels compiled for gfx906: no gfx906 plan is built
here) match fp64 (slow: they spill through the private segment buffer, 10^5 instructions each)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from codegen.models.emulate import Launch

from emu_kernels import compile_kernel, kernarg, open_machine, put

pytestmark = pytest.mark.triton
ARCH = "gfx906"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    arena, m = open_machine(tmp_path_factory.mktemp("arena"), ARCH, size=256 << 20)
    with arena, m:
        yield m


@pytest.mark.parametrize("warps", [pytest.param(1, marks=pytest.mark.slow), 4])
def test_reductions_are_exact(machine, warps):
    n = 64 * warps
    co, name, lds = compile_kernel("block_sum", ARCH, (("x", "*fp32"), ("out", "*fp32"), ("BLOCK", "constexpr")),
                                   (("BLOCK", n),), num_warps=warps)
    x = np.arange(n, dtype=np.float32)
    px, po = put(machine.arena, x), machine.arena.alloc(4)
    machine.execute(co, Launch(kernel=name, grid=(1, 1, 1), block=(n, 1, 1), dynamic_lds=lds,
                               kernarg=kernarg(co, name, px, po)))
    assert np.frombuffer(machine.arena.read(po, 4), np.float32)[0] == x.sum()


@pytest.mark.parametrize("dt,op", [("fp16", "v_dot2_f32_f16"), pytest.param("bf16", "v_fmac_f32_e32", marks=pytest.mark.slow),
                                   pytest.param("fp32", "v_fmac_f32_e32", marks=pytest.mark.slow)])
def test_tl_dot_is_exact(machine, dt, op):
    co, name, lds = compile_kernel("dot", ARCH, (("a", f"*{dt}"), ("b", f"*{dt}"), ("c", "*fp32"), ("M", "constexpr"),
                                                 ("N", "constexpr"), ("K", "constexpr")),
                                   (("M", 32), ("N", 32), ("K", 32)), num_warps=1)
    rng = np.random.default_rng(3)
    a, b = rng.integers(-3, 4, (32, 32)).astype(np.float32), rng.integers(-3, 4, (32, 32)).astype(np.float32)
    words = {"fp16": lambda x: x.astype(np.float16), "fp32": lambda x: x,
             "bf16": lambda x: (x.view(np.uint32) >> 16).astype(np.uint16)}[dt]
    pa, pb, pc = put(machine.arena, words(a)), put(machine.arena, words(b)), machine.arena.alloc(4096)
    ex = machine.execute(co, Launch(kernel=name, grid=(1, 1, 1), block=(64, 1, 1), dynamic_lds=lds,
                                    kernarg=kernarg(co, name, pa, pb, pc)))
    assert ex.opcodes.get(op, 0) > 0
    assert np.array_equal(np.frombuffer(machine.arena.read(pc, 4096), np.float32).reshape(32, 32), a @ b)


@pytest.mark.slow
@pytest.mark.aotriton
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_attention_forward_and_backward(pristine_tree, tmp_path, machine, dtype):
    from emu_attention import Problem, Session, compile_in, find, plan

    tree = tmp_path / "0.11b"
    shutil.copytree(pristine_tree("0.11b"), tree, symlinks=True)
    entries = plan(tree)
    c = {"CAUSAL_TYPE": 0, "BIAS_TYPE": 0, "ENABLE_DROPOUT": False, "PADDED_HEAD": False}
    p = Problem(dtype, 64)
    ref, s = p.reference(), Session(machine, p, budget=50_000_000)
    tol = {"fp16": 2e-3, "bf16": 1.6e-2}[dtype]
    steps = (("attn_fwd", c, s.forward, ("out", "lse")), ("bwd_preprocess", {"PADDED_HEAD": False}, s.preprocess, ("delta",)),
             ("bwd_kernel_dk_dv", c, s.dk_dv, ("dk", "dv")), ("bwd_kernel_dq", c, s.dq, ("dq",)))
    for family, consts, launch, outputs in steps:
        e = find(tree, entries, family, dtype, 64, **consts)
        launch(compile_in(tree, e.model_copy(update={"config": e.config.vary(arch=ARCH)})))
        for name in outputs:
            got, want = s.read(name), ref[name]
            assert np.abs(got - want).max() <= tol * max(1.0, np.abs(want).max()), (family, name)
