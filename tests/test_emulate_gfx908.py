"""The gfx908 layer over the emulator (codegen.emulate.gfx9), one fix at a time (issue 35 item 2):
each test runs a kernel whose answer is known independently (a Triton kernel with a closed-form
result, or one instruction under AMD's documented semantics) with the fix (the default set) and,
in the `slow` set, again without it (`Machine(without=(fix,))`), where it must fail: the fix is
what makes it right."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.emulate.machine import KernelFault
from codegen.models.emulate import Launch

from emu_kernels import asm_kernel, compile_kernel, kernarg, ld, open_machine, put, run_asm, st

pytestmark = pytest.mark.triton
ARCH = "gfx908"


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    """machines(without) -> a started Machine with those parts of the layer left out (one each)."""
    made: dict[tuple, tuple] = {}

    def get(without: tuple = ()):
        if without not in made:
            made[without] = open_machine(tmp_path_factory.mktemp("arena"), ARCH, without=without)
        return made[without][1]

    yield get
    for arena, m in made.values():
        m.close()
        arena.close()


# each test runs with the layer whole (default set) and, `slow`, again without its fix, which must fail
PROOF = pytest.mark.parametrize("proof", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["fixed", "without-fix"])


def _lanes(f: float | np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.asarray(f, np.float32), (64,)).copy()


# --- dpp ----------------------------------------------------------------------------------------
ROW_ROR = ld(1, 0) + "\n  v_add_f32_dpp v1, v1, v1 row_ror:8 row_mask:0xf bank_mask:0xf bound_ctrl:0\n" + st(1, 0)
ROW_SHR_MASKED = (ld(1, 0) + "\n" + ld(2, 1) + "\n  v_add_f32_dpp v2, v1, v2 row_shr:1 row_mask:0x5 bank_mask:0xe\n"
                  + st(2, 0))


@PROOF
def test_dpp_reads_every_lane_before_any_lane_writes(machines, proof):
    """v_add_f32_dpp v1, v1, v1 row_ror:8: lane l adds lane row(l) + (l - 8) mod 16 of the *old*
    v1. The emulator read lanes it had already written (the cross-wave reductions of 2- and
    4-warp kernels came out wrong)."""
    x = np.arange(64, dtype=np.float32)
    src = (np.arange(64) & ~15) + ((np.arange(64) - 8) & 15)
    want = x + x[src]
    got = run_asm(machines(), asm_kernel(ROW_ROR), [x], 1)[0].view(np.float32)
    assert np.array_equal(got, want)
    if proof:
        bad = run_asm(machines(("dpp",)), asm_kernel(ROW_ROR), [x], 1)[0].view(np.float32)
        assert not np.array_equal(bad, want)


@PROOF
def test_dpp_leaves_masked_rows_banks_and_unbound_lanes_unwritten(machines, proof):
    """row_shr:1 with row_mask 0x5, bank_mask 0xe, bound_ctrl off: only rows 0 and 2, banks 1-3,
    and lanes whose source lane is in their row are written; the others keep v2."""
    x, y = np.arange(64, dtype=np.float32), np.full(64, 1000, np.float32)
    lane = np.arange(64)
    row, bank, in_row = lane // 16, (lane % 16) // 4, lane % 16
    write = ((0x5 >> row) & 1).astype(bool) & ((0xE >> bank) & 1).astype(bool) & (in_row >= 1)
    want = np.where(write, x[np.maximum(lane - 1, 0)] + y, y)
    got = run_asm(machines(), asm_kernel(ROW_SHR_MASKED), [x, y], 1)[0].view(np.float32)
    assert np.array_equal(got, want)
    if proof:
        bad = run_asm(machines(("dpp",)), asm_kernel(ROW_SHR_MASKED), [x, y], 1)[0].view(np.float32)
        assert not np.array_equal(bad, want)


@PROOF
@pytest.mark.parametrize("warps", [2, 4])
def test_a_multi_warp_reduction_is_right(machines, proof, warps):
    """tl.sum over 64*warps values: each wave reduces with DPP, then the waves meet in LDS after a
    barrier (the issue's "2 or 4 warps wrong" came from the DPP reads above)."""
    n = 64 * warps
    co, name, lds = compile_kernel("block_sum", ARCH, (("x", "*fp32"), ("out", "*fp32"), ("BLOCK", "constexpr")),
                                   (("BLOCK", n),), num_warps=warps)
    x = np.arange(n, dtype=np.float32)

    def run(m):
        px, po = put(m.arena, x), m.arena.alloc(4)
        m.execute(co, Launch(kernel=name, grid=(1, 1, 1), block=(n, 1, 1), dynamic_lds=lds,
                             kernarg=kernarg(co, name, px, po)))
        return np.frombuffer(m.arena.read(po, 4), np.float32)[0]
    assert run(machines()) == x.sum()
    if proof:
        assert run(machines(("dpp",))) != x.sum()


# --- true16 -------------------------------------------------------------------------------------
TRUE16 = (ld(171, 0) + "\n" + ld(31, 1) + "\n  v_cvt_f16_f32_e32 v159, v171\n" + ld(200, 2) + "\n" + ld(201, 3)
          + "\n  v_add_f16_e32 v1, v200, v201\n" + st(159, 0) + "\n" + st(31, 1) + "\n" + st(1, 2))


@PROOF
def test_16_bit_operands_at_v128_and_above_are_those_registers(machines, proof):
    """v_cvt_f16_f32 v159, v171 writes v159 (RDNA3's naming would write the high half of v31) and
    v_add_f16 v1, v200, v201 reads v200 and v201, not the high halves of v72 and v73."""
    x = np.linspace(-3, 3, 64).astype(np.float32)
    keep = np.full(64, 0x12345678, np.uint32)
    a, b = _lanes(1.5), _lanes(0.25)
    a16 = a.astype(np.float16).view(np.uint16).astype(np.uint32)
    b16 = b.astype(np.float16).view(np.uint16).astype(np.uint32)
    co = asm_kernel(TRUE16)
    out = run_asm(machines(), co, [x, keep, a16, b16], 3)
    assert np.array_equal((out[0] & 0xFFFF).astype(np.uint16).view(np.float16), x.astype(np.float16))
    assert np.array_equal(out[1], keep)
    assert np.array_equal((out[2] & 0xFFFF).astype(np.uint16).view(np.float16), (a + b).astype(np.float16))
    if proof:
        bad = run_asm(machines(("true16",)), co, [x, keep, a16, b16], 3)
        assert not np.array_equal(bad[1], keep) or not np.array_equal(bad[0], out[0])


# --- pc -----------------------------------------------------------------------------------------
PC = """  s_getpc_b64 s[12:13]
  v_mov_b32 v1, s12
  v_mov_b32 v2, s13
  s_add_u32 s14, s12, 24
  s_addc_u32 s15, s13, 0
  s_swappc_b64 s[16:17], s[14:15]
  v_mov_b32 v3, 7
  v_mov_b32 v3, 9
  v_mov_b32 v4, s16
""" + st(1, 0) + "\n" + st(2, 1) + "\n" + st(3, 2) + "\n" + st(4, 3)


@PROOF
def test_pc_reads_and_writes(machines, proof):
    """s_getpc_b64 gives the next instruction's address; s_swappc_b64 jumps and saves its own next
    address: here over `v_mov_b32 v3, 7` (the emulator stopped on "unknown variable: PC")."""
    from codegen.emulate.arena import CODE_BASE
    from codegen.formats.elf import kernel_descriptor, loaded_image

    co = asm_kernel(PC)
    entry = kernel_descriptor(co, loaded_image(co), "k").entry
    out = run_asm(machines(), co, [], 4)
    getpc = CODE_BASE + entry + 16 + 4      # s_getpc_b64 follows the 16-byte prologue
    assert (int(out[0][0]) | int(out[1][0]) << 32) == getpc
    assert out[2][0] == 9                   # the jump skipped `v_mov_b32 v3, 7`
    assert out[3][0] == (getpc + 20) & 0xFFFFFFFF   # s_swappc_b64's own next address
    if proof:
        with pytest.raises(KernelFault, match="PC"):
            run_asm(machines(("pc",)), co, [], 4)


# --- ds_swizzle -----------------------------------------------------------------------------------
def _swizzle(offset: int) -> str:
    return ld(1, 0) + f"\n  ds_swizzle_b32 v2, v1 offset:{offset}\n  s_waitcnt lgkmcnt(0)\n" + st(2, 0)


@PROOF
@pytest.mark.parametrize("offset", [0x041F, 0x801B, 0x00E0 | 0x10])
def test_ds_swizzle_by_its_documented_modes(machines, proof, offset):
    """Bit-mask mode (offset[15] = 0: source = ((lane & and) | or) ^ xor in each half-wave) and
    quad mode (offset[15] = 1: each lane of a quad takes the lane offset[2i+1:2i])."""
    lane = np.arange(64)
    if offset & 0x8000:
        src = (lane & ~3) + np.array([(offset >> (2 * (l % 4))) & 3 for l in lane])
    else:
        and_m, or_m, xor_m = offset & 31, (offset >> 5) & 31, (offset >> 10) & 31
        src = (lane & 32) | (((lane & and_m) | or_m) ^ xor_m)
    x = (lane * 3 + 1).astype(np.uint32)
    co = asm_kernel(_swizzle(offset))
    assert np.array_equal(run_asm(machines(), co, [x], 1)[0], x[src])
    if proof:
        with pytest.raises(KernelFault, match="COLON|cannot compile"):
            run_asm(machines(("ds_swizzle",)), co, [x], 1)


# --- denorm ----------------------------------------------------------------------------------------
DENORM = ld(1, 0) + "\n" + ld(2, 1) + "\n  v_mul_f32 v3, v1, v2\n" + st(3, 0)


@PROOF
@pytest.mark.parametrize("mode", [3, 0])
def test_f32_denormals_follow_the_kernel_s_mode(machines, proof, mode):
    """FLOAT_DENORM_MODE_32 = 3 (LLVM's default for GFX9 kernels) keeps a denormal product;
    0 flushes it."""
    a, b = _lanes(1e-20), _lanes(1e-20)
    want = (a * b) if mode == 3 else np.zeros(64, np.float32)
    assert want[0] != 0 or mode == 0
    co = asm_kernel(DENORM, denorm=mode)
    assert np.array_equal(run_asm(machines(), co, [a, b], 1)[0].view(np.float32), want)
    if proof and mode == 3:
        assert not np.array_equal(run_asm(machines(("denorm",)), co, [a, b], 1)[0].view(np.float32), want)


# --- mfma -------------------------------------------------------------------------------------------
DOT_CASES = [("fp16", 16, "v_mfma_f32_16x16x16f16"), ("fp16", 32, "v_mfma_f32_32x32x8f16"),
             ("bf16", 16, "v_mfma_f32_16x16x8bf16"), ("bf16", 32, "v_mfma_f32_32x32x4bf16"),
             ("fp32", 16, "v_mfma_f32_16x16x4f32"), ("fp32", 32, "v_mfma_f32_32x32x2f32")]
_NP = {"fp16": np.float16, "fp32": np.float32}


def _as(dt: str, x: np.ndarray) -> np.ndarray:
    """`x` (small integers: every product and sum exact) in the kernel's input type, as raw words."""
    if dt == "bf16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(_NP[dt])


@PROOF
@pytest.mark.parametrize("dt,nonk,op", DOT_CASES)
def test_tl_dot_is_exact(machines, proof, dt, nonk, op):
    """tl.dot of 32x32 by 32x32 (small integers: exact in any order) through `op`: C and D in
    AGPRs (gfx908's encoding says VGPRs), AMD's 32x32 output layout, gfx908's own bf16 opcodes."""
    m_, n_, k_ = (nonk, nonk, 32)
    co, name, lds = compile_kernel("dot", ARCH, (("a", f"*{dt}"), ("b", f"*{dt}"), ("c", "*fp32"), ("M", "constexpr"),
                                                 ("N", "constexpr"), ("K", "constexpr")),
                                   (("M", m_), ("N", n_), ("K", k_)), num_warps=1, matrix_instr_nonkdim=nonk)
    rng = np.random.default_rng(nonk)
    a, b = rng.integers(-3, 4, (m_, k_)).astype(np.float32), rng.integers(-3, 4, (k_, n_)).astype(np.float32)

    def run(m):
        pa, pb, pc = put(m.arena, _as(dt, a)), put(m.arena, _as(dt, b)), m.arena.alloc(4 * m_ * n_)
        ex = m.execute(co, Launch(kernel=name, grid=(1, 1, 1), block=(64, 1, 1), dynamic_lds=lds,
                                  kernarg=kernarg(co, name, pa, pb, pc)))
        return np.frombuffer(m.arena.read(pc, 4 * m_ * n_), np.float32).reshape(m_, n_), ex
    got, ex = run(machines())
    assert ex.opcodes.get(op, 0) > 0
    assert np.array_equal(got, a @ b)
    if not proof:
        return
    try:
        bad, _ = run(machines(("mfma",)))
    except KernelFault:
        return
    assert not np.array_equal(bad, a @ b)


def _mfma_table():
    from codegen.emulate.parts import GFX908_MFMA_NAMES
    return GFX908_MFMA_NAMES


PER_LANE = {"f32": 1, "f16": 4, "bf16": 2, "i8": 4}


def _shape(name: str) -> tuple[int, int, int, str]:
    """(m, k, blocks, source type) from a gfx908 MFMA mnemonic and AMD's table of block counts."""
    import re

    m, _n, k, src = re.match(r"v_mfma_[fi]32_(\d+)x(\d+)x(\d+)(f32|f16|bf16|i8)$", name).groups()
    m, k = int(m), int(k)
    chunks = 64 // m                         # lane groups
    blocks = chunks if k == PER_LANE[src] else 1
    return m, k, blocks, src


def _out_pos(m: int, blocks: int, r: int, lane: int) -> tuple[int, int, int]:
    """(block, row, column) of output register r of `lane`, by AMD's MFMA output layouts."""
    if m == 4:
        return lane // 4, r, lane % 4
    per_block = (m * m // 64)
    rr = r % per_block
    row = 8 * (rr // 4) + 4 * (lane // 32) + rr % 4 if m == 32 else 4 * (lane // 16) + rr
    return r // per_block, row, lane % m


def _pack(src: str, elems: np.ndarray) -> list[np.ndarray]:
    """Per-lane elements (64, per) of type `src` as the lanes' source registers (uint32 each)."""
    if src == "f32":
        return [elems[:, 0].astype(np.float32).view(np.uint32)]
    if src == "i8":
        b = elems.astype(np.int8).view(np.uint8).astype(np.uint32)
        return [b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24]
    h = _as("fp16" if src == "f16" else "bf16", elems).view(np.uint16).astype(np.uint32)
    return [h[:, i] | h[:, i + 1] << 16 for i in range(0, h.shape[1], 2)]


def _mfma_reference(m, k, blocks, src, a, b, c):
    """D (registers x lanes) = A·B + C for per-lane inputs a, b (64, per) by AMD's layouts."""
    per = PER_LANE[src]
    A, B = np.zeros((blocks, m, k)), np.zeros((blocks, m, k))
    for lane in range(64):
        g = lane // m
        blk, chunk = (g, 0) if blocks > 1 else (0, g)
        A[blk, lane % m, chunk * per:(chunk + 1) * per] = a[lane]
        B[blk, lane % m, chunk * per:(chunk + 1) * per] = b[lane]
    D = np.einsum("bik,bjk->bij", A, B)
    out = c.astype(np.float64).copy()
    for r in range(out.shape[0]):
        for lane in range(64):
            out[r, lane] += D[_out_pos(m, blocks, r, lane)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_mfma_table().values()))
def test_every_gfx908_mfma_by_the_documented_layout(machines, name):
    """Each gfx908 MFMA (4x4, 16x16 and 32x32; one block or several; f32, f16, bf16, i8) on one
    wave with C given: D = A·B + C, inputs and outputs where AMD's layouts put them."""
    m, k, blocks, src = _shape(name)
    per, regs = PER_LANE[src], max(1, PER_LANE[src] * {"f32": 32, "f16": 16, "bf16": 16, "i8": 8}[src] // 32)
    n_out = blocks * m * m // 64
    rng = np.random.default_rng(len(name))
    a, b = rng.integers(-3, 4, (64, per)), rng.integers(-3, 4, (64, per))
    c = rng.integers(-8, 9, (n_out, 64))
    c_words = c.astype(np.int32).view(np.uint32) if src == "i8" else c.astype(np.float32).view(np.uint32)
    vr = lambda base: f"v[{base}:{base + regs - 1}]" if regs > 1 else f"v{base}"   # noqa: E731
    body = "\n".join([ld(1 + i, i) for i in range(regs)] + [ld(10 + i, 2 + i) for i in range(regs)]
                     + [f"{ld(20, 4 + r)}\n  v_accvgpr_write_b32 a{r}, v20" for r in range(n_out)]
                     + [f"  {name} a[0:{n_out - 1}], {vr(1)}, {vr(10)}, a[0:{n_out - 1}]", "  s_nop 15"]
                     + [f"  v_accvgpr_read_b32 v20, a{r}\n{st(20, r)}" for r in range(n_out)])
    out = run_asm(machines(), asm_kernel(body), [*_pack(src, a), *([np.zeros(64, np.uint32)] * (2 - regs)),
                                                   *_pack(src, b), *([np.zeros(64, np.uint32)] * (2 - regs)),
                                                   *c_words], n_out)
    got = out.view(np.int32) if src == "i8" else out.view(np.float32)
    assert np.array_equal(got, _mfma_reference(m, k, blocks, src, a, b, c))


def test_the_gfx908_mfma_opcodes_are_llvm_s():
    """Our table of gfx908 MFMA opcodes against LLVM's assembler (pip Triton's): each mnemonic
    assembles to the opcode the layer decodes it by."""
    from triton._C.libtriton import amd, llvm

    llvm.init_targets()
    table = _mfma_table()
    for op, name in table.items():
        n_out = _shape(name)[2] * _shape(name)[0] ** 2 // 64
        regs = max(1, PER_LANE[_shape(name)[3]] * {"f32": 32, "f16": 16, "bf16": 16, "i8": 8}[_shape(name)[3]] // 32)
        vr = f"v[1:{regs}]" if regs > 1 else "v1"
        src = f'.amdgcn_target "amdgcn-amd-amdhsa--gfx908"\n.text\n{name} a[0:{n_out - 1}], {vr}, {vr}, a[0:{n_out - 1}]\n'
        obj = amd.assemble_amdgcn(src, "gfx908", "")
        words = [int.from_bytes(obj[i:i + 4], "little") for i in range(0, len(obj) - 3, 4)]
        assert any(w >> 23 == 0x1A7 and (w >> 16) & 0x7F == op for w in words), name


# --- glc, cache ---------------------------------------------------------------------------------
ATOMIC = ld(1, 0) + """
  v_mov_b32 v2, 0
  v_mov_b32 v3, 5
  global_atomic_add v4, v2, v3, s[8:9] glc
  s_waitcnt vmcnt(0)
""" + st(4, 0)


@PROOF
def test_an_atomic_with_glc_returns_the_old_value(machines, proof):
    """global_atomic_add ... glc: each lane gets the value before its own add (GFX9's glc is
    CDNA3's sc0; the emulator looked for `glc` and returned nothing). All 64 lanes add 5 to word
    0 in lane order."""
    x = np.arange(64, dtype=np.uint32) + 100
    got = run_asm(machines(), asm_kernel(ATOMIC), [x], 1)[0]
    assert np.array_equal(got, 100 + 5 * np.arange(64, dtype=np.uint32))
    if proof:
        assert not np.array_equal(run_asm(machines(("glc",)), asm_kernel(ATOMIC), [x], 1)[0], got)


CACHE = ld(1, 0) + "\n  buffer_wbinvl1_vol\n  buffer_wbinvl1\n" + st(1, 0)


@PROOF
def test_gfx9_cache_invalidates_are_no_ops(machines, proof):
    x = np.arange(64, dtype=np.uint32)
    assert np.array_equal(run_asm(machines(), asm_kernel(CACHE), [x], 1)[0], x)
    if proof:
        with pytest.raises(KernelFault, match="unknown instruction"):
            run_asm(machines(("cache",)), asm_kernel(CACHE), [x], 1)


# --- buffer -------------------------------------------------------------------------------------
SPILL = ld(1, 0) + """
  buffer_store_dword v1, off, s[0:3], 0 offset:16
  s_mov_b32 s20, 256
  buffer_store_dword v1, off, s[0:3], s20 offset:4
  v_mov_b32 v1, 0
  buffer_load_dword v2, off, s[0:3], 0 offset:16
  buffer_load_dword v3, off, s[0:3], s20 offset:4
  buffer_load_ubyte v4, off, s[0:3], 0 offset:17
  buffer_load_sshort v5, off, s[0:3], 0 offset:18
  s_waitcnt vmcnt(0)
""" + "\n".join(st(r, r - 2) for r in (2, 3, 4, 5))


@PROOF
def test_a_spill_through_the_private_segment_buffer_comes_back(machines, proof):
    """LLVM spills through the private segment buffer (s[0:3]: a swizzled V#, one dword per lane
    interleaved); what a lane stores it loads back, bytes and shorts included (the emulator
    addressed it as a linear buffer at the V#'s base: outside memory)."""
    x = (np.arange(64, dtype=np.uint32) * 0x01020304 + 0x80F0).astype(np.uint32)
    co = asm_kernel(SPILL, scratch=64)
    out = run_asm(machines(), co, [x], 4)
    assert np.array_equal(out[0], x) and np.array_equal(out[1], x)
    assert np.array_equal(out[2], (x >> 8) & 0xFF)
    assert np.array_equal(out[3].view(np.int32), ((x >> 16) & 0xFFFF).astype(np.uint16).view(np.int16))
    if proof:
        with pytest.raises(KernelFault, match="out of arena"):
            run_asm(machines(("buffer",)), co, [x], 4)


RAW = ld(1, 0) + """
  s_mov_b32 s12, s8
  s_and_b32 s13, s9, 0xffff
  s_mov_b32 s14, 128
  s_mov_b32 s15, 0x27000
  buffer_load_dword v2, v250, s[12:15], 0 offen
  v_mov_b32 v3, 7
  buffer_store_dword v3, v250, s[12:15], 0 offen offset:256
  s_waitcnt vmcnt(0)
""" + st(2, 0)


def test_a_raw_buffer_stops_at_num_records(machines):
    """A raw V# (stride 0) of 128 bytes: lanes 0-31 load their word, the others 0 (and the
    stores at offset 256, past the end, are dropped: no fault)."""
    x = np.arange(64, dtype=np.uint32) + 1
    out = run_asm(machines(), asm_kernel(RAW), [x, x], 1)
    assert np.array_equal(out[0], np.where(np.arange(64) < 32, x, 0))
