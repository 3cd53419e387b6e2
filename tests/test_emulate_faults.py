"""Memory safety of codegen.emulate (issue 35 item 3): a kernel that computes a wrong address, loops
forever, jumps out of its code, or is not code at all gets a fault report (kernel, PC, instruction,
lane, address) and exit 3; nothing is read or written outside the arena (the child keeps canary
pages on both sides of its mapping, checked after every launch; with the bounds left out the same
wild stores land on them, which shows both the bounds and the canaries work)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.core.errors import EXIT_UPSTREAM
from codegen.emulate.arena import CODE_BASE
from codegen.emulate.machine import KernelFault
from codegen.formats.elf import kernel_descriptor, loaded_image
from codegen.models.emulate import Launch

from emu_kernels import compile_kernel, kernarg, open_machine, patch_word, put

pytestmark = pytest.mark.triton
ARCH = "gfx908"
ADD = ("vector_add", ARCH, (("x", "*fp32"), ("y", "*fp32"), ("out", "*fp32"), ("n", "i32"), ("BLOCK", "constexpr")),
       (("BLOCK", 256),))
S_ENDPGM, S_BRANCH_SELF, S_BRANCH_FAR = 0xBF810000, 0xBF82FFFF, 0xBF827FFF


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    arena, m = open_machine(tmp_path_factory.mktemp("arena"), ARCH)
    with arena, m:
        yield m


def _add(machine, x, y, out, n=256, co=None):
    good = compile_kernel(*ADD)[0]
    return machine.execute(co or good, Launch(kernel="vector_add", grid=(1, 1, 1), block=(256, 1, 1),
                                              kernarg=kernarg(good, "vector_add", x, y, out, n)))


def _fault(call) -> KernelFault:
    with pytest.raises(KernelFault) as info:
        call()
    assert info.value.exit_code == EXIT_UPSTREAM
    return info.value


@pytest.mark.parametrize("where", ["past the end", "before the start", "far away"])
def test_a_wild_store_is_a_fault_and_nothing_outside_the_arena_changes(machine, where):
    a = machine.arena
    x, y = put(a, np.ones(256, np.float32)), put(a, np.ones(256, np.float32))
    out = {"past the end": a.device_base + a.size, "before the start": a.device_base - 1024,
           "far away": 0x7FFF_0000_0000}[where]
    before = a.read(a.device_base, a.size)
    err = _fault(lambda: _add(machine, x, y, out))
    f = err.fault
    assert f.reason == "out of arena" and f.instruction.startswith("global_store_dword")
    assert f.lane is not None and f.address == out + 4 * f.lane
    assert f.kernel == "vector_add" and f.pc > 0
    assert f"vector_add at pc {f.pc:#x}" in str(err) and f"lane {f.lane}" in str(err)
    assert a.read(a.device_base, a.size)[len(before) - a.size + (1 << 17):] == before[1 << 17:]


def test_a_wild_load_and_a_wild_scalar_load_are_faults(machine):
    a = machine.arena
    y, out = put(a, np.ones(256, np.float32)), a.alloc(1024)
    f = _fault(lambda: _add(machine, a.device_base + a.size + 4096, y, out)).fault
    assert f.reason == "out of arena" and f.instruction.startswith("global_load_dword")
    co, name, _ = compile_kernel("scalar_copy", ARCH, (("x", "*fp32"), ("out", "*fp32")))
    wild = a.device_base - 64
    f = _fault(lambda: machine.execute(co, Launch(kernel=name, grid=(1, 1, 1), block=(64, 1, 1),
                                                  kernarg=kernarg(co, name, wild, out)))).fault
    assert f.reason == "out of arena" and f.instruction.startswith("s_load_dword")
    assert f.lane is None and f.address == wild


def test_an_lds_access_past_the_launch_s_lds_is_a_fault(machine):
    a = machine.arena
    co, name, lds = compile_kernel("block_sum", ARCH, (("x", "*fp32"), ("out", "*fp32"), ("BLOCK", "constexpr")),
                                   (("BLOCK", 256),))
    x, out = put(a, np.arange(256, dtype=np.float32)), a.alloc(4)
    launch = dict(kernel=name, grid=(1, 1, 1), block=(256, 1, 1), kernarg=kernarg(co, name, x, out))
    machine.execute(co, Launch(**launch, dynamic_lds=lds))
    assert np.frombuffer(a.read(out, 4), np.float32)[0] == 256 * 255 / 2
    f = _fault(lambda: machine.execute(co, Launch(**launch, dynamic_lds=0))).fault
    assert f.reason == "out of LDS" and f.instruction.startswith("ds_")


def test_an_infinite_loop_is_cut_at_the_budget(machine):
    a = machine.arena
    co = patch_word(compile_kernel(*ADD)[0], S_ENDPGM, S_BRANCH_SELF)
    x, out = put(a, np.ones(256, np.float32)), a.alloc(1024)
    with pytest.raises(KernelFault) as info:
        machine.execute(co, Launch(kernel="vector_add", grid=(1, 1, 1), block=(64, 1, 1),
                                   kernarg=kernarg(co, "vector_add", x, x, out, 64)), budget=5000)
    f = info.value.fault
    assert f.reason == "instruction budget (5000) spent" and f.instruction.startswith("s_branch")


def test_a_jump_out_of_the_code_an_unknown_word_and_a_truncated_code_object_are_faults(machine):
    a = machine.arena
    co = compile_kernel(*ADD)[0]
    x, out = put(a, np.ones(256, np.float32)), a.alloc(1024)
    f = _fault(lambda: _add(machine, x, x, out, co=patch_word(co, S_ENDPGM, S_BRANCH_FAR))).fault
    assert f.reason == "jump outside the kernel's code" and f.instruction.startswith("s_branch")
    entry = kernel_descriptor(co, loaded_image(co), "vector_add").entry
    assert f.address == CODE_BASE + entry + f.pc + 4 + 4 * 0x7FFF   # the branch's target
    f = _fault(lambda: _add(machine, x, x, out, co=patch_word(co, S_ENDPGM, 0xFFFFFFFF))).fault
    assert f.reason.startswith("unknown instruction") and "0xffffffff" in f.instruction
    f = _fault(lambda: _add(machine, x, x, out, co=co[:len(co) // 2])).fault
    assert f.reason.startswith("code object: truncated or corrupt") and f.pc == -1


@pytest.mark.slow
def test_without_the_bounds_the_canaries_catch_the_wild_stores_and_a_crash_is_a_report(tmp_path):
    """The planted fault for the bounds themselves: the same wild stores, unchecked, land on the
    canaries next to the arena (reported); one far away kills the child, which is a report too,
    and the next launch runs in a new child."""
    arena, m = open_machine(tmp_path, ARCH, without=("guard",))
    with arena, m:
        x, y = put(arena, np.ones(256, np.float32)), put(arena, np.ones(256, np.float32))
        out = arena.alloc(1024)
        _add(m, x, y, out)
        for wild in (arena.device_base + arena.size, arena.device_base - 1024):
            f = _fault(lambda: _add(m, x, y, wild)).fault
            assert "canaries are damaged" in f.reason
        f = _fault(lambda: _add(m, x, y, 0x7FFF_0000_0000)).fault
        assert f.reason.startswith("the emulator process died (signal 11")
        _add(m, x, y, out)
        assert np.array_equal(np.frombuffer(arena.read(out, 1024), np.float32), np.full(256, 2, np.float32))


INACTIVE = """  v_mov_b32 v1, 0
  v_cmp_eq_u32 vcc, 63, v0
  v_mov_b32 v4, 0x7ffff000
  v_cndmask_b32 v1, 0, v4, vcc
  v_cmp_ne_u32 vcc, 63, v0
  s_and_saveexec_b64 s[20:21], vcc
  ds_read_b32 v2, v1
  global_load_dword v3, v1, s[8:9]
  s_waitcnt vmcnt(0) lgkmcnt(0)
  s_or_b64 exec, exec, s[20:21]
  ds_read_b32 v2, v1
  s_waitcnt lgkmcnt(0)
"""


def test_an_inactive_lane_s_address_is_no_access(machine):
    """Lane 63 holds a wild address but EXEC leaves it out: its LDS and global reads are not
    made (the emulator computes every lane's address); once active, the same read is a fault."""
    from emu_kernels import asm_kernel, run_asm

    with pytest.raises(KernelFault) as info:
        run_asm(machine, asm_kernel(INACTIVE, lds=256), [], 1)
    f = info.value.fault
    assert f.reason == "out of LDS" and f.lane == 63 and f.address == 0x7FFFF000
    assert f.pc == 68 and f.instruction.startswith("ds_read_b32")   # the second one
