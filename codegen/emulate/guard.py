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

An access is made only under the condition its value is used (`_demands`: the emulator computes
addresses and reads memory for every lane, then drops what inactive lanes read or writes their
old value back), so an inactive lane's garbage address is no fault. An access in a loop closed by a REDUCE (a compare's lane mask) is
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


_ALWAYS = None          # a demand: the condition under which a node's value is used (None: always)
_MAX_TERMS = 8          # a demand of more OR'ed conditions counts as always


def _and(a: UOp | None, b: UOp | None) -> UOp | None:
    return b if a is None else a if b is None else a & b


def _or(terms: list[UOp]) -> UOp | None:
    if not terms or len(terms) > _MAX_TERMS:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = out | t
    return out


def _index_gate(x: UOp) -> UOp | None:
    v = x.src[1] if x.op is Ops.INDEX and len(x.src) == 2 else None
    return v.src[0] if v is not None and v.op is Ops.WHERE and v.src[2].is_invalid else None


def _write_back(store: UOp, users: dict[UOp, list[UOp]]) -> UOp | None:
    """c of `STORE(x, WHERE(c, v, x))` (x or a load of x in the else branch): the emulator writes
    the old value back for the lanes c leaves out, a store that changes nothing there."""
    x, val = store.src[0], store.src[1] if len(store.src) == 2 else None
    if val is None or val.op is not Ops.WHERE:
        return None
    old = val.src[2]
    return val.src[0] if old is x or (old.op is Ops.LOAD and old.src[0] is x) else None


def _demands(nodes: list[UOp], users: dict[UOp, list[UOp]]) -> dict[UOp, UOp | None]:
    """For each node, the condition under which its value is used (last node first): a WHERE
    branch under its condition, a stored value under its store's gate, anything else under what
    its users are. An access may then be made only under its demand: the emulator computes
    every lane's address, active or not, and reads memory for lanes whose value it then drops."""
    dem: dict[UOp, UOp | None] = {}
    for n in reversed(nodes):
        terms: list[UOp] = []
        always = not users.get(n)
        for c in users.get(n, []):
            if c.op is Ops.WHERE and c.src[0] is not n and (c.src[1] is n) != (c.src[2] is n):
                cond = c.src[0] if c.src[1] is n else c.src[0].logical_not()
                if c.src[2] is n and any(w.op is Ops.STORE and _write_back(w, users) is not None for w in users.get(c, [])):
                    cond = c.src[0]   # the old value of a write-back: needed where the store writes
                g = _and(dem.get(c), cond)
            elif c.op is Ops.STORE and len(c.src) > 1 and c.src[1] is n and c.src[0] is not n:
                wb = _write_back(c, users)
                g = wb if wb is not None else _index_gate(c.src[0])
            elif c.op in (Ops.SINK, Ops.GROUP, Ops.END, Ops.STORE, Ops.RANGE, Ops.AFTER, Ops.BARRIER):
                g = None
            else:
                g = dem.get(c)
            if g is None:
                always = True
                break
            terms.append(g)
        dem[n] = None if always else _or(terms)
    return dem


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
        self.demand = _demands(nodes, self.users)
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

    def _store_gate(self, x: UOp) -> UOp | None:
        """The write-back condition when `x` is the target of the emulator's read-modify-write
        store (`STORE(x, WHERE(c, v, x))`), and all of x's stores are such."""
        stores = [u for u in self.users.get(x, []) if u.op is Ops.STORE and u.src[0] is x]
        gates = [_write_back(s, self.users) for s in stores]
        return _or(gates) if stores and all(g is not None for g in gates) else None

    def _index(self, n: UOp, srcs: tuple[UOp, ...]) -> UOp | None:
        slot = _slot(n)
        gate, idx = srcs[1].get_valid(), srcs[1].get_idx()
        checked = _check(slot, idx, self.sizes)
        if checked is None:
            return None
        if not self.bounded:   # device addresses translated, nothing checked
            return n.replace(src=(srcs[0], checked[0].valid(gate))) if slot == VMEM else None
        extra = self._store_gate(n)
        extra = _and(self.demand.get(n), extra) if extra is not None or self.demand.get(n) is not None else None
        if extra is not None and (set(extra.ranges) - set(n.ranges) or set(extra.toposort()) & self.busy):
            extra = None      # a condition of other loops, or one made of this access itself: none
        if extra is not None:
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
