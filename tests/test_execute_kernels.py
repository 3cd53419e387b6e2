"""CI's executed case (issue 35 item 6): one small forward and backward of AOTriton's own gfx908
kernels, executed on the emulated gfx908 and compared with fp64, in the default run. CI cannot build
the library, so the library's dispatch is not in it (tests/test_execute_real.py runs that, slow):
the two kernels the smoke library dispatches for an fp16 head-dim-64 call without causal, bias or
dropout on this shape (its attn_fwd with BLOCK 64x32 and 4 warps, its fused backward with BLOCK
32x16 and 2 warps: `bundle check` names them) are taken from the kernel list the 0.11b tree's own
generator makes for the smoke spec, compiled from the tree's source with this venv's Triton for
gfx908 as the tree's compile.py compiles them, and launched with the library's argument layout:
the kernel's non-constant parameters in order, typed by the AOT signature, at the offsets the
code object's metadata gives (codegen.emulate.aotriton), valued by name by the table tune and
validate launch the tree's kernels with (codegen.upstream.kernel_args), the grid too."""

from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

from codegen.models.cases import Shape

pytestmark = [pytest.mark.aotriton, pytest.mark.triton,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton in this (test) venv")]

SHAPE = Shape(1, 2, 1, 67, 45)
HD, DTYPE = 64, "fp16"
PICKS = {"attn_fwd": ("＊fp16@16_F_F_0_0__P__0_2_64_32_False__CO__wave1_warp4_stg1", 64, 32),
         "bwd_kernel_fuse": ("＊fp16@16_0_F_F_0__P__32_16__CO__wave1_warp2_stg1", 32, 16)}


class Tensor:
    """What codegen.upstream.kernel_args reads of a tensor: its strides and shape; its address."""

    def __init__(self, addr: int, shape: tuple, dtype: str):
        self.addr, self.shape, self.dtype = addr, tuple(shape), dtype
        self._strides = tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape))) if addr else (0,) * len(shape)

    def stride(self):
        return self._strides


@pytest.fixture(scope="module")
def kernels(tmp_path_factory, pristine_tree):
    """family -> (codegen.emulate.aotriton.Kernel, the tree's JITFunction)."""
    import shutil

    from codegen.apply.engine import apply_overlay
    from codegen.emulate.aotriton import compile_entry
    from codegen.formats.spec import load_spec
    from codegen.plan.kernel_list import generate_kernel_list
    from codegen.upstream import kernel_source_dir
    from codegen.upstream.kernel_args import load_kernels
    from conftest import REPO

    tree = tmp_path_factory.mktemp("tree") / "t"
    shutil.copytree(pristine_tree("0.11b"), tree, symlinks=True)
    loaded = load_spec(REPO / "rules" / "examples" / "smoke.yaml")
    apply_overlay(tree, loaded)
    entries = generate_kernel_list(tree, list(loaded.spec.gpus), sys.executable, arch=loaded.spec.arch)
    fns = load_kernels(kernel_source_dir(tree))
    out = {}
    for family, (tag, _bm, _bn) in PICKS.items():
        e = next((e for e in entries if e.kernel_name == family and tag in e.id), None)
        assert e is not None, f"the smoke kernel list has no {family} {tag}"
        out[family] = (compile_entry(tree, e), fns[family])
    return out


def test_aotriton_forward_and_backward_execute_and_match_fp64(kernels, tmp_path):
    from codegen.emulate.arena import Arena
    from codegen.emulate.machine import Machine
    from codegen.emulate.source import EmulatorMissing
    from codegen.models.emulate import Launch
    from codegen.ship import reference as ref
    from codegen.upstream.kernel_args import bind, param_values

    B, Hq, Hk, Sq, Sk = SHAPE.batch, SHAPE.heads_q, SHAPE.heads_k, SHAPE.seqlen_q, SHAPE.seqlen_k
    rng = np.random.default_rng(35)
    inputs = {n: ref.rounded(rng.standard_normal(s), DTYPE) for n, s in
              (("q", (B, Hq, Sq, HD)), ("k", (B, Hk, Sk, HD)), ("v", (B, Hk, Sk, HD)), ("do", (B, Hq, Sq, HD)))}
    arena = Arena.create(tmp_path / "arena", 64 << 20)
    try:
        machine = Machine("gfx908", arena)
    except EmulatorMissing as exc:
        arena.close()
        pytest.skip(f"emulator: {exc}")
    t = {}
    for n, shape, dt in (("q", (B, Hq, Sq, HD), DTYPE), ("k", (B, Hk, Sk, HD), DTYPE), ("v", (B, Hk, Sk, HD), DTYPE),
                         ("do", (B, Hq, Sq, HD), DTYPE), ("o", (B, Hq, Sq, HD), DTYPE), ("dq", (B, Hq, Sq, HD), DTYPE),
                         ("dk", (B, Hk, Sk, HD), DTYPE), ("dv", (B, Hk, Sk, HD), DTYPE),
                         ("L", (B * Hq, Sq), "fp32"), ("delta", (B * Hq, Sq), "fp32")):
        t[n] = Tensor(arena.alloc(int(np.prod(shape)) * ref.ITEMSIZE[dt]), shape, dt)
        if n in inputs:
            arena.write(t[n].addr, ref.to_bytes(inputs[n], dt))
    for n, shape in (("b", (0, 0, 0, 0)), ("db", (0, 0, 0, 0)), ("alibi", (0, 0)), ("i32null", (0,)),
                     ("u64null", (0,)), ("counter", (0,))):
        t[n] = Tensor(0, shape, "fp32")
    scale = float(np.float32(1.0) / np.sqrt(np.float32(HD)))
    with machine:
        for family in ("attn_fwd", "bwd_kernel_fuse"):
            kernel, fn = kernels[family]
            _tag, bm, bn = PICKS[family]
            vals, grid = param_values(family, t, {"head_dim": HD, "block_m": bm, "block_n": bn, "pre_load_v": False},
                                      False, (B, Hq, Hk, Sq, Sk), 120, sm_scale=scale)
            bound = bind(fn, vals)       # by the kernel's own parameter names, as the library passes them
            runtime = {n: (v.addr if isinstance(v, Tensor) else v) for n, v in bound.items()
                       if n in {a for a, _ in kernel.args}}
            ex = machine.execute(kernel.code_object, Launch(
                kernel=kernel.name, grid=grid, block=(64 * kernel.entry.config.num_warps, 1, 1),
                dynamic_lds=kernel.shared, kernarg=kernel.pack(runtime)))
            print(f"\n{family}: {ex.instructions:,} instructions, {ex.waves} waves, {ex.seconds:.1f} s")

    def read(n):
        x = t[n]
        return ref.from_bytes(arena.read(x.addr, int(np.prod(x.shape)) * ref.ITEMSIZE[x.dtype]), x.dtype,
                              int(np.prod(x.shape))).reshape(x.shape)

    want = ref.attention(inputs["q"], inputs["k"], inputs["v"], inputs["do"], scale=scale, causal=False)
    errors = {}
    for n, r in (("o", want.out), ("L", want.lse), ("dq", want.dq), ("dk", want.dk), ("dv", want.dv)):
        name = {"o": "out", "L": "lse"}.get(n, n)
        errors[name] = (ref.max_error(read(n), r), ref.tolerance(name, DTYPE, r))
    arena.close()
    print(errors)
    assert all(e <= tol for e, tol in errors.values()), errors
