"""Executing one launch in the Machine's child (codegen.emulate.child): the waves of each workgroup
in turn, each until `s_barrier` or `s_endpgm`, one compiled instruction at a time, the way the
pinned emulator's `run_asm` does, with what it leaves out: the initial state a gfx9 dispatch sets
up (codegen.emulate.dispatch), an instruction budget, the PC kept inside the kernel's code, and a
fault report instead of an exception. Imported only in the child: it imports the emulator."""

from __future__ import annotations

import ctypes
import mmap
import time
from collections import Counter

from test.mockgpu.amd import emu                     # the pinned emulator (on the child's sys.path)
from tinygrad.renderer.amd import decode_inst

from codegen.emulate import dispatch

ENDPGM_PC = emu.ENDPGM_PC
FETCH = 16                     # bytes the decoder looks at (the longest instruction and its literal)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
MAP_FIXED_NOREPLACE = 0x100000


class KernelStop(Exception):
    """A fault: the kernel stops here (the fields of codegen.models.emulate.Fault)."""

    def __init__(self, pc: int, instruction: str, reason: str, lane: int | None = None, address: int | None = None):
        super().__init__(reason)
        self.pc, self.instruction, self.reason, self.lane, self.address = pc, instruction, reason, lane, address


def _map_fixed(fd: int, size: int, base: int) -> None:
    got = _libc.mmap(base, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0)
    if got != base:
        raise OSError(ctypes.get_errno(), f"cannot map the arena at {base:#x}")


class Program:
    """One kernel's code in this process: its loaded image and what was compiled at each PC."""

    def __init__(self, req: dict, image: bytes):
        self.kernel = req["kernel"]
        self.buf = ctypes.create_string_buffer(image + b"\0" * FETCH, len(image) + FETCH)
        self.host = ctypes.addressof(self.buf)
        self.image = image
        self.entry = self.host + int(req["entry"])
        self.text = (self.host + int(req["text"][0]), self.host + int(req["text"][1]))
        self.at: dict[int, tuple] = {}   # pc -> (fxn, globals, is_barrier, name, text)

    def offset(self, pc: int) -> int:
        return pc - self.entry

    def fetch(self, pc: int, arch: str) -> tuple:
        lo, hi = self.text
        if not lo <= pc < hi or pc % 4:
            raise KernelStop(self.offset(pc), "", "jump outside the kernel's code")
        off = pc - self.host
        raw = self.image[off:off + FETCH].ljust(FETCH, b"\0")
        try:
            inst = decode_inst(raw, arch)
            size = inst.size()
        except Exception as exc:  # noqa: BLE001 - the decoder's own errors: a report
            raise KernelStop(self.offset(pc), f"word {int.from_bytes(raw[:4], 'little'):#010x}",
                             f"unknown instruction ({exc})") from None
        if pc + size > hi:
            raise KernelStop(self.offset(pc), repr(inst), "instruction runs past the end of the code")
        name = emu._op_name(inst).lower()
        try:
            prg, runtime = emu._get_runner(bytes(raw[:size + 4]), arch)
        except Exception as exc:  # noqa: BLE001 - a handler or pcode the emulator lacks
            raise KernelStop(self.offset(pc), repr(inst), f"unknown instruction: the emulator cannot compile it "
                             f"({type(exc).__name__}: {exc})"[:2000]) from None
        is_barrier = isinstance(inst, emu.irc.SOPP) and inst.op in emu._BARRIER_OPS
        entry = (runtime.fxn, tuple(prg.arg.globals), is_barrier, name, repr(inst))
        self.at[pc] = entry
        return entry


class Runner:
    """The child's state across launches: the arena mapping, compiled instructions."""

    def __init__(self, arch: str, fd: int, size: int, base: int):
        self.arch, self.isa = arch, "cdna"
        self.size, self.base = size, base
        _map_fixed(fd, size, base)

    def run(self, req: dict, image: bytes) -> dict:
        prog = Program(req, image)
        start = time.perf_counter()
        counts: Counter = Counter()
        state = dispatch.Dispatch(req, emu, prog.entry, self.base)
        budget = int(req["budget"])
        executed = waves = 0
        try:
            with emu._MXCSRContext():
                for group in state.workgroups():
                    waves += len(group.waves)
                    executed = self._workgroup(prog, group, counts, executed, budget)
        except KernelStop as stop:
            return {"fault": {"kernel": prog.kernel, "pc": stop.pc, "instruction": stop.instruction,
                              "lane": stop.lane, "address": stop.address, "reason": stop.reason}}
        return {"execution": {"instructions": executed, "waves": waves, "opcodes": dict(counts),
                              "seconds": time.perf_counter() - start}}

    def _workgroup(self, prog: Program, group, counts: Counter, executed: int, budget: int) -> int:
        waves = group.waves
        done = [False] * len(waves)
        arch, at = self.isa, prog.at
        while not all(done):
            for wi, wave in enumerate(waves):
                if done[wi]:
                    continue
                while True:
                    pc = wave.pc()
                    if pc == ENDPGM_PC:
                        done[wi] = True
                        break
                    entry = at.get(pc) or prog.fetch(pc, arch)
                    fxn, globs, is_barrier, name, _text = entry
                    if executed >= budget:
                        raise KernelStop(prog.offset(pc), entry[4], f"instruction budget ({budget}) spent")
                    fxn(*wave.args(globs))
                    executed += 1
                    counts[name] += 1
                    if is_barrier:
                        break
        return executed

    def opcodes(self, req: dict, image: bytes) -> dict:
        """Every instruction of the kernel's code, decoded in order: mnemonic -> occurrences."""
        prog = Program(req, image)
        counts: Counter = Counter()
        pc, hi = prog.text
        while pc < hi:
            off = pc - prog.host
            try:
                inst = decode_inst(prog.image[off:off + FETCH].ljust(FETCH, b"\0"), self.isa)
            except Exception:  # noqa: BLE001 - padding or data after the last instruction
                pc += 4
                continue
            counts[emu._op_name(inst).lower()] += 1
            pc += inst.size()
        return {"opcodes": dict(counts)}
