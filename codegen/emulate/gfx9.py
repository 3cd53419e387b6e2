"""Our layer over the pinned emulator for GFX9 (gfx906, gfx908): what it gets wrong for
these targets, fixed as data and small handlers applied in the Machine's child at compile time
(child-side: imports the emulator). The emulator decodes CDNA from the CDNA3/4 tables and was
written for RDNA3 first. Each fix has a name and a write-up (codegen.emulate.parts: where, what is
wrong, the corrected rule); `Machine(without=(name,))` leaves it out, which is how the
instruction-level tests show each one matters."""

from __future__ import annotations

import re
from dataclasses import dataclass

from test.mockgpu.amd import emu                     # the pinned emulator (on the child's sys.path)
from tinygrad.dtype import AddrSpace, dtypes
from tinygrad.uop.ops import UOp

from test.mockgpu.amd.pcode import parse_pcode

from codegen.emulate.arena import SCRATCH_APERTURE
from codegen.emulate.parts import FIXES, GFX908_MFMA_NAMES


def _c(v: int, dt=dtypes.uint32) -> UOp:
    return UOp.const(v, dt)


@dataclass(frozen=True)
class Field:
    """Bits [lo, hi] of an instruction (what the emulator's ctx.inst_field reads at run time)."""

    lo: int
    hi: int


# --- mfma ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mfma:
    name: str
    m: int          # output rows = columns (all GFX9 MFMAs are square)
    k: int          # products summed per output
    blocks: int
    src: str        # f32, f16, bf16, i8

    @property
    def per_lane(self) -> int:
        """Input elements a lane holds for A (and for B)."""
        return {"f32": 1, "f16": 4, "bf16": 2, "i8": 4}[self.src]

    @property
    def out_regs(self) -> int:
        return self.blocks * self.m * self.m // 64


def _mfma_table() -> dict[int, Mfma]:
    """Each gfx908 MFMA's shape, read from its mnemonic (v_mfma_<out>_<m>x<n>x<k><src>): a lane holds
    `per_lane` elements, so 64/m lane groups split K (one block) unless K is one lane's worth
    (then each group is a block of its own)."""
    out = {}
    for op, name in GFX908_MFMA_NAMES.items():
        m_, _n, k_, src = re.match(r"v_mfma_[fi]32_(\d+)x(\d+)x(\d+)(f32|f16|bf16|i8)$", name).groups()
        shape = Mfma(name, int(m_), int(k_), 1, src)
        blocks = 64 // shape.m if shape.k == shape.per_lane else 1
        out[op] = Mfma(name, shape.m, shape.k, blocks, src)
    return out


GFX908_MFMA = _mfma_table()          # VOP3P opcode (bits 22:16) -> shape
VOP3P_ENC, MFMA_VDST, MFMA_SRC0, MFMA_SRC1, MFMA_SRC2 = 0x1A7, Field(0, 7), Field(32, 40), Field(41, 49), Field(50, 58)
MFMA_CBSZ, MFMA_ABID, MFMA_ACC_CD, MFMA_BLGP = Field(8, 10), Field(11, 14), Field(15, 15), Field(61, 63)


def mfma_of(raw: bytes) -> Mfma | None:
    """The gfx908 MFMA `raw` encodes, None when it is none."""
    w = int.from_bytes(raw[:4], "little")
    return GFX908_MFMA.get((w >> 16) & 0x7F) if w >> 23 == VOP3P_ENC else None


def _field(raw: bytes, f: Field) -> int:
    return (int.from_bytes(raw[:8].ljust(8, b"\0"), "little") >> f.lo) & ((1 << (f.hi - f.lo + 1)) - 1)


def _elem_f32(raw: UOp, e: int, src: str) -> UOp:
    """Element `e` of a source register as f32 bits (i8: an int32); f16 denormals kept."""
    if src == "f32":
        return raw
    if src == "i8":
        byte = (raw >> _c(8 * e)) & _c(0xFF)
        return (byte.cast(dtypes.int32) ^ _c(0x80, dtypes.int32)) - _c(0x80, dtypes.int32)
    h = (raw >> _c(16 * (e % 2))) & _c(0xFFFF)
    if src == "bf16":
        return h << _c(16)
    sign, exp, mant = (h >> _c(15)) << _c(31), (h >> _c(10)) & _c(0x1F), h & _c(0x3FF)
    normal = sign | ((exp + _c(112)) << _c(23)) | (mant << _c(13))
    special = sign | _c(0x7F800000) | (mant << _c(13))
    tiny = (mant.cast(dtypes.float32) * UOp.const(2.0 ** -24, dtypes.float32)).bitcast(dtypes.uint32) | sign
    return exp.eq(_c(0)).where(tiny, exp.eq(_c(0x1F)).where(special, normal))


def _mfma_sink(op: Mfma, ctx, acc_cd: bool) -> UOp:
    """D = A·B + C for every block by AMD's documented layouts (see the module doc)."""
    m, k, blocks, per = op.m, op.k, op.blocks, op.per_lane
    integer = op.src == "i8"
    acc_dt = dtypes.int32 if integer else dtypes.float32
    exec_mask = ctx.rexec()
    vdst, src0, src1, src2 = (ctx.inst_field(f) for f in (MFMA_VDST, MFMA_SRC0, MFMA_SRC1, MFMA_SRC2))
    n_a = blocks * m * k
    tmp = UOp.placeholder((2 * n_a,), dtypes.uint32, slot=0, addrspace=AddrSpace.LOCAL)
    lane = ctx.range()
    row, grp = lane % _c(m, dtypes.int), lane // _c(m, dtypes.int)
    blk, chunk = (grp, _c(0, dtypes.int)) if blocks > 1 else (_c(0, dtypes.int), grp)
    regs_per_lane = max(1, per * {"f32": 32, "f16": 16, "bf16": 16, "i8": 8}[op.src] // 32)
    stores = []
    for e in range(per):
        kk = chunk * _c(per, dtypes.int) + _c(e, dtypes.int)
        reg_off = e * regs_per_lane // per
        for base, field in ((0, src0), (n_a, src1)):
            raw = ctx.rvgpr_dyn(field - _c(256 - reg_off), lane)
            at = _c(base, dtypes.int) + (blk * _c(m, dtypes.int) + row) * _c(k, dtypes.int) + kk
            stores.append(tmp.index(at).store(_elem_f32(raw, e, op.src).bitcast(dtypes.uint32)))
    read = UOp.group(*stores).end(lane)
    ab = tmp.after(read)
    cl = ctx.range()
    c_read, c_write = (ctx.raccvgpr_dyn, ctx.waccvgpr_dyn) if acc_cd else (ctx.rvgpr_dyn, ctx.wvgpr_dyn)
    src2_vgpr = src2 >= _c(256)
    c_scalar = ctx.rsgpr_dyn(src2, src2_vgpr.ne(True))
    outs = []
    per_block = op.out_regs // blocks if m != 4 else op.out_regs
    for r in range(op.out_regs):
        if m == 4:
            b_i, i, j = cl // _c(4, dtypes.int), _c(r, dtypes.int), cl % _c(4, dtypes.int)
        else:
            rr = r % per_block
            b_i = _c(r // per_block, dtypes.int)
            i = _c(8 * (rr // 4) + rr % 4, dtypes.int) + _c(4, dtypes.int) * (cl // _c(m, dtypes.int)) \
                if m == 32 else _c(4, dtypes.int) * (cl // _c(16, dtypes.int)) + _c(rr, dtypes.int)
            j = cl % _c(m, dtypes.int)
        acc = src2_vgpr.where(c_read(src2 - _c(256 - r), cl, src2_vgpr), c_scalar).bitcast(acc_dt)
        a0 = (b_i * _c(m, dtypes.int) + i) * _c(k, dtypes.int)
        b0 = _c(n_a, dtypes.int) + (b_i * _c(m, dtypes.int) + j) * _c(k, dtypes.int)
        for kk in range(k):
            acc = acc + ab.index(a0 + _c(kk, dtypes.int)).bitcast(acc_dt) * ab.index(b0 + _c(kk, dtypes.int)).bitcast(acc_dt)
        outs.append(c_write(vdst + _c(r), cl, acc.bitcast(dtypes.uint32), exec_mask))
    return UOp.sink(read, UOp.group(*outs).end(cl), *ctx.inc_pc())


class MfmaInst:
    """What the runner needs of an MFMA it decoded from our table (the emulator's Inst has no
    entry for gfx908's bf16 opcodes)."""

    def __init__(self, op: Mfma, raw: bytes, acc_cd: bool):
        self.op, self.raw, self.acc_cd = op, raw, acc_cd
        self.vdst, self.src0, self.src1, self.src2 = (_field(raw, f) for f in (MFMA_VDST, MFMA_SRC0, MFMA_SRC1, MFMA_SRC2))

    def size(self) -> int:
        return 8

    def __repr__(self) -> str:
        n = self.op.out_regs
        def reg(v: int, width: int) -> str:
            return f"v[{v - 256}:{v - 256 + width - 1}]" if v >= 256 else str(v)
        w = max(1, self.op.per_lane * {"f32": 32, "f16": 16, "bf16": 16, "i8": 8}[self.op.src] // 32)
        return (f"{self.op.name} a[{self.vdst}:{self.vdst + n - 1}], {reg(self.src0, w)}, {reg(self.src1, w)}, "
                f"{'a' + reg(self.src2, n)[1:] if self.src2 >= 256 else self.src2}")


def _mfma_unsupported(raw: bytes) -> str | None:
    if any(_field(raw, f) for f in (MFMA_CBSZ, MFMA_ABID, MFMA_BLGP)):
        return "MFMA broadcast controls (cbsz, abid, blgp) are not modelled"
    if _field(raw, MFMA_SRC0) < 256 or _field(raw, MFMA_SRC1) < 256:
        return "an MFMA A or B operand that is not a VGPR"
    return None


# --- cache ------------------------------------------------------------------------------------
GFX9_CACHE_OPS = {62: "buffer_wbinvl1", 63: "buffer_wbinvl1_vol"}   # MUBUF opcodes (bits 24:18) CDNA3 dropped


class CacheInst:
    """A GFX9 L1 cache write-back/invalidate: nothing to do in an emulator without caches."""

    def __init__(self, name: str):
        self.op = type("Op", (), {"name": name.upper()})()

    def size(self) -> int:
        return 8

    def __repr__(self) -> str:
        return self.op.name.lower()


def cache_of(raw: bytes) -> CacheInst | None:
    w = int.from_bytes(raw[:4], "little")
    name = GFX9_CACHE_OPS.get((w >> 18) & 0x7F) if w >> 26 == 0x38 else None
    return CacheInst(name) if name else None


# --- buffer (MUBUF with swizzling: the private segment buffer) ---------------------------------
_MUBUF_WIDTH = {"UBYTE": (1, 8, False), "SBYTE": (1, 8, True), "USHORT": (1, 16, False), "SSHORT": (1, 16, True),
                "BYTE": (1, 8, False), "SHORT": (1, 16, False), "DWORD": (1, 32, False), "DWORDX2": (2, 32, False),
                "DWORDX3": (3, 32, False), "DWORDX4": (4, 32, False)}


def mubuf_width(name: str) -> tuple[int, int, bool] | None:
    """(dwords, bits of each, sign-extended) of a plain MUBUF load or store, None for the others
    (formats, D16, atomics, LDS)."""
    parts = name.split("_")
    if len(parts) != 3 or parts[0] != "BUFFER" or parts[1] not in ("LOAD", "STORE"):
        return None
    return _MUBUF_WIDTH.get(parts[2])


def _u64(x: UOp) -> UOp:
    return x if x.dtype == dtypes.uint64 else x.cast(dtypes.uint64)


def _buffer_address(ctx, inst, lane: UOp) -> tuple[UOp, UOp]:
    """(64-bit address, in range) of a MUBUF access by GFX9's rules: V# base, stride (word1 29:16),
    num_records, swizzle (word3: ADD_TID_ENABLE 23, INDEX_STRIDE 22:21, ELEMENT_SIZE 20:19)."""
    cls = type(inst)
    f = ctx.inst_field
    srsrc, vaddr = f(cls.srsrc) * _c(4), f(cls.vaddr)
    w = [ctx.rsgpr_dyn(srsrc + _c(i)) for i in range(4)]
    base = _u64(w[0]) | (_u64(w[1] & _c(0xFFFF)) << UOp.const(32, dtypes.uint64))
    stride, records = (w[1] >> _c(16)) & _c(0x3FFF), w[2]
    add_tid, istride = (w[3] >> _c(23)) & _c(1), _c(8) << ((w[3] >> _c(21)) & _c(3))
    esize = _c(2) << ((w[3] >> _c(19)) & _c(3))
    idxen, offen = f(cls.idxen), f(cls.offen)
    index = idxen.ne(_c(0)).where(ctx.rvgpr_dyn(vaddr, lane), _c(0)) + add_tid.ne(_c(0)).where(lane.cast(dtypes.uint32), _c(0))
    offset = offen.ne(_c(0)).where(ctx.rvgpr_dyn(vaddr + idxen, lane), _c(0)) + f(cls.offset)
    swz = (((index // istride) * stride + (offset // esize) * esize) * istride + (index % istride) * esize
           + offset % esize)
    buf = add_tid.ne(_c(0)).where(swz, index * stride + offset)
    in_range = stride.eq(_c(0)).where(offset < records, index < records)
    soff = ctx.rsrc_dyn(f(cls.soffset), None)
    return base + _u64(soff) + _u64(buf), in_range


def _read(ctx, addr: UOp, bits: int, scratch: UOp, gate: UOp) -> UOp:
    """`bits` (8, 16, 32) at byte address `addr` of device memory, or of the wave's scratch when
    `scratch` (its bytes at addr - SCRATCH_APERTURE); 0 where `gate` is false."""
    rel = addr - UOp.const(SCRATCH_APERTURE, dtypes.uint64)
    sbytes = [ctx.scratch.index((rel + UOp.const(i, dtypes.uint64)).valid(gate & scratch)).load().cast(dtypes.uint32)
              for i in range(bits // 8)]
    sval = sbytes[0]
    for i, b in enumerate(sbytes[1:], 1):
        sval = sval | (b << _c(8 * i))
    word = ctx.vmem.index((addr >> UOp.const(2, dtypes.uint64)).valid(gate & scratch.logical_not())).load()
    if bits < 32:
        word = (word >> ((addr & UOp.const(3, dtypes.uint64)).cast(dtypes.uint32) * _c(8))) & _c((1 << bits) - 1)
    return scratch.where(sval, word)


def _write(ctx, addr: UOp, val: UOp, bits: int, scratch: UOp, gate: UOp) -> list[UOp]:
    rel = addr - UOp.const(SCRATCH_APERTURE, dtypes.uint64)
    out = [ctx.scratch.index((rel + UOp.const(i, dtypes.uint64)).valid(gate & scratch)).store(
        ((val >> _c(8 * i)) & _c(0xFF)).cast(dtypes.uint8)) for i in range(bits // 8)]
    return out + emu._mem_store(ctx.vmem, addr, val, gate & scratch.logical_not(), 64, bits)


def mubuf_sink(inst, ctx) -> UOp:
    """A MUBUF load or store by GFX9's buffer addressing, swizzled ones included (the private
    segment buffer LLVM spills through); a V# in the scratch aperture reaches the wave's scratch."""
    dwords, bits, signed = mubuf_width(emu._op_name(inst))
    store = "STORE" in emu._op_name(inst)
    exec_mask, lane = ctx.rexec(), ctx.range()
    addr, in_range = _buffer_address(ctx, inst, lane)
    scratch = (addr >= UOp.const(SCRATCH_APERTURE, dtypes.uint64)) & (addr < UOp.const(SCRATCH_APERTURE + (1 << 40), dtypes.uint64))
    gate = emu._lane_active(exec_mask, lane) & in_range
    vdata = ctx.inst_field(type(inst).vdata)
    acc = bool(emu._iattr(inst, "acc"))
    read_reg, write_reg = (ctx.raccvgpr_dyn, ctx.waccvgpr_dyn) if acc else (ctx.rvgpr_dyn, ctx.wvgpr_dyn)
    stores = []
    for i in range(dwords):
        a = addr + UOp.const(4 * i, dtypes.uint64)
        if store:
            stores += _write(ctx, a, read_reg(vdata + _c(i), lane), bits, scratch, gate)
            continue
        v = _read(ctx, a, bits, scratch, gate)
        if signed:
            v = (v ^ _c(1 << (bits - 1))) - _c(1 << (bits - 1))
        stores.append(write_reg(vdata + _c(i), lane, v, exec_mask))
    return UOp.sink(UOp.group(*stores).end(lane), *ctx.inc_pc())


# --- true16 ----------------------------------------------------------------------------------
def no_true16(inst, ctx, sink: UOp) -> UOp:
    """On GFX9 a VOP1/VOP2/VOPC field >= 128 (src0 >= 384) is v128-v255, never a high half:
    every `field >= 128` the emulator's handlers test is made false."""
    cls = type(inst)
    subs = {}
    for name, limit in (("vdst", 128), ("vsrc1", 128), ("src0", 384)):
        f = getattr(cls, name, None)
        if f is not None and hasattr(f, "lo"):
            subs[ctx.inst_field(f) < _c(limit)] = UOp.const(True, dtypes.bool)
    return sink.substitute(subs) if subs else sink


def is_16bit_vop(inst) -> bool:
    kinds = tuple(getattr(emu.irc, n) for n in ("VOP1", "VOP2", "VOPC", "VOP1_DPP16", "VOP2_DPP16"))
    try:
        return isinstance(inst, kinds) and 16 in inst.canonical_op_bits.values()
    except Exception:  # noqa: BLE001 - an op without operand widths
        return False


# --- dpp -------------------------------------------------------------------------------------
def _dpp_src0(ctx, inst, lane: UOp, fallback: UOp) -> UOp:
    src_lane, enabled, valid = emu._dpp16_ctrl(lane, emu._iattr(inst, "dpp"), emu._iattr(inst, "row_mask", 0xF),
                                               emu._iattr(inst, "bank_mask", 0xF), ctx.wave_size)
    safe = (enabled & valid).where(src_lane, _c(0, dtypes.int))
    snap = UOp.placeholder((64,), dtypes.uint32, slot=1, addrspace=AddrSpace.LOCAL)
    rl = ctx.range()
    staged = snap.after(snap.index(rl).store(ctx.rvgpr_dyn(ctx.inst_field(type(inst).vsrc0), rl)).end(rl))
    swizzled = staged.index(safe)
    invalid = UOp.const(0, fallback.dtype) if emu._iattr(inst, "bc") else fallback
    return enabled.where(valid.where(swizzled, invalid), fallback)


def dpp_write_mask(inst) -> int:
    """The lanes a DPP instruction writes: its row and bank enabled, its source in range or
    bound_ctrl set (computed from the static controls, lane by lane)."""
    bc = emu._iattr(inst, "bc")
    mask = 0
    for lane in range(64):
        src, enabled, valid = emu._dpp16_ctrl(_c(lane, dtypes.int), emu._iattr(inst, "dpp"),
                                              emu._iattr(inst, "row_mask", 0xF), emu._iattr(inst, "bank_mask", 0xF), 64)
        ok = enabled.simplify().arg and (bc or valid.simplify().arg)
        mask |= int(bool(ok)) << lane
    return mask


# --- pc --------------------------------------------------------------------------------------
PC_OPS = ("S_GETPC_B64", "S_SETPC_B64", "S_SWAPPC_B64", "S_CALL_B64")


def pc_sink(inst, ctx) -> UOp:
    """A scalar op whose pseudocode reads or writes PC (PC: this instruction's address)."""
    name = emu._op_name(inst)
    pc = ctx.rpc()
    srcs: dict = {"PC": pc.cast(dtypes.int64)}
    if name == "S_CALL_B64":
        sdst = ctx.inst_field(type(inst).sdst)
        srcs["SIMM16"] = ctx.inst_field(type(inst).simm16).cast(dtypes.int16).cast(dtypes.int32)
    else:
        sdst = ctx.inst_field(type(inst).sdst) if name != "S_SETPC_B64" else None
        srcs["S0"] = ctx.rsrc_dyn(ctx.inst_field(type(inst).ssrc0), None, 64)
    stores, new_pc = [], None
    for dest, val in parse_pcode(emu.get_pcode(inst.op), srcs)[1]:
        if dest == "PC" or dest.startswith("PC."):
            new_pc = val.cast(dtypes.uint64)
        elif dest.startswith("D0") and sdst is not None:
            lo, hi = emu._split64(val.cast(dtypes.uint64))
            stores += [ctx.wsgpr_dyn(sdst, lo), ctx.wsgpr_dyn(sdst + _c(1), hi)]
    if new_pc is None:
        return UOp.sink(*stores, *ctx.inc_pc())
    lo, hi = emu._split64(new_pc)
    return UOp.sink(*stores, ctx.wsgpr_dyn(_c(emu.PC_LO_IDX), lo), ctx.wsgpr_dyn(_c(emu.PC_HI_IDX), hi))


# --- ds_swizzle -------------------------------------------------------------------------------
def swizzle_sink(inst, ctx) -> UOp:
    """ds_swizzle_b32 (GFX9 ISA): offset[15] set: each lane of a quad takes lane offset[2i+1:2i] of
    its quad; else within 32 lanes, source = ((lane & and_mask) | or_mask) ^ xor_mask, the masks
    offset[4:0], offset[9:5], offset[14:10]. A source lane EXEC leaves out gives 0."""
    offset = emu._iattr(inst, "offset0") | (emu._iattr(inst, "offset1") << 8)
    exec_mask = ctx.rexec()
    vdst, addr = ctx.inst_field(type(inst).vdst), ctx.inst_field(type(inst).addr)
    snap = UOp.placeholder((64,), dtypes.uint32, slot=1, addrspace=AddrSpace.LOCAL)
    rl = ctx.range()
    staged = snap.after(snap.index(rl).store(ctx.rvgpr_dyn(addr, rl)).end(rl))
    lane = ctx.range()
    if offset & 0x8000:
        sel = [(offset >> (2 * i)) & 3 for i in range(4)]
        q = lane % _c(4, dtypes.int)
        pick = q.eq(_c(1, dtypes.int)).where(_c(sel[1], dtypes.int), q.eq(_c(2, dtypes.int)).where(
            _c(sel[2], dtypes.int), q.eq(_c(3, dtypes.int)).where(_c(sel[3], dtypes.int), _c(sel[0], dtypes.int))))
        src = (lane - q) + pick
    else:
        and_m, or_m, xor_m = offset & 0x1F, (offset >> 5) & 0x1F, (offset >> 10) & 0x1F
        low = ((lane & _c(0x1F, dtypes.int) & _c(and_m, dtypes.int)) | _c(or_m, dtypes.int)) ^ _c(xor_m, dtypes.int)
        src = (lane & _c(0x20, dtypes.int)) | low
    val = emu._lane_active(exec_mask, src).where(staged.index(src), _c(0))
    return UOp.sink(ctx.wvgpr_dyn(vdst, lane, val, exec_mask).end(lane), *ctx.inc_pc())


# --- permute -----------------------------------------------------------------------------------
def bpermute_sink(inst, ctx) -> UOp:
    """ds_bpermute_b32 (GFX9 ISA): lane i takes DATA0 of lane ((ADDR[i] + offset) / 4) % 64, the
    address's bits above 7 ignored; 0 where that lane is off in EXEC. The emulator's pseudocode
    says `% 64U` but its evaluation reads lanes past 63 (another register's lanes), and the kernels
    Triton 3.5.1 builds pass workgroup-wide byte offsets (thread id * 4 ^ 128): their reductions
    over 2 and 4 waves came out wrong."""
    offset = emu._iattr(inst, "offset0") | (emu._iattr(inst, "offset1") << 8)
    exec_mask = ctx.rexec()
    vdst, addr, data0 = (ctx.inst_field(type(inst).vdst), ctx.inst_field(type(inst).addr),
                         ctx.inst_field(type(inst).data0))
    snap = UOp.placeholder((64,), dtypes.uint32, slot=1, addrspace=AddrSpace.LOCAL)
    rl = ctx.range()
    staged = snap.after(snap.index(rl).store(ctx.rvgpr_dyn(data0, rl)).end(rl))
    lane = ctx.range()
    src = (((ctx.rvgpr_dyn(addr, lane) + _c(offset)) >> _c(2)) & _c(63)).cast(dtypes.int)
    val = emu._lane_active(exec_mask, src).where(staged.index(src), _c(0))
    return UOp.sink(ctx.wvgpr_dyn(vdst, lane, val, exec_mask).end(lane), *ctx.inc_pc())


# --- mix ---------------------------------------------------------------------------------------
MIX_OPS = ("V_MAD_MIX_F32", "V_MAD_MIXLO_F16", "V_MAD_MIXHI_F16")


def mix_sink(inst, ctx) -> UOp:
    """v_fma_mix_f32, v_fma_mixlo_f16, v_fma_mixhi_f16 (GFX9; decoded by CDNA3's names v_mad_mix*):
    an inline float constant is read as f32 where the operand's op_sel_hi bit takes it as f32 (bit
    clear) and as f16 where it is set. The emulator reads every VOP3P constant as f16, so
    `v_fma_mixlo_f16 v1, v0, 1.0, 0` (how Triton converts f32 to f16) gave +-0. Otherwise the
    emulator's own handling: neg negates, neg_hi takes the absolute value, of the selected half."""
    lane = ctx.range()
    exec_mask = ctx.rexec()
    opsel, neg, neg_hi = emu._iattr(inst, "opsel"), emu._iattr(inst, "neg"), emu._iattr(inst, "neg_hi")
    hi = (emu._iattr(inst, "opsel_hi", 3) & 3) | ((emu._iattr(inst, "opsel_hi2", 1) & 1) << 2)
    srcs: dict = {}
    for i, field in enumerate(("src0", "src1", "src2")):
        bit = 1 << i
        v = ctx.rsrc_dyn(ctx.inst_field(getattr(type(inst), field)), lane, 16 if hi & bit else 32, do_cast=True)
        sign = 0x80000000 if not hi & bit or opsel & bit else 0x8000   # of the f32, or of the f16 half used
        if neg_hi & bit:
            v = v & _c(0xFFFFFFFF ^ sign)
        if neg & bit:
            v = v ^ _c(sign)
        srcs[f"S@{i}"] = v
    srcs.update(OPSEL_HI=_c(hi), OPSEL=_c(opsel))
    return ctx.compile_vop_pcode(inst.op, srcs, lane, ctx.inst_field(type(inst).vdst), exec_mask)


# --- the layer ---------------------------------------------------------------------------------
class Layer:
    """The fixes of one arch, minus those `without` names, as the runner asks for them."""

    def __init__(self, arch: str, without: frozenset[str] = frozenset()):
        self.arch, self.on = arch, frozenset(FIXES) - without
        self.version = f"{arch}:{','.join(sorted(self.on))}"

    def decode(self, raw: bytes):
        """Our decoding of `raw` when the layer owns it (a gfx908 MFMA, a GFX9 cache op), else None."""
        if "cache" in self.on and (inst := cache_of(raw)) is not None:
            return inst
        if "mfma" not in self.on or self.arch != "gfx908":
            return None
        op = mfma_of(raw)
        return MfmaInst(op, raw, True) if op is not None else None

    def handler(self, inst):
        """A compile function (inst, ctx) -> sink replacing the emulator's, or None."""
        if isinstance(inst, CacheInst):
            return lambda i, ctx: UOp.sink(*ctx.inc_pc())
        if isinstance(inst, MfmaInst):
            why = _mfma_unsupported(inst.raw)
            if why:
                raise NotImplementedError(why)
            return lambda i, ctx: _mfma_sink(i.op, ctx, i.acc_cd)
        name = emu._op_name(inst) if hasattr(inst, "op") else ""
        if "pc" in self.on and name in PC_OPS:
            return pc_sink
        if "ds_swizzle" in self.on and name == "DS_SWIZZLE_B32":
            return swizzle_sink
        if "hwreg" in self.on and name in ("S_GETREG_B32", "S_SETREG_B32", "S_SETREG_IMM32_B32"):
            raise NotImplementedError(f"{name.lower()}: hardware registers are not modelled")
        if "buffer" in self.on and isinstance(inst, emu.irc.MUBUF) and not emu._iattr(inst, "lds"):
            if mubuf_width(name) is not None:
                return mubuf_sink
            if "ATOMIC" in name:
                raise NotImplementedError(f"{name.lower()}: MUBUF atomics are not modelled")
        if "permute" in self.on and name == "DS_BPERMUTE_B32":
            return bpermute_sink
        if "mix" in self.on and name in MIX_OPS:
            return mix_sink
        return None

    def prepare(self, inst) -> None:
        """Attributes the emulator's handlers read under RDNA's names: GFX9's glc (bit 16 of
        FLAT/GLOBAL, bit 14 of MUBUF) is CDNA3's sc0, and the emulator's atomics return the
        pre-op value only when they find `glc` (Triton's atomic counters loop forever without)."""
        if "glc" in self.on and hasattr(inst, "sc0") and "ATOMIC" in emu._op_name(inst):
            inst.glc = inst.sc0

    def rewrite(self, inst, ctx, sink: UOp) -> UOp:
        if "true16" in self.on and is_16bit_vop(inst):
            sink = no_true16(inst, ctx, sink)
        return sink

    def exec_mask(self, inst) -> int | None:
        """Lanes an instruction may write beyond EXEC's say (DPP's row, bank and bound rules)."""
        if "dpp" in self.on and hasattr(type(inst), "dpp") and hasattr(type(inst), "vsrc0"):
            return dpp_write_mask(inst)
        return None

    def install(self) -> None:
        """The fixes that replace an emulator function for the whole child."""
        if "dpp" in self.on:
            emu._load_dpp16_src0 = _dpp_src0

    def flush_denormals(self, rsrc1: int) -> bool:
        """Whether f32 denormals flush for a kernel (FLOAT_DENORM_MODE_32, rsrc1 bits 17:16: 3 keeps
        them; the others flush a source or a result, which the host's FTZ/DAZ approximates)."""
        return "denorm" not in self.on or ((rsrc1 >> 16) & 3) != 3
