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
