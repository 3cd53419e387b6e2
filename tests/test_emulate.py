"""codegen.emulate: the Machine runs gfx9 code objects compiled by pip Triton on the pinned
emulator, in a child process, over a bounded arena. Needs clang and the emulator
(../shared/emulators/ or TINYGRAD_SRC/TINYGRAD_GIT/TINYGRAD_ARCHIVE): skips with the reason
otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.models.emulate import Launch

from emu_kernels import compile_kernel, kernarg, open_machine, put

pytestmark = pytest.mark.triton
ARCH = "gfx908"


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """One Machine (one child, its compiled instructions kept) for the module's tests."""
    arena, m = open_machine(tmp_path_factory.mktemp("arena"), ARCH)
    with arena, m:
        yield m


def test_vector_add_is_exact(machine):
    co, name, lds = compile_kernel("vector_add", ARCH, (("x", "*fp32"), ("y", "*fp32"), ("out", "*fp32"),
                                                        ("n", "i32"), ("BLOCK", "constexpr")), (("BLOCK", 256),))
    a = machine.arena
    n = 1000
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    px, py, po = put(a, x), put(a, y), a.alloc(4 * n)
    ex = machine.execute(co, Launch(kernel=name, grid=(4, 1, 1), block=(256, 1, 1), dynamic_lds=lds,
                                    kernarg=kernarg(co, name, px, py, po, n)))
    out = np.frombuffer(a.read(po, 4 * n), dtype=np.float32)
    assert np.array_equal(out, x + y)
    assert ex.waves == 16 and ex.opcodes["global_store_dword"] == 16
    assert set(ex.opcodes) <= set(machine.opcodes(co, name))


def test_philox_is_triton_s(machine):
    """tl.randint4x (Philox 4x32-10: 32-bit high/low products, xors) against an independent numpy
    Philox; AOTriton's dropout masks are drawn by it."""
    from emu_attention import philox4x32

    co, name, _ = compile_kernel("philox", ARCH, (("seed", "*u64"), ("out", "*u32"), ("BLOCK", "constexpr")),
                                 (("BLOCK", 64),), num_warps=1)
    seed, a = 0x1234_5678_9ABC_DEF0, machine.arena
    ps, po = put(a, np.array([seed], np.uint64)), a.alloc(4 * 256)
    machine.execute(co, Launch(kernel=name, grid=(1, 1, 1), block=(64, 1, 1), kernarg=kernarg(co, name, ps, po)))
    want = np.array(philox4x32(seed, np.arange(64, dtype=np.uint64) + np.uint64(1 << 32)), np.uint32)
    assert np.array_equal(np.frombuffer(a.read(po, 1024), np.uint32).reshape(4, 64), want)
