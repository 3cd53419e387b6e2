"""Triton kernels with answers known in closed form, compiled for a gfx9 target by pip Triton
(`triton.compile(ASTSource(...), target=GPUTarget("hip", ARCH, 64))`): the instruction-level
tests of the emulator layer (tests/test_emulate*.py) run them and compare with numpy."""

from __future__ import annotations

import functools

import triton
import triton.language as tl


@triton.jit
def vector_add(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@functools.lru_cache(maxsize=None)
def compile_kernel(fn_name: str, arch: str, signature: tuple, constexprs: tuple = (), num_warps: int = 4,
                   num_stages: int = 1, **options) -> tuple[bytes, str, int]:
    """(code object, kernel name, dynamic LDS bytes) of the kernel `fn_name` of this module
    (`options`: more of Triton's AMD options, e.g. matrix_instr_nonkdim)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = globals()[fn_name]
    src = ASTSource(fn=fn, signature=dict(signature), constexprs=dict(constexprs))
    k = triton.compile(src, target=GPUTarget("hip", arch, 64),
                       options={"num_warps": num_warps, "num_stages": num_stages, **options})
    return k.asm["hsaco"], k.metadata.name, k.metadata.shared


def kernarg(code_object: bytes, kernel: str, *values: int | float) -> bytes:
    """The explicit kernel arguments packed at the offsets the metadata gives, in order: an int
    for a pointer or an integer, a float for an fp32 scalar; arguments past `values` (Triton's
    scratch pointers) are 0."""
    import struct

    from codegen.formats.elf import read_code_object

    args = [a for a in read_code_object(code_object).kernels[kernel][".args"]
            if not a[".value_kind"].startswith("hidden_")]
    out = bytearray(max((a[".offset"] + a[".size"] for a in args), default=0))
    for a, v in zip(args, values):
        fmt = {8: "<Q", 4: "<f" if isinstance(v, float) else "<i", 2: "<h"}[a[".size"]]
        struct.pack_into(fmt, out, a[".offset"], v)
    return bytes(out)


@triton.jit
def scalar_copy(x, out):
    tl.store(out, tl.load(x) + 1.0)


@triton.jit
def atomic_inc(x, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(x + offs, 1.0, mask=offs < n)


@triton.jit
def block_sum(x, out, BLOCK: tl.constexpr):
    tl.store(out, tl.sum(tl.load(x + tl.arange(0, BLOCK)), axis=0))


def patch_word(code_object: bytes, old: int, new: int, nth: int = 0) -> bytes:
    """`code_object` with the `nth` instruction dword equal to `old` (4-aligned, in the executable
    segment) replaced by `new`: a planted fault."""
    import io

    from elftools.elf.elffile import ELFFile

    seg = next(s for s in ELFFile(io.BytesIO(code_object)).iter_segments()
               if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1)
    start = seg["p_offset"]
    words = [start + i for i in range(0, seg["p_filesz"], 4)
             if int.from_bytes(code_object[start + i:start + i + 4], "little") == old]
    at = words[nth]
    return code_object[:at] + new.to_bytes(4, "little") + code_object[at + 4:]


def open_machine(tmp_dir, arch: str = "gfx908", size: int = 64 << 20, **kw):
    """(arena, started Machine) in `tmp_dir`, or pytest.skip with the reason when the emulator or
    clang is missing."""
    import pytest

    from codegen.emulate.arena import Arena
    from codegen.emulate.machine import Machine
    from codegen.emulate.source import EmulatorMissing

    arena = Arena.create(tmp_dir / "arena", size)
    try:
        machine = Machine(arch, arena, **kw)
    except EmulatorMissing as exc:
        arena.close()
        pytest.skip(f"emulator: {exc}")
    machine.start()
    return arena, machine


def put(arena, array) -> int:
    """A fresh arena address holding `array`'s bytes."""
    addr = arena.alloc(array.nbytes)
    arena.write(addr, array.tobytes())
    return addr


# --- hand-written kernels: one instruction under AMD's documented semantics -----------------------
_ASM = """.amdgcn_target "amdgcn-amd-amdhsa--{arch}"
.text
.globl k
.p2align 8
.type k,@function
k:
  s_load_dwordx4 s[8:11], s[4:5], 0x0
  v_lshlrev_b32 v250, 2, v0
  s_waitcnt lgkmcnt(0)
{body}
  s_endpgm
.Lend:
.size k, .Lend-k
.rodata
.p2align 6
.amdhsa_kernel k
  .amdhsa_user_sgpr_private_segment_buffer 1
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_next_free_vgpr 256
  .amdhsa_next_free_sgpr 96
  .amdhsa_float_denorm_mode_32 {denorm}
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_private_segment_fixed_size {scratch}
{extra}
.end_amdhsa_kernel
.amdgpu_metadata
---
amdhsa.version: [ 1, 2 ]
amdhsa.kernels:
  - .name: k
    .symbol: k.kd
    .kernarg_segment_size: 16
    .kernarg_segment_align: 8
    .group_segment_fixed_size: {lds}
    .private_segment_fixed_size: {scratch}
    .wavefront_size: 64
    .sgpr_count: 96
    .vgpr_count: 256
    .max_flat_workgroup_size: 256
    .args:
      - {{ .offset: 0, .size: 8, .value_kind: global_buffer, .address_space: global }}
      - {{ .offset: 8, .size: 8, .value_kind: global_buffer, .address_space: global }}
...
.end_amdgpu_metadata
"""


def ld(vreg: int, slot: int) -> str:
    """Load v`vreg` of every lane from input slot `slot` (64 dwords, one per lane)."""
    return (f"  v_add_u32 v251, {slot * 256}, v250\n  global_load_dword v{vreg}, v251, s[8:9]\n"
            "  s_waitcnt vmcnt(0)")


def st(vreg: int, slot: int) -> str:
    """Store v`vreg` of every lane to output slot `slot`."""
    return f"  v_add_u32 v251, {slot * 256}, v250\n  global_store_dword v251, v{vreg}, s[10:11]\n  s_waitcnt vmcnt(0)"


@functools.lru_cache(maxsize=None)
def asm_kernel(body: str, arch: str = "gfx908", denorm: int = 3, lds: int = 0, extra: str = "", scratch: int = 0) -> bytes:
    """A code object of kernel `k(in, out)` running `body` (see ld/st) on one wave, assembled and
    linked by pip Triton's LLVM."""
    import tempfile

    from triton._C.libtriton import amd, llvm

    llvm.init_targets()
    obj = amd.assemble_amdgcn(_ASM.format(arch=arch, body=body, denorm=denorm, lds=lds, extra=extra, scratch=scratch),
                              arch, "")
    if not obj:
        raise ValueError(f"LLVM did not assemble this kernel body (its error is on stderr):\n{body}")
    with tempfile.NamedTemporaryFile() as src, tempfile.NamedTemporaryFile() as out:
        with open(src.name, "wb") as fh:
            fh.write(obj)
        amd.link_hsaco(src.name, out.name)
        with open(out.name, "rb") as fh:
            return fh.read()


def run_asm(machine, co: bytes, inputs, n_out: int, lanes: int = 64):
    """Run `k` with input slots `inputs` (each 64 uint32/float32 values); the `n_out` output slots
    as a uint32 array (n_out, 64)."""
    import numpy as np

    from codegen.models.emulate import Launch

    a = machine.arena
    data = np.concatenate([np.asarray(x).view(np.uint32).reshape(64) for x in inputs]) if inputs else np.zeros(64, np.uint32)
    src, out = put(a, data), a.alloc(256 * n_out)
    a.write(out, bytes(256 * n_out))
    machine.execute(co, Launch(kernel="k", grid=(1, 1, 1), block=(lanes, 1, 1),
                               kernarg=src.to_bytes(8, "little") + out.to_bytes(8, "little")), budget=10_000)
    return np.frombuffer(a.read(out, 256 * n_out), np.uint32).reshape(n_out, 64)


@triton.jit
def dot(a, b, c, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    x = tl.load(a + rm[:, None] * K + rk[None, :])
    y = tl.load(b + rk[:, None] * N + rn[None, :])
    tl.store(c + rm[:, None] * N + rn[None, :], tl.dot(x, y))


@triton.jit
def philox(seed, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.uint64) + 0x1_0000_0000
    r0, r1, r2, r3 = tl.randint4x(tl.load(seed), offs)
    o = tl.arange(0, BLOCK)
    tl.store(out + o, r0)
    tl.store(out + BLOCK + o, r1)
    tl.store(out + 2 * BLOCK + o, r2)
    tl.store(out + 3 * BLOCK + o, r3)
