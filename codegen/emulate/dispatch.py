"""The state a gfx9 dispatch gives each wave before its first instruction (LLVM AMDGPUUsage,
"Initial Kernel Execution State"): the user SGPRs the descriptor's kernel_code_properties enables
(private segment buffer, dispatch and queue pointers, kernarg pointer, dispatch id, flat scratch,
private segment size), then the system SGPRs COMPUTE_PGM_RSRC2 enables (workgroup id x/y/z,
workgroup info, scratch wave offset), EXEC for the wave's lanes, and the work-item ids in v0, v1,
v2 (GFX9 before gfx90a: one VGPR each, not packed). Child-side (it is handed the emulator's module)."""

from __future__ import annotations

import ctypes
import itertools

from codegen.emulate.arena import SCRATCH_APERTURE

# kernel_code_properties bits -> user SGPRs they take, in order
USER_SGPRS = ((0, "private_segment_buffer", 4), (1, "dispatch_ptr", 2), (2, "queue_ptr", 2),
              (3, "kernarg_segment_ptr", 2), (4, "dispatch_id", 2), (5, "flat_scratch_init", 2),
              (6, "private_segment_size", 1))
RSRC2_SCRATCH_EN = 1 << 0
RSRC2_USER_SGPR_SHIFT, RSRC2_USER_SGPR_MASK = 1, 0x1F
RSRC2_TGID = (1 << 7, 1 << 8, 1 << 9)
RSRC2_TG_SIZE = 1 << 10
RSRC2_TIDIG_SHIFT, RSRC2_TIDIG_MASK = 11, 0x3
RSRC2_LDS_SHIFT, RSRC2_LDS_MASK = 15, 0x1FF
MASK32 = 0xFFFFFFFF
# the V# of the private segment buffer: base SCRATCH_APERTURE (each wave's own scratch: the wave
# offset SGPR is 0), num_records all ones, swizzled: ADD_TID_ENABLE, index stride 64, element 4 bytes
PRIVATE_SEGMENT_BUFFER = SCRATCH_APERTURE | (MASK32 << 64) | (((1 << 23) | (3 << 21) | (1 << 19)) << 96)


class Wave:
    """One wave's register files and the pointers its compiled instructions take."""

    def __init__(self, emu, lanes: int, bufs: dict[int, int]):
        self.st = emu.WaveState(lanes, 64)
        self.bufs = dict(bufs)
        self.bufs.update({0: self.st.sgpr_buf._buf.va_addr, 1: self.st.vgpr_buf._buf.va_addr,
                          5: self.st.accvgpr_buf._buf.va_addr})
        self._args: dict[tuple, tuple] = {}
        self._pc = emu.PC_LO_IDX

    def pc(self) -> int:
        mv = self.st._sgpr_mv
        return mv[self._pc] | (mv[self._pc + 1] << 32)

    def args(self, globs: tuple) -> tuple:
        got = self._args.get(globs)
        if got is None:
            got = self._args[globs] = tuple(ctypes.c_uint64(self.bufs[g]) for g in globs)
        return got


class Group:
    def __init__(self, waves: list[Wave]):
        self.waves = waves


class Dispatch:
    """The launch `req` (see codegen.emulate.machine) as workgroups of initialised waves."""

    def __init__(self, req: dict, emu, entry: int, bufs: dict[int, int]):
        self.req, self.emu, self.entry = req, emu, entry
        self.grid, self.block = tuple(req["grid"]), tuple(req["block"])
        self.rsrc2, self.props = int(req["rsrc2"]), int(req["properties"])
        self.lds = (ctypes.c_uint32 * ((int(req["lds_bytes"]) + 3) // 4))()
        self.private = int(req["private_bytes"])   # scratch bytes per lane
        self.scratch_bytes = self.private * 64
        self.bufs = dict(bufs)

    def user_sgprs(self) -> list[int]:
        vals = {"kernarg_segment_ptr": int(self.req["kernarg"]), "dispatch_ptr": int(self.req["dispatch"]),
                "queue_ptr": int(self.req["queue"]), "dispatch_id": 0, "flat_scratch_init": 0,
                "private_segment_buffer": PRIVATE_SEGMENT_BUFFER, "private_segment_size": int(self.req["private_bytes"])}
        out: list[int] = []
        for bit, name, n in USER_SGPRS:
            if self.props >> bit & 1:
                v = vals[name]
                out.extend((v >> (32 * i)) & MASK32 for i in range(n))
        return out

    def workgroups(self):
        lx, ly, lz = self.block
        threads = lx * ly * lz
        nwaves = -(-threads // 64)
        user = self.user_sgprs()
        count = (self.rsrc2 >> RSRC2_USER_SGPR_SHIFT) & RSRC2_USER_SGPR_MASK
        tidig = (self.rsrc2 >> RSRC2_TIDIG_SHIFT) & RSRC2_TIDIG_MASK
        bufs = dict(self.bufs)
        bufs[3] = ctypes.addressof(self.lds)
        scratch = [(ctypes.c_uint8 * max(1, self.scratch_bytes))() for _ in range(nwaves)]
        for gz, gy, gx in itertools.product(range(self.grid[2]), range(self.grid[1]), range(self.grid[0])):
            ctypes.memset(self.lds, 0, ctypes.sizeof(self.lds))
            waves = []
            for w in range(nwaves):
                lanes = min(64, threads - 64 * w)
                wave = Wave(self.emu, lanes, {**bufs, 4: ctypes.addressof(scratch[w])})
                st = wave.st
                st._write_sgpr(self.emu.SCRATCH_STRIDE_IDX, self.private)
                st.pc = self.entry
                for i, v in enumerate(user[:count]):
                    st._write_sgpr(i, v)
                sys_sgprs = [g for bit, g in zip(RSRC2_TGID, (gx, gy, gz)) if self.rsrc2 & bit]
                if self.rsrc2 & RSRC2_TG_SIZE:
                    sys_sgprs.append(nwaves)
                if self.rsrc2 & RSRC2_SCRATCH_EN:
                    sys_sgprs.append(0)
                for i, v in enumerate(sys_sgprs):
                    st._write_sgpr(count + i, v)
                for lane in range(lanes):
                    tid = 64 * w + lane
                    ids = (tid % lx, (tid // lx) % ly, tid // (lx * ly))
                    for comp in range(tidig + 1):
                        st._write_vgpr(comp, lane, ids[comp])
                waves.append(wave)
            yield Group(waves)
