"""Two more fixes of the gfx9 layer (codegen.emulate.gfx9: `permute`, `mix`), found by executing the
built library's kernels (issue 35 item 1: Triton 3.5.1 builds them; the layer's other tests compile
with this venv's Triton, whose code avoids both): each instruction under AMD's documented
semantics, right with the fix and wrong without it (`Machine(without=(fix,))`), and the kernel that
showed it."""

from __future__ import annotations

import numpy as np
import pytest

from emu_kernels import asm_kernel, ld, open_machine, run_asm, st

pytestmark = pytest.mark.triton
LANE = np.arange(64)


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    made: dict[tuple, tuple] = {}

    def get(without: tuple = ()):
        if without not in made:
            made[without] = open_machine(tmp_path_factory.mktemp("arena"), "gfx908", without=without)
        return made[without][1]

    yield get
    for arena, m in made.values():
        m.close()
        arena.close()


# ds_bpermute_b32: lane i reads lane ((addr + offset) / 4) % 64; the bits of the address above 7 are
# ignored. Triton 3.5.1's cross-wave reductions pass thread id * 4 ^ 128 (up to 1020 in a 4-wave
# workgroup): here lane*4 + 256 ^ 128, and an offset of 8 bytes (two lanes on).
BPERMUTE = ld(0, 0) + """
  v_add_u32 v1, 0x100, v250
  v_xor_b32 v1, 0x80, v1
  ds_bpermute_b32 v2, v1, v0
  ds_bpermute_b32 v3, v1, v0 offset:8
  s_waitcnt lgkmcnt(0)
""" + st(2, 0) + "\n" + st(3, 1)


def test_bpermute_takes_the_lane_from_address_bits_7_to_2(machines):
    x = (LANE + 100).astype(np.float32)
    want = [x[LANE ^ 32], x[((LANE ^ 32) + 2) % 64]]
    got = run_asm(machines(), asm_kernel(BPERMUTE), [x], 2).view(np.float32)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    bad = run_asm(machines(("permute",)), asm_kernel(BPERMUTE), [x], 2).view(np.float32)
    assert not np.array_equal(bad[0], want[0])


def test_bpermute_gives_0_from_a_lane_exec_leaves_out(machines):
    body = ld(0, 0) + """
  v_xor_b32 v1, 0x80, v250
  v_mov_b32 v2, -1
  s_mov_b64 exec, 0xffffffff
  ds_bpermute_b32 v2, v1, v0
  s_waitcnt lgkmcnt(0)
  s_mov_b64 exec, -1
""" + st(2, 0)
    x = (LANE + 1).astype(np.uint32)
    got = run_asm(machines(), asm_kernel(body), [x], 1)[0]
    # lanes 0-31 read lanes 32-63, which EXEC leaves out: 0; lanes 32-63 are not written
    assert np.array_equal(got, np.where(LANE < 32, 0, 0xFFFFFFFF))


def test_a_2_wave_block_sum_as_triton_3_5_1_builds_it(machines):
    """The reduction that showed it, in the shape Triton 3.5.1 emits for tl.sum over 128 values with
    2 warps: bpermute by workgroup-wide byte offsets, swizzles, then the two waves meet in LDS."""
    body = """
  v_lshlrev_b32 v1, 2, v0
  global_load_dword v2, v1, s[8:9]
  v_xor_b32 v1, 0x80, v1
  s_waitcnt vmcnt(0)
  ds_bpermute_b32 v1, v1, v2
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v2, v1
  ds_swizzle_b32 v2, v1 offset:swizzle(SWAP,16)
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v1, v2
  ds_swizzle_b32 v2, v1 offset:swizzle(SWAP,8)
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v1, v2
  ds_swizzle_b32 v2, v1 offset:swizzle(SWAP,4)
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v1, v2
  ds_swizzle_b32 v2, v1 offset:swizzle(SWAP,2)
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v1, v2
  ds_swizzle_b32 v2, v1 offset:swizzle(SWAP,1)
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v1, v2
  v_lshrrev_b32 v2, 4, v0
  ds_write_b32 v2, v1
  s_waitcnt lgkmcnt(0)
  s_barrier
  v_mov_b32 v3, 0
  ds_read_b32 v1, v3
  ds_read_b32 v2, v3 offset:4
  s_waitcnt lgkmcnt(0)
  v_add_f32 v1, v1, v2
  v_lshlrev_b32 v4, 2, v0
  global_store_dword v4, v1, s[10:11]
  s_waitcnt vmcnt(0)
"""
    x = np.arange(128, dtype=np.float32)
    co = asm_kernel(body, lds=64)
    for without, ok in (((), True), (("permute",), False)):
        m = machines(without)
        from codegen.models.emulate import Launch
        from emu_kernels import put

        src, out = put(m.arena, x), m.arena.alloc(512)
        m.execute(co, Launch(kernel="k", grid=(1, 1, 1), block=(128, 1, 1),
                             kernarg=src.to_bytes(8, "little") + out.to_bytes(8, "little")), budget=10_000)
        got = np.frombuffer(m.arena.read(out, 512), np.float32)
        assert bool(got[0] == x.sum()) == ok, (without, got[:2])


# v_fma_mixlo_f16 / v_fma_mixhi_f16 / v_fma_mix_f32: an inline float constant is f32 where the
# operand's op_sel_hi bit is clear (the operand is f32) and f16 where it is set. Triton converts
# f32 to f16 with `v_fma_mixlo_f16 vD, vS, 1.0, 0`.
F32 = np.linspace(-3, 3, 64).astype(np.float32)


@pytest.mark.parametrize("insn, keep, half", [("v_fma_mixlo_f16 v1, v0, 1.0, 0", 0xDEAD0000, 0),
                                              ("v_fma_mixhi_f16 v1, v0, 1.0, 0", 0x0000BEEF, 16)])
def test_mix_reads_an_f32_operand_s_constant_as_f32(machines, insn, keep, half):
    body = ld(0, 0) + f"\n  v_mov_b32 v1, {keep:#x}\n  {insn}\n" + st(1, 0)
    want = F32.astype(np.float16).view(np.uint16).astype(np.uint32) << half | keep
    got = run_asm(machines(), asm_kernel(body), [F32], 1)[0]
    assert np.array_equal(got, want), [hex(v) for v in got[:3]]
    bad = run_asm(machines(("mix",)), asm_kernel(body), [F32], 1)[0]
    assert not np.array_equal(bad, want)


def test_mix_f32_takes_f16_constants_and_modifiers(machines):
    """op_sel_hi set: the constant (and the operand) are f16; neg negates, neg_hi takes |x| of the
    half selected (op_sel: the high half)."""
    h = np.float16(-1.5).view(np.uint16).astype(np.uint32)
    x = np.full(64, (h << 16) | np.float16(2.25).view(np.uint16), np.uint32)
    body = ld(0, 0) + """
  v_fma_mix_f32 v1, v0, 1.0, v0 op_sel_hi:[1,1,1]
  v_fma_mix_f32 v2, |v0|, 2.0, 0 op_sel:[1,0,0] op_sel_hi:[1,1,0]
  v_fma_mix_f32 v3, v0, v0, 1.0 op_sel_hi:[1,1,0]
  v_mov_b32 v4, 1.0
  v_fma_mix_f32 v5, -v0, v0, -v4 op_sel_hi:[1,1,0]
""" + st(1, 0) + "\n" + st(2, 1) + "\n" + st(3, 2) + "\n" + st(5, 3)
    got = run_asm(machines(), asm_kernel(body), [x], 4).view(np.float32)
    assert got[0][0] == 2.25 * 1.0 + 2.25                # f16 operands, the f16 constant 1.0
    assert got[1][0] == 1.5 * 2.0                        # |high half| * 2.0 + 0
    assert got[2][0] == 2.25 * 2.25 + 1.0                # an f32 operand's constant is f32
    assert got[3][0] == -(2.25 * 2.25) - 1.0             # neg of an f16 half and of an f32
    bad = run_asm(machines(("mix",)), asm_kernel(body), [x], 4).view(np.float32)
    assert bad[2][0] != 2.25 * 2.25 + 1.0
