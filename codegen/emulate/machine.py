"""A gfx9 GPU on the CPU: the pinned emulator (codegen.emulate.source), patched by the arch layer,
run in a child process that maps the arena. A crash or hang of the emulator is a fault report,
never this process's crash; the child lives across launches, so each instruction is compiled once
per Machine.

    with Arena.create(path, 64 << 20) as arena, Machine("gfx908", arena) as m:
        x = arena.alloc(4096); ...
        execution = m.execute(code_object, Launch(kernel="add", grid=(4, 1, 1), block=(256, 1, 1),
                                                  kernarg=struct.pack("<QQQi", x, y, out, n)))

`execute` raises `KernelFault` (exit 3) with the `Fault`: kernel, PC, instruction, lane, address."""

from __future__ import annotations

import json
import os
import selectors
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from pydantic import ValidationError

from codegen.core import processes
from codegen.core.errors import CodegenError, EXIT_UPSTREAM
from codegen.core.fsutil import trusted_storage
from codegen.core.resources import user_cache_dir
from codegen.emulate import source
from codegen.emulate.arena import CODE_BASE, LAUNCH_BYTES, SCRATCH_APERTURE, Arena
from codegen.emulate.parts import PARTS
from codegen.emulate.child import read_frame, write_frame
from codegen.emulate.source import EmulatorMissing
from codegen.formats.elf import IMAGE_LIMIT, ElfError, kernel_descriptor, loaded_image, read_code_object
from codegen.models.emulate import Execution, Fault, Launch

DEFAULT_BUDGET = 50_000_000     # wave instructions per launch, far above what AOTriton's kernels take on small problems
DEFAULT_TIMEOUT_S = 3600.0      # wall clock per launch, compiles included
ANSWER_LIMIT = 16 << 20         # bytes of one answer from the child
# arch -> LDS bytes a workgroup may have: the archs our layer covers (gfx90a and later are not:
# their MFMA encodings and packed work-item ids differ, and nothing here checks them)
ARCHS = {"gfx908": 65536, "gfx906": 65536}
# the launch area at the start of the arena (codegen.emulate.arena.LAUNCH_BYTES)
DISPATCH_OFF, QUEUE_OFF, KERNARG_OFF = 0, 256, 4096
HIDDEN = {  # hidden kernel argument -> what the runtime puts there (launch -> int); others are 0
    "hidden_block_count_x": lambda la: la.grid[0], "hidden_block_count_y": lambda la: la.grid[1],
    "hidden_block_count_z": lambda la: la.grid[2], "hidden_group_size_x": lambda la: la.block[0],
    "hidden_group_size_y": lambda la: la.block[1], "hidden_group_size_z": lambda la: la.block[2],
    "hidden_grid_dims": lambda la: 1 + (la.grid[1] * la.block[1] > 1 or la.grid[2] * la.block[2] > 1)
    + (la.grid[2] * la.block[2] > 1),
    "hidden_dynamic_lds_size": lambda la: la.dynamic_lds,
}


class KernelFault(CodegenError):
    """A kernel stopped before its end (a bad access, the budget, an instruction the emulator
    cannot run, the emulator's own failure): `fault` says where. Exit 3."""

    exit_code = EXIT_UPSTREAM

    def __init__(self, fault: Fault):
        super().__init__(f"kernel fault: {fault.line()}")
        self.fault = fault


def _instruction_cache() -> Path | None:
    """The folder of compiled instructions (user cache), made if need be and checked as trusted
    storage (its objects are executed); None when it cannot be made (work without it)."""
    folder = user_cache_dir("emulator") / "instructions"
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        return None
    trusted_storage(folder.parent, what="emulator cache folder")
    trusted_storage(folder, what="folder of compiled instructions")
    return folder


def _fault(kernel: str, reason: str) -> KernelFault:
    return KernelFault(Fault(kernel=kernel[:4096], pc=-1, reason=reason[:4096]))


class Machine:
    """`with Machine(arch, arena, budget=...) as m: m.execute(code_object, launch)`."""

    def __init__(self, arch: str, arena: Arena, budget: int = DEFAULT_BUDGET, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, without: tuple[str, ...] = (), cache: bool = True):
        """`without`: parts of the arch layer to leave out (the tests that show each fix matters);
        `cache`: keep compiled instructions in the user cache across runs (codegen.emulate.icache)."""
        if arch not in ARCHS:
            raise EmulatorMissing(f"no emulator layer for {arch} (there is one for {', '.join(sorted(ARCHS))})")
        for start, n, what in ((CODE_BASE, IMAGE_LIMIT, "the code's place"), (SCRATCH_APERTURE, 1 << 40, "the scratch aperture")):
            if arena.device_base < start + n and start < arena.device_base + arena.size:
                raise ValueError(f"the arena [{arena.device_base:#x}, +{arena.size:#x}) overlaps {what} ({start:#x})")
        unknown = sorted(set(without) - set(PARTS))
        if unknown:
            raise ValueError(f"no part {', '.join(unknown)} in the emulator layer (its parts: {', '.join(PARTS)})")
        self.arch, self.arena, self.budget, self.timeout_s = arch, arena, budget, timeout_s
        self.without = tuple(without)
        self.root = source.emulator_root()
        self.clang = source.clang_path()
        self.cache_dir = _instruction_cache() if cache else None
        self.proc: subprocess.Popen | None = None
        self._stderr = None

    # --- the child ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        pkg_parent = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=pkg_parent, CACHELEVEL="0", CC=self.clang, DEBUG="0")
        self._stderr = tempfile.TemporaryFile()
        cmd = [sys.executable, "-P", "-m", "codegen.emulate.child", str(self.root), self.arch,
               str(self.arena.fd), str(self.arena.size), str(self.arena.device_base), ",".join(self.without),
               str(self.cache_dir or "")]
        self.proc = processes.start(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                    pass_fds=(self.arena.fd,), env=env, cwd=str(self.root))

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.stdin.close()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                processes.kill_group(proc)
                proc.wait()
            proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> "Machine":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        n = self._stderr.tell()
        self._stderr.seek(max(0, n - 2000))
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def _ask(self, header: dict, payload: bytes, kernel: str) -> dict:
        """One request and its answer; the child's death or silence is a fault (and the child is
        started again on the next request)."""
        self.start()
        proc = self.proc
        try:
            write_frame(proc.stdin, header, payload)
            answer = self._read_answer(proc)
        except (OSError, ValueError) as exc:
            answer = None
            why = f"({exc})"
        else:
            why = ""
        if answer is None:
            processes.kill_group(proc)
            rc = proc.wait()
            tail = self._stderr_tail()
            self.close()
            how = f"signal {-rc}" if rc < 0 else f"exit {rc}"
            raise _fault(kernel, f"the emulator process died ({how}{why}){': ' + tail if tail else ''}")
        return answer

    def _read_answer(self, proc: subprocess.Popen) -> dict | None:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(self.timeout_s):
                raise ValueError(f"no answer within {self.timeout_s:g} s")
        raw = read_frame(proc.stdout, ANSWER_LIMIT)
        return None if raw is None else json.loads(raw)

    # --- launches ----------------------------------------------------------------------------
    def _prepare(self, code_object: bytes, launch: Launch, budget: int) -> tuple[dict, bytes]:
        """The request for the child and the loaded image; writes the dispatch packet and the
        kernarg segment into the arena's launch area. KernelFault for a code object or launch the
        card would refuse."""
        name = launch.kernel
        try:
            co = read_code_object(code_object, "code object")
            loaded = loaded_image(code_object, "code object")
            kd = kernel_descriptor(code_object, loaded, name, "code object")
        except ElfError as exc:
            raise _fault(name, str(exc)) from None
        if co.arch != self.arch:
            raise _fault(name, f"code object for {co.arch or hex(co.mach)}, the machine is {self.arch}")
        meta = co.kernels.get(name)
        if meta is None:
            raise _fault(name, "code object: no metadata for this kernel")
        if meta.get(".wavefront_size", 64) != 64:
            raise _fault(name, "code object: not a wave64 kernel")
        lds = kd.group_segment_fixed_size + launch.dynamic_lds
        if lds > ARCHS[self.arch]:
            raise _fault(name, f"launch: {lds} bytes of LDS, a {self.arch} workgroup has {ARCHS[self.arch]}")
        kernarg = self._kernarg(meta, launch, kd.kernarg_size)
        base = self.arena.device_base
        self.arena.write(base, self._packet(launch, kd, lds, base + KERNARG_OFF))
        self.arena.write(base + QUEUE_OFF, bytes(256))
        self.arena.write(base + KERNARG_OFF, kernarg)
        req = {"op": "run", "kernel": name, "entry": kd.entry, "text": list(kd.text), "rsrc1": kd.rsrc1,
               "rsrc2": kd.rsrc2, "rsrc3": kd.rsrc3, "properties": kd.properties,
               "private_bytes": kd.private_segment_fixed_size, "lds_bytes": lds, "grid": list(launch.grid),
               "block": list(launch.block), "kernarg": base + KERNARG_OFF, "dispatch": base + DISPATCH_OFF,
               "queue": base + QUEUE_OFF, "budget": budget, "image_len": len(loaded)}
        return req, loaded

    def _kernarg(self, meta: dict, launch: Launch, size: int) -> bytes:
        """The kernarg segment: the explicit arguments as given, the hidden ones from the launch."""
        args = [a for a in meta.get(".args", []) if isinstance(a, dict)]
        explicit = [a for a in args if not str(a.get(".value_kind", "")).startswith("hidden_")]
        need = max((int(a.get(".offset", 0)) + int(a.get(".size", 0)) for a in explicit), default=0)
        if len(launch.kernarg) < need:
            raise _fault(launch.kernel, f"launch: {len(launch.kernarg)} bytes of kernel arguments, the kernel "
                         f"reads {need}")
        size = max(size, int(meta.get(".kernarg_segment_size", 0)), len(launch.kernarg))
        if size > LAUNCH_BYTES - KERNARG_OFF:
            raise _fault(launch.kernel, f"launch: a kernarg segment of {size} bytes")
        seg = bytearray(size)
        seg[:len(launch.kernarg)] = launch.kernarg
        for a in args:
            kind, off, n = str(a.get(".value_kind", "")), int(a.get(".offset", 0)), int(a.get(".size", 0))
            if kind in HIDDEN and n in (2, 4, 8) and 0 <= off and off + n <= size:
                seg[off:off + n] = int(HIDDEN[kind](launch)).to_bytes(n, "little")
        return bytes(seg)

    @staticmethod
    def _packet(launch: Launch, kd, lds: int, kernarg: int) -> bytes:
        """hsa_kernel_dispatch_packet_t (64 bytes), as the kernel's dispatch pointer shows it."""
        dims = 1 + (launch.grid[1] * launch.block[1] > 1 or launch.grid[2] * launch.block[2] > 1) \
            + (launch.grid[2] * launch.block[2] > 1)
        grid = [g * b for g, b in zip(launch.grid, launch.block)]
        return struct.pack("<HHHHHHIIIIIQQQQ", 2, dims, *launch.block, 0, *(min(g, 0xFFFFFFFF) for g in grid),
                           kd.private_segment_fixed_size, lds, 0, kernarg, 0, 0)

    def execute(self, code_object: bytes, launch: Launch, *, budget: int | None = None) -> Execution:
        """Run `launch` of `code_object` to its end; KernelFault when it does not get there
        (`budget`: this launch's instruction budget instead of the Machine's)."""
        req, image = self._prepare(code_object, launch, self.budget if budget is None else budget)
        answer = self._ask(req, image, launch.kernel)
        return self._result(answer, launch.kernel)

    def opcodes(self, code_object: bytes, kernel: str) -> dict[str, int]:
        """Mnemonic -> occurrences in the code `kernel` lies in, decoded by the emulator's decoder
        (the names `Execution.opcodes` uses)."""
        try:
            loaded = loaded_image(code_object, "code object")
            kd = kernel_descriptor(code_object, loaded, kernel, "code object")
        except ElfError as exc:
            raise _fault(kernel, str(exc)) from None
        answer = self._ask({"op": "opcodes", "kernel": kernel, "entry": kd.entry, "text": list(kd.text),
                            "image_len": len(loaded)}, loaded, kernel)
        ops = answer.get("opcodes")
        if not isinstance(ops, dict) or not all(isinstance(k, str) and type(v) is int for k, v in ops.items()):
            raise _fault(kernel, "the emulator's answer is malformed")
        return ops

    @staticmethod
    def _result(answer: dict, kernel: str) -> Execution:
        try:
            if isinstance(answer, dict) and "execution" in answer:
                return Execution.model_validate(answer["execution"])
            if isinstance(answer, dict) and "fault" in answer:
                fault = Fault.model_validate(answer["fault"])
            else:
                raise ValueError("neither an execution nor a fault")
        except (ValidationError, ValueError) as exc:
            raise _fault(kernel, f"the emulator's answer is malformed ({str(exc)[:200]})") from None
        raise KernelFault(fault)


__all__ = ["DEFAULT_BUDGET", "EmulatorMissing", "Execution", "Fault", "KernelFault", "Launch", "Machine"]
