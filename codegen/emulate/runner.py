"""Executing one launch in the Machine's child (codegen.emulate.child): the waves of each workgroup
in turn, each until `s_barrier` or `s_endpgm`, one compiled instruction at a time, the way the
pinned emulator's `run_asm` does, with what it leaves out: the initial state a gfx9 dispatch sets
up (codegen.emulate.dispatch), bounds on every access (codegen.emulate.guard: the arena, not the
host's memory), an instruction budget, the PC kept inside the kernel's code, and a fault report
instead of an exception. Imported only in the child: it imports the emulator.

Code is fetched from the loaded image at device address CODE_BASE (the PC is CODE_BASE + the
image's virtual address), never through device memory: the emulator reads an instruction's
register fields from its code at run time, and here that read goes to the image."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import sqlite3
import sys
import time
from collections import Counter

from test.mockgpu.amd import emu                     # the pinned emulator (on the child's sys.path)
from tinygrad.dtype import dtypes
from tinygrad.uop.ops import UOp

from codegen.emulate import dispatch, guard
from codegen.emulate.arena import CODE_BASE
from codegen.emulate import icache
from codegen.emulate.compiler import Compiler
from codegen.emulate.icache import InstructionCache
from codegen.emulate.gfx9 import Layer

ENDPGM_PC = emu.ENDPGM_PC
FETCH = 16                     # bytes the decoder looks at (the longest instruction and its literal)
_code = UOp.param(guard.CODE, dtypes.uint32, (1 << 40,))


class KernelStop(Exception):
    """A fault: the kernel stops here (the fields of codegen.models.emulate.Fault)."""

    def __init__(self, pc: int, instruction: str, reason: str, lane: int | None = None, address: int | None = None):
        super().__init__(reason)
        self.pc, self.instruction, self.reason, self.lane, self.address = pc, instruction, reason, lane, address


def _inst_word(self, dword_idx: int) -> UOp:
    """An instruction dword, read from the code image (the emulator reads it from vmem at PC)."""
    off = self.rpc() - UOp.const(CODE_BASE - dword_idx * 4, dtypes.uint64)
    return _code.index(off >> UOp.const(2, dtypes.uint64)).load()


class _Canaries:
    """The arena's mapping in this process, between two pages of a known pattern, checked after
    each launch: a write the guard let through next to the arena shows as damage."""

    SIZE, BYTE = 1 << 16, 0xA5

    def __init__(self, fd: int, size: int):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        rw = mmap.PROT_READ | mmap.PROT_WRITE
        region = libc.mmap(None, size + 2 * self.SIZE, rw, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if region in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "cannot reserve the arena's mapping")
        host = libc.mmap(region + self.SIZE, size, rw, mmap.MAP_SHARED | 0x10, fd, 0)   # 0x10: MAP_FIXED
        if host != region + self.SIZE:
            raise OSError(ctypes.get_errno(), "cannot map the arena")
        self.region, self.host, self.size = region, host, size
        self.pattern = bytes([self.BYTE]) * self.SIZE
        self.fill()

    def fill(self) -> None:
        ctypes.memset(self.region, self.BYTE, self.SIZE)
        ctypes.memset(self.host + self.size, self.BYTE, self.SIZE)

    def intact(self) -> bool:
        ok = (ctypes.string_at(self.region, self.SIZE) == self.pattern
              and ctypes.string_at(self.host + self.size, self.SIZE) == self.pattern)
        if not ok:
            self.fill()
        return ok


class Program:
    """One kernel's code in this process: its loaded image and what was compiled at each PC."""

    def __init__(self, req: dict, image: bytes):
        self.kernel = req["kernel"]
        self.buf = ctypes.create_string_buffer(image + b"\0" * FETCH, len(image) + FETCH)
        self.host = ctypes.addressof(self.buf)
        self.image = image
        self.entry = CODE_BASE + int(req["entry"])
        self.text = (CODE_BASE + int(req["text"][0]), CODE_BASE + int(req["text"][1]))
        self.at: dict[int, tuple] = {}   # pc -> (fxn, globals, is_barrier, name, text)

    def offset(self, pc: int) -> int:
        return pc - self.entry

    def fetch(self, pc: int, compiler: Compiler) -> tuple:
        lo, hi = self.text
        if not lo <= pc < hi or pc % 4:
            raise KernelStop(self.offset(pc), "", "jump outside the kernel's code")
        off = pc - CODE_BASE
        raw = self.image[off:off + FETCH].ljust(FETCH, b"\0")
        try:
            inst = compiler.decode(raw)
            size = inst.size()
        except Exception as exc:  # noqa: BLE001 - the decoder's own errors: a report
            raise KernelStop(self.offset(pc), f"word {int.from_bytes(raw[:4], 'little'):#010x}",
                             f"unknown instruction ({exc})") from None
        if pc + size > hi:
            raise KernelStop(self.offset(pc), repr(inst), "instruction runs past the end of the code")
        try:
            c = compiler.compile(raw, inst)
        except Exception as exc:  # noqa: BLE001 - a handler or pcode the emulator lacks
            raise KernelStop(self.offset(pc), repr(inst), f"unknown instruction: the emulator cannot compile it "
                             f"({type(exc).__name__}: {exc})"[:2000]) from None
        entry = (c.fxn, c.globals, c.is_barrier, c.name, c.text)
        self.at[pc] = entry
        return entry


class Runner:
    """The child's state across launches: the arena mapping, compiled instructions."""

    def __init__(self, arch: str, fd: int, size: int, base: int, without: frozenset[str] = frozenset(),
                 cache: str | None = None):
        self.arch, self.isa = arch, "cdna"
        self.size, self.base = size, base
        self.canaries = _Canaries(fd, size)
        self.host = self.canaries.host
        self.ctl = (ctypes.c_uint32 * guard.CTL_WORDS)()
        self.trace = None   # debugging: called as trace(wave index, wave, pc, entry) after each instruction
        emu._Ctx.inst_word = _inst_word
        self.layer = Layer(arch, without)
        bounded = "guard" not in without
        store = None
        if cache:
            try:
                store = InstructionCache(cache, icache.version(self.layer.version, bounded, os.environ.get("CC", "clang")))
            except (OSError, sqlite3.Error) as exc:
                print(f"emulator: no instruction cache ({exc})", file=sys.stderr)
        self.compiler = Compiler(self.layer, self.isa, bounded=bounded, cache=store)

    def run(self, req: dict, image: bytes) -> dict:
        prog = Program(req, image)
        start = time.perf_counter()
        counts: Counter = Counter()
        ctl = self.ctl
        ctypes.memset(ctl, 0, ctypes.sizeof(ctl))
        for word, val in ((guard.ARENA_BASE, self.base >> 2), (guard.ARENA_WORDS, self.size >> 2)):
            ctl[word], ctl[word + 1] = val & 0xFFFFFFFF, val >> 32
        state = dispatch.Dispatch(req, emu, prog.entry, {2: self.host, 6: ctypes.addressof(ctl), 7: prog.host})
        ctl[guard.LDS_WORDS] = len(state.lds)
        ctl[guard.SCRATCH_BYTES] = state.scratch_bytes
        budget = int(req["budget"])
        executed = waves = 0
        try:
            with emu._MXCSRContext() if self.layer.flush_denormals(int(req["rsrc1"])) else contextlib.nullcontext():
                for group in state.workgroups():
                    waves += len(group.waves)
                    executed = self._workgroup(prog, group, counts, executed, budget)
        except KernelStop as stop:
            if not self.canaries.intact():
                stop.reason += "; and the emulator wrote next to the arena (its canaries are damaged)"
            return {"fault": {"kernel": prog.kernel, "pc": stop.pc, "instruction": stop.instruction,
                              "lane": stop.lane, "address": stop.address, "reason": stop.reason}}
        if not self.canaries.intact():
            return {"fault": {"kernel": prog.kernel, "pc": -1, "instruction": "",
                              "reason": "the emulator wrote next to the arena (its canaries are damaged)"}}
        return {"execution": {"instructions": executed, "waves": waves, "opcodes": dict(counts),
                              "seconds": time.perf_counter() - start}}

    def _workgroup(self, prog: Program, group, counts: Counter, executed: int, budget: int) -> int:
        waves = group.waves
        done = [False] * len(waves)
        at, ctl, trace = prog.at, self.ctl, self.trace
        while not all(done):
            for wi, wave in enumerate(waves):
                if done[wi]:
                    continue
                last = None
                while True:
                    pc = wave.pc()
                    if pc == ENDPGM_PC:
                        done[wi] = True
                        break
                    entry = at.get(pc)
                    if entry is None:
                        entry = self._fetch(prog, pc, last)
                    last = pc
                    fxn, globs, is_barrier, name, _text = entry
                    if executed >= budget:
                        raise KernelStop(prog.offset(pc), entry[4], f"instruction budget ({budget}) spent")
                    fxn(*wave.args(globs))
                    executed += 1
                    counts[name] += 1
                    if ctl[guard.FAULT]:
                        raise self._fault(prog, pc, entry)
                    if trace is not None:
                        trace(wi, wave, pc - prog.entry, entry)
                    if is_barrier:
                        break
        return executed

    def _fetch(self, prog: Program, pc: int, last: int | None) -> tuple:
        """The compiled instruction at `pc`; a jump outside the code is reported at the jump
        (`last`), the address being its target."""
        try:
            return prog.fetch(pc, self.compiler)
        except KernelStop as stop:
            if stop.reason.startswith("jump outside") and last is not None:
                raise KernelStop(prog.offset(last), prog.at[last][4], stop.reason, address=pc) from None
            raise

    def _fault(self, prog: Program, pc: int, entry: tuple) -> KernelStop:
        ctl = self.ctl
        kind, lane = ctl[guard.FAULT], ctl[guard.FAULT_LANE]
        addr = ctl[guard.FAULT_ADDR] | ctl[guard.FAULT_ADDR + 1] << 32
        return KernelStop(prog.offset(pc), entry[4], guard.REASONS.get(kind, f"fault {kind}"),
                          lane=None if lane == guard.NO_LANE else lane, address=addr)

    def opcodes(self, req: dict, image: bytes) -> dict:
        """Every instruction of the kernel's code, decoded in order: mnemonic -> occurrences."""
        prog = Program(req, image)
        counts: Counter = Counter()
        pc, hi = prog.text
        while pc < hi:
            off = pc - CODE_BASE
            try:
                inst = self.compiler.decode(prog.image[off:off + FETCH].ljust(FETCH, b"\0"))
            except Exception:  # noqa: BLE001 - padding or data after the last instruction
                pc += 4
                continue
            counts[emu._op_name(inst).lower()] += 1
            pc += inst.size()
        return {"opcodes": dict(counts)}
