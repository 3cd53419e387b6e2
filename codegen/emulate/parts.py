"""The parts of our layer over the pinned emulator, by name, each with its write-up as a change
upstream could take (where in the emulator, what it gets wrong for GFX9, the corrected rule);
`scripts/emulator_patches.py` prints them with line numbers in the pinned tree. `Machine(without=
...)` leaves named parts out, which only the tests that show each part matters do; every name
has such a test (tests/test_emulate_layer.py checks it). The fixes themselves live in
codegen.emulate.gfx9, the bounds in codegen.emulate.guard."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str
    where: str      # file: function(s) of the emulator (test/mockgpu/amd/ of the pinned tree)
    wrong: str
    rule: str


PARTS_TABLE = (
    Part("guard", "emu.py: run_asm, _Ctx (vmem, lds, scratch params), _compile_mem_op, _compile_mubuf, "
         "_compile_smem",
         "device memory is the host's from address 0 (vmem base 0); LDS, scratch and register indices are "
         "not bounded; a wrong address reads or writes the emulator's own process",
         "give vmem a base and a size; bound every buffer index by its buffer's size and make an access only "
         "when it is in bounds and its value is used (inactive lanes' addresses are computed too); record "
         "(lane, address) of a refused access and stop the wave"),
    Part("mfma", "emu.py: _compile_mfma, _MFMA_SHAPES; renderer/amd decode (cdna tables)",
         "gfx908's C/D are always AGPRs but its bit 15 is 0 (acc_cd only from gfx90a); the 32x32 output row "
         "is taken as 16*(lane/32)+reg; multi-block shapes are treated as one block; gfx908's bf16 MFMAs "
         "(opcodes 0x68-0x6d) decode as CDNA3 instructions or not at all; f16 denormal inputs are flushed",
         "decode gfx908's MAI opcodes from its own table; C/D in AGPRs on gfx908; for every shape, lane l "
         "holds row l%M of block (l/M) or k-chunk (l/M); output 32x32: row = 8*(r/4) + 4*(l/32) + r%4, "
         "16x16: row = 4*(l/16) + r, 4x4: block l/4, row r; column l%M; f16 denormals converted exactly"),
    Part("true16", "emu.py: _compile_vop12, _load_vsrc0, _compile_vopc",
         "RDNA3's true16 naming (v0.h encoded as v128+) is applied to CDNA: a 16-bit result to v159 goes to "
         "the high half of v31, a 16-bit source >= v128 is read from a high half",
         "apply the hi-half naming on RDNA only (wave32); on GFX9 a VOP1/VOP2/VOPC field names v0-v255"),
    Part("dpp", "emu.py: _load_dpp16_src0, _compile_vop12",
         "the DPP source is read in the same lane loop that writes the result: with vdst == src0 "
         "(v_add_f32_dpp v2, v2, v2 row_ror:8) lanes read values already overwritten; lanes of a masked "
         "row/bank or an out-of-range source without bound_ctrl are written with op(old vdst, src1)",
         "read the source register of all lanes before writing any; leave a lane unwritten when its row or "
         "bank is masked, or its source lane is out of range and bound_ctrl is 0"),
    Part("pc", "emu.py: _compile_sop (compile_sop_pcode)",
         "the pseudocode of s_getpc_b64, s_setpc_b64, s_swappc_b64 and s_call_b64 reads PC, which the SOP "
         "compiler does not define: 'unknown variable: PC'",
         "define PC as the instruction's address; a PC assignment sets the wave's PC instead of PC += size"),
    Part("ds_swizzle", "emu.py: _compile_mem_op (DS); autogen cdna str_pcode DS_SWIZZLE_B32",
         "the 'pseudocode' of DS_SWIZZLE_B32 is a table that does not parse: 'unexpected token in primary: "
         "COLON'",
         "offset[15] = 1: lane i of each quad reads lane offset[2i+1:2i] of the quad; else, within 32 lanes, "
         "source = ((lane & offset[4:0]) | offset[9:5]) ^ offset[14:10]; an inactive source gives 0"),
    Part("denorm", "emu.py: _MXCSRContext, run_asm",
         "every kernel runs with FTZ/DAZ (RDNA3's default), though LLVM's GFX9 kernels set "
         "FLOAT_DENORM_MODE_32 = 3 (keep denormals)",
         "set FTZ/DAZ from the kernel descriptor's FLOAT_DENORM_MODE_32 (COMPUTE_PGM_RSRC1 bits 17:16)"),
    Part("cache", "renderer/amd decode (cdna tables); emu.py: _compile_mubuf",
         "GFX9's buffer_wbinvl1 and buffer_wbinvl1_vol (MUBUF 62, 63; after atomics and volatile accesses) "
         "are unknown words: CDNA3 dropped them",
         "decode them on GFX9 and execute them as no-ops (no caches are modelled)"),
    Part("buffer", "emu.py: _compile_mubuf",
         "a V#'s stride is read from word3 (GFX9 keeps it in word1 29:16); swizzled buffers (ADD_TID_ENABLE: "
         "the private segment buffer every spilling kernel uses) are addressed as linear ones; byte and short "
         "loads and stores are whole dwords; a buffer atomic is executed as a load",
         "GFX9 buffer addressing: index = vgpr index + lane (ADD_TID_ENABLE), offset = vgpr offset + "
         "inst_offset; swizzled: ((index/istride)*stride + (offset/esize)*esize)*istride + (index%istride)*esize "
         "+ offset%esize; range: offset < num_records (stride 0) else index < num_records; sub-dword widths "
         "as such; atomics refused until modelled"),
    Part("hwreg", "emu.py: _compile_sop (S_GETREG_B32), _init_wave",
         "s_getreg_b32 reads its hardware register from SGPR slots 244-259 of the wave, which hold the inline "
         "constants 2.0 ... 1/(2*pi): HW_ID reads as 0x3e22f983; s_setreg does not compile (WAVE_STATUS)",
         "keep hardware registers apart from the inline constants; until they are modelled, refuse "
         "s_getreg/s_setreg with a fault rather than return a constant"),
    Part("glc", "emu.py: _compile_mem_op (writes_return_data)",
         "an atomic returns the old value only when the instruction has `glc`; the CDNA tables call that bit "
         "sc0, so no atomic returns anything (Triton's atomic tile counters never advance)",
         "read CDNA's sc0 (GFX9's glc) as glc"),
    Part("permute", "emu.py: _compile_mem_op (DS_PERMUTE/DS_BPERMUTE via parse_pcode)",
         "ds_bpermute_b32 reads lane (addr + offset)/4 without the pseudocode's % 64: an address above 255 "
         "reads past lane 63 (another register's lanes); Triton 3.5.1's cross-wave reductions pass "
         "workgroup-wide byte offsets (thread id * 4 ^ 128)",
         "source lane = ((addr + offset) >> 2) & 63, the address's bits above 7 ignored; 0 from a lane EXEC "
         "leaves out"),
    Part("mix", "emu.py: _compile_vop3p (rsrc_dyn with bits=16 for every source)",
         "v_fma_mix_f32/_mixlo_f16/_mixhi_f16 (CDNA3's v_mad_mix*) read every inline float constant as f16, "
         "also where op_sel_hi takes the operand as f32: Triton's f32->f16 conversion v_fma_mixlo_f16 v1, "
         "v0, 1.0, 0 gives +-0",
         "an inline constant is f32 where the operand's op_sel_hi bit is clear, f16 where it is set"),
)
PARTS = tuple(p.name for p in PARTS_TABLE)
FIXES = tuple(p for p in PARTS if p != "guard")

# gfx908's matrix instructions: VOP3P opcode (bits 22:16) -> mnemonic (LLVM's gfx908 MAI table; the
# tests check each against LLVM's assembler). The shape each encodes: codegen.emulate.gfx9.
GFX908_MFMA_NAMES = {
    0x40: "v_mfma_f32_32x32x1f32", 0x41: "v_mfma_f32_16x16x1f32", 0x42: "v_mfma_f32_4x4x1f32",
    0x44: "v_mfma_f32_32x32x2f32", 0x45: "v_mfma_f32_16x16x4f32", 0x48: "v_mfma_f32_32x32x4f16",
    0x49: "v_mfma_f32_16x16x4f16", 0x4A: "v_mfma_f32_4x4x4f16", 0x4C: "v_mfma_f32_32x32x8f16",
    0x4D: "v_mfma_f32_16x16x16f16", 0x50: "v_mfma_i32_32x32x4i8", 0x51: "v_mfma_i32_16x16x4i8",
    0x52: "v_mfma_i32_4x4x4i8", 0x54: "v_mfma_i32_32x32x8i8", 0x55: "v_mfma_i32_16x16x16i8",
    0x68: "v_mfma_f32_32x32x2bf16", 0x69: "v_mfma_f32_16x16x2bf16", 0x6B: "v_mfma_f32_4x4x2bf16",
    0x6C: "v_mfma_f32_32x32x4bf16", 0x6D: "v_mfma_f32_16x16x8bf16",
}
