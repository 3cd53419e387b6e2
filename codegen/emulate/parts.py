"""The parts of our layer over the emulator, by name: `Machine(without=...)` leaves the named ones
out, which only the tests that show each part matters do (codegen.emulate.gfx9 holds the fixes,
codegen.emulate.guard the bounds)."""

FIXES = ("mfma", "true16", "dpp", "pc", "ds_swizzle", "denorm", "cache", "glc", "permute", "mix")
PARTS = ("guard", *FIXES)

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
