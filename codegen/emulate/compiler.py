"""Compiling one instruction in the Machine's child (child-side: imports the emulator).

The pinned emulator's path (`emu._get_runner`: decode, the handler of the instruction's format,
its tinygrad kernel, clang) with our layer in it: the arch layer decodes what the emulator's CDNA
tables do not know (codegen.emulate.gfx9), replaces or rewrites handlers, then every kernel is
bounded (codegen.emulate.guard) before clang sees it. Instructions that differ only in fields
read at run time (registers, offsets) share one compiled kernel, as in the emulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from test.mockgpu.amd import emu                     # the pinned emulator (on the child's sys.path)
from tinygrad.codegen import to_program
from tinygrad.device import Device, TinyELF
from tinygrad.dtype import dtypes
from tinygrad.engine.realize import get_runtime
from tinygrad.helpers import Context
from tinygrad.renderer.amd import decode_inst
from tinygrad.uop.ops import KernelInfo, UOp

from codegen.emulate import guard
from codegen.emulate.gfx9 import Layer
from codegen.emulate.icache import InstructionCache

REG_WORDS = {guard.SGPR: emu.SGPR_COUNT, guard.VGPR: 256 * 64, guard.ACC: 256 * 64}


class Unsupported(Exception):
    """An instruction the emulator (or our layer) cannot compile."""


@dataclass(frozen=True)
class Compiled:
    fxn: Callable
    globals: tuple[int, ...]
    is_barrier: bool
    name: str        # mnemonic, lower case
    text: str        # the instruction as decoded, for fault reports
    size: int


class _MaskedCtx(emu._Ctx):
    """A compile context whose EXEC reads are narrowed to `lanes` (DPP's write rules)."""

    __slots__ = ()
    lanes = (1 << 64) - 1

    def rexec(self) -> UOp:
        return emu._Ctx.rexec(self) & UOp.const(type(self).lanes, dtypes.uint64)


class Compiler:
    """Decoded and compiled instructions of one child, shared by every kernel it runs."""

    def __init__(self, layer: Layer, isa: str = "cdna", bounded: bool = True, cache: InstructionCache | None = None):
        self.layer, self.isa, self.bounded, self.cache = layer, isa, bounded, cache
        self._shared: dict[str, list[tuple[int, int, tuple]]] = {}   # kind -> [(base, mask, entry)]
        self._disk = cache.index() if cache is not None else {}
        self._keep: list = []        # the loaded objects' owners (their code is unmapped when they go)
        self.compiled = self.loaded = 0
        layer.install()

    def decode(self, raw: bytes):
        """The instruction `raw` begins with (ValueError when it is no instruction)."""
        return self.layer.decode(raw) or decode_inst(raw, self.isa)

    def compile(self, raw: bytes, inst) -> Compiled:
        size = inst.size()
        word = int.from_bytes(raw[:size], "little")
        kind = f"{type(inst).__name__}:{getattr(getattr(inst, 'op', None), 'name', '')}:{size}"
        for base, mask, entry in self._shared.get(kind, ()):
            if word & mask == base:
                return Compiled(*entry, text=repr(inst), size=size)
        for base, mask, globs, barrier, name in self._disk.get(kind, ()):
            if word & mask == base and (lib := self.cache.lib(kind, base, mask)) is not None:
                runtime = Device["CPU"].runtime(TinyELF(lib, f"{name}_{base:0{2 * size}x}", Device["CPU"].renderer.target, ()))
                self._keep.append(runtime)
                entry = (runtime.fxn, globs, barrier, name)
                self._shared.setdefault(kind, []).append((base, mask, entry))
                self.loaded += 1
                return Compiled(*entry, text=repr(inst), size=size)
        self.layer.prepare(inst)
        handler = self.layer.handler(inst)
        if handler is None:
            handler = emu._INST_HANDLERS.get(type(inst)) or next(
                (emu._INST_HANDLERS[c] for c in type(inst).__mro__ if c in emu._INST_HANDLERS), None)
        if handler is None:
            raise Unsupported(f"the emulator has no handler for {type(inst).__name__}")
        ctx = emu._Ctx(size, 64)
        lanes = self.layer.exec_mask(inst)
        if lanes is not None:
            _MaskedCtx.lanes = lanes
            ctx.__class__ = _MaskedCtx
        sink = self.layer.rewrite(inst, ctx, handler(inst, ctx))
        sink = guard.guard(sink, REG_WORDS, self.bounded)
        base, mask, _ = ctx.canonical_mask(raw[:size])
        name = _mnemonic(inst)
        sink = sink.replace(arg=KernelInfo(name=f"{name}_{base:0{2 * size}x}")).rtag(1)
        with Context(NOOPT=1, CHECK_OOB=0, TUPLE_ORDER=0, EMULATED_DTYPES="", CAPTURE_PROCESS_REPLAY=0, PROFILE=0):
            prg = to_program(sink, Device["CPU"].renderer)
            runtime = get_runtime("CPU", prg)
        is_barrier = isinstance(inst, emu.irc.SOPP) and inst.op in emu._BARRIER_OPS
        entry = (runtime.fxn, tuple(prg.arg.globals), is_barrier, name)
        self._shared.setdefault(kind, []).append((base, mask, entry))
        self.compiled += 1
        if self.cache is not None:
            self.cache.put(kind, base, mask, entry[1], is_barrier, name, prg.to_elf().lib)
        return Compiled(*entry, text=repr(inst), size=size)


def _mnemonic(inst) -> str:
    return emu._op_name(inst).lower()
