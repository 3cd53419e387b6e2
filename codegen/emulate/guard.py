"""Bounds on every access a compiled instruction makes (child-side; imports tinygrad).

The pinned emulator compiles each instruction to a tinygrad kernel whose buffers are the wave's
register files, device memory (its `vmem`: all of the host's memory from address 0), the LDS and
the scratch. `guard(sink)` rewrites that kernel before it is compiled so that:

- device memory is the arena only: a word index `w` becomes `w - base` and is valid only when it
  is below the arena's size (both read from the control buffer, so one compiled instruction serves
  any arena); the buffer the kernel is handed is the arena's mapping in the child;
- an LDS index is valid only below the workgroup's LDS size, a scratch index only below the wave's
  scratch size, a register index only inside its file (when its bounds are not known statically);
- an access that is not valid is not made (a load reads 0, a store is dropped) and, where the
  access is made by one lane of a lane loop or by the instruction itself, a fault record (kind,
  lane, address) is stored in the control buffer, which the runner checks after each instruction.

Accesses made only for lanes a WHERE leaves unused (the emulator's read-modify-write of inactive
lanes, a buffer access out of its range) take that condition as their gate, so an inactive lane's
garbage address is no fault. An access in a loop closed by a REDUCE (a compare's lane mask) is
made safe but not reported: those read registers at static indices (checked at decode)."""

from __future__ import annotations

from tinygrad.dtype import dtypes
from tinygrad.uop.ops import Ops, UOp

# buffer slots of a compiled instruction (the emulator's 0-5, ours 6-7)
SGPR, VGPR, VMEM, LDS, SCRATCH, ACC, CTL, CODE = range(8)
# control buffer words
ARENA_BASE, ARENA_WORDS, LDS_WORDS, SCRATCH_BYTES = 0, 2, 4, 5      # base and words: 2 words each (lo, hi)
FAULT, FAULT_LANE, FAULT_ADDR = 8, 9, 10                             # FAULT_ADDR: lo, hi
CTL_WORDS = 16
KINDS = {VMEM: 1, LDS: 2, SCRATCH: 3, SGPR: 4, VGPR: 5, ACC: 6}
REASONS = {1: "out of arena", 2: "out of LDS", 3: "out of scratch", 4: "SGPR index out of the register file",
           5: "VGPR index out of the register file", 6: "AGPR index out of the register file"}
NO_LANE = 0xFFFFFFFF

_ctl = UOp.param(CTL, dtypes.uint32, (CTL_WORDS,))


def _u64(x: UOp) -> UOp:
    return x if x.dtype == dtypes.uint64 else x.cast(dtypes.uint64)


def _ctl_u64(word: int) -> UOp:
    return _u64(_ctl.index(UOp.const(word, dtypes.int)).load()) | (
        _u64(_ctl.index(UOp.const(word + 1, dtypes.int)).load()) << UOp.const(32, dtypes.uint64))


def _ctl_u32(word: int) -> UOp:
    return _u64(_ctl.index(UOp.const(word, dtypes.int)).load())


def _slot(u: UOp) -> int | None:
    buf = u.src[0]
    return buf.arg.slot if buf.op is Ops.PARAM and len(u.src) == 2 else None


def _consumers(nodes: list[UOp]) -> dict[UOp, list[UOp]]:
    out: dict[UOp, list[UOp]] = {}
    for n in nodes:
        for s in n.src:
            out.setdefault(s, []).append(n)
    return out


def _use_gate(x: UOp, users: dict[UOp, list[UOp]]) -> UOp | None:
    """A condition every use of the access `x` is under (None: some use is unconditional): a
    WHERE branch reads it only under its condition; `STORE(x, WHERE(c, v, x))` writes only under c."""
    views = (x, *[u for u in users.get(x, []) if u.op is Ops.LOAD and u.src[0] is x])
    gates: list[UOp] = []
    for view in views:
        for u in users.get(view, []):
            if u.op is Ops.LOAD and view is x:
                continue
            if u.op is Ops.STORE and u.src[0] is x:
                val = u.src[1] if len(u.src) == 2 else None
                if val is None or val.op is not Ops.WHERE or val.src[2] not in views:
                    return None
                gates.append(val.src[0])
            elif u.op is Ops.WHERE and u.src[0] is not view and (u.src[1] is view) != (u.src[2] is view):
                if u.src[2] is view and any(w.op is Ops.STORE and w.src[0] is x for w in users.get(u, [])):
                    continue   # the write-back of a conditional store: the store's own gate
                gates.append(u.src[0] if u.src[1] is view else u.src[0].logical_not())
            else:
                return None
    if not gates:
        return None
    g = gates[0]
    for more in gates[1:]:
        g = g | more
    return g


def _check(slot: int, idx: UOp, sizes: dict[int, int]) -> tuple[UOp, UOp, UOp] | None:
    """(new index, in-bounds, byte address) of an access to buffer `slot`, None when its bounds
    hold statically."""
    if slot in (SGPR, VGPR, ACC):
        if 0 <= idx.vmin and idx.vmax < sizes[slot]:
            return None
        w = _u64(idx)
        return idx, w < UOp.const(sizes[slot], dtypes.uint64), w
    w = _u64(idx)
    if slot == VMEM:
        rel = w - _ctl_u64(ARENA_BASE)
        return rel, rel < _ctl_u64(ARENA_WORDS), w << UOp.const(2, dtypes.uint64)
    if slot == LDS:
        return w, w < _ctl_u32(LDS_WORDS), w << UOp.const(2, dtypes.uint64)
    return w, w < _ctl_u32(SCRATCH_BYTES), w   # SCRATCH: a byte buffer


def _fault_stores(kind: int, bad: UOp, lane: UOp | None, addr: UOp) -> list[UOp]:
    def put(word: int, val: UOp) -> UOp:
        return _ctl.index(UOp.const(word, dtypes.int).valid(bad)).store(val.cast(dtypes.uint32))
    lane_v = lane.cast(dtypes.uint32) if lane is not None else UOp.const(NO_LANE, dtypes.uint32)
    return [put(FAULT, UOp.const(kind, dtypes.uint32)), put(FAULT_LANE, lane_v),
            put(FAULT_ADDR, addr & UOp.const(0xFFFFFFFF, dtypes.uint64)),
            put(FAULT_ADDR + 1, addr >> UOp.const(32, dtypes.uint64))]


class _Rebuild:
    """One pass over an instruction's kernel, depth first, each node once (see `guard`)."""

    def __init__(self, sink: UOp, sizes: dict[int, int], bounded: bool):
        self.sizes, self.bounded = sizes, bounded
        nodes = list(sink.toposort())
        self.users = _consumers(nodes)
        self.ends = {n.src[1]: n for n in nodes if n.op is Ops.END and len(n.src) == 2}
        self.new: dict[UOp, UOp] = {}
        self.busy: set[UOp] = set()
        self.pending: dict[UOp | None, list[UOp]] = {}   # an END's range (None: the sink) -> fault stores

    def __call__(self, n: UOp) -> UOp:
        got = self.new.get(n)
        if got is not None:
            return got
        self.busy.add(n)
        srcs = tuple(self(s) for s in n.src)
        out = self._index(n, srcs) if n.op is Ops.INDEX and _slot(n) in KINDS else None
        if out is None:
            if n.op is Ops.END and len(n.src) == 2 and n.src[1] in self.pending:
                body, more = srcs[0], tuple(self.pending.pop(n.src[1]))
                body = body.replace(src=body.src + more) if body.op in (Ops.SINK, Ops.GROUP) else UOp.group(body, *more)
                srcs = (body, srcs[1])
            if n.op is Ops.SINK and None in self.pending:
                srcs = srcs + tuple(self.pending.pop(None))
            out = n.replace(src=srcs) if srcs != n.src else n
        self.busy.discard(n)
        self.new[n] = out
        return out

    def _index(self, n: UOp, srcs: tuple[UOp, ...]) -> UOp | None:
        slot = _slot(n)
        gate, idx = srcs[1].get_valid(), srcs[1].get_idx()
        checked = _check(slot, idx, self.sizes)
        if checked is None:
            return None
        if not self.bounded:   # device addresses translated, nothing checked
            return n.replace(src=(srcs[0], checked[0].valid(gate))) if slot == VMEM else None
        extra = _use_gate(n, self.users)
        if extra is not None and not (set(extra.toposort()) & self.busy):
            extra = self(extra)
            gate = extra if gate.op is Ops.CONST and gate.arg is True else gate & extra
        rel, inb, addr = checked
        rngs = list(n.ranges)
        where = rngs[0] if len(rngs) == 1 and rngs[0] in self.ends else None if not rngs else False
        if where is not False:
            self.pending.setdefault(where, []).extend(_fault_stores(KINDS[slot], gate & inb.logical_not(), where, addr))
        return n.replace(src=(srcs[0], rel.valid(gate & inb)))


def guard(sink: UOp, sizes: dict[int, int], bounded: bool = True) -> UOp:
    """`sink` with every access to a guarded buffer bounded (see the module doc); `sizes` gives
    the register files' sizes in words. `bounded=False` only translates device addresses into the
    arena (the test that shows the bounds matter)."""
    return _Rebuild(sink, sizes, bounded)(sink)
