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
                   num_stages: int = 1) -> tuple[bytes, str, int]:
    """(code object, kernel name, dynamic LDS bytes) of the kernel `fn_name` of this module."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = globals()[fn_name]
    src = ASTSource(fn=fn, signature=dict(signature), constexprs=dict(constexprs))
    k = triton.compile(src, target=GPUTarget("hip", arch, 64),
                       options={"num_warps": num_warps, "num_stages": num_stages})
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
