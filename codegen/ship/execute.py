"""Executed dispatch: an AOTriton library's own `attn_fwd` and `attn_bwd` run through its real
dispatch on a CPU, every kernel it launches executed instruction by instruction on an emulated GPU
(codegen.emulate), and out, logsumexp, dq, dk, dv (and db with a bias) compared with an fp64
reference (codegen.ship.reference).

The dispatch driver and the stub HIP runtime of `bundle check` (dispatch.py) run in their execute
mode. The device memory is one bounded arena (codegen.emulate.Arena: a file), mapped by the driver
at the address the kernels see: every tensor the driver hands the library is an arena address, so
the pointers in the kernel arguments the library writes are too. Over two pipes, the child sends
(stub/driver.cc, stub/hip_stub.c):

- CASE (the driver, after allocating a case's tensors): where each tensor is. The inputs are
  filled here (a seeded normal draw per case, rounded to the dtype); the answer lets it go on.
- LOAD (the stub): each code object the library loads, kept here by its FNV-1a hash (the name it
  was packed under comes from the images: dispatch.ImageIndex).
- LAUNCH (the stub): a launch the stub found valid, with its explicit kernel arguments laid out as
  HIP lays them out. It is executed here (`Machine.execute`) before the answer (0, or
  hipErrorLaunchFailure after a fault: the library returns it), so the kernels run one at a time,
  in the library's order. After a fault, the case's later launches are answered with the same
  error, unexecuted.
- PHASE (the driver, before each entry point: fwd, bwd, mask): the launches that follow are its.
- DONE (the driver, after the backward and, with dropout, the library's
  debug_simulate_encoded_softmax): the outputs are read from the arena and compared here.

Where it ran: a CPU; the kernels executed on an emulated GPU, never on a card. Label: `label(arch)`.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from codegen.core import processes
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.resources import user_cache_dir
from codegen.emulate.arena import Arena
from codegen.emulate.machine import KernelFault, Machine
from codegen.formats.bundle_zip import SPEC, extract, open_bundle
from codegen.formats.elf import AMDGPU_MACH
from codegen.formats.spec import load_spec
from codegen.models import TargetSpec
from codegen.models.bundle import BundleManifest
from codegen.models.cases import Shape
from codegen.models.dtypes import served_dtypes
from codegen.models.emulate import Launch
from codegen.models.execute import CaseFault, ExecuteReport, ExecutedCase, KernelRun, OpcodeCoverage, TensorCheck
from codegen.ship.dispatch import DispatchCase, ImageIndex, compile_driver, variants
from codegen.ship.stub import Stub, build_stub
from codegen.ship.sysroot import ensure_sysroot
from codegen.upstream.releases import IMAGES_DIR

EXEC_CASE, EXEC_LOAD, EXEC_LAUNCH, EXEC_DONE, EXEC_PHASE = 1, 2, 3, 4, 5
HIP_ERROR_LAUNCH_FAILURE = 719
FRAME_LIMIT = 256 << 20          # bytes of one frame: a code object (AOTriton's are < 1 MB), a case's JSON
ARENA_BYTES = 256 << 20          # the device memory of one run
DRIVER_BYTES = 192 << 20         # of it, the driver's: every tensor of one case (reused case after case)
DROPOUT_P = 0.25
CASE_TIMEOUT_S = 900.0           # the default time limit of a run, per case
# upstream's tests' Philox seed and offsets (test/attn_torch_function.py's defaults)
PHILOX_SEED, PHILOX_OFFSET1 = 0x1BF52, 0x1D4000

# Small problems that still take every masked edge: lengths no tile divides, grouped query heads
# (2:1), more queries than keys. With a bias, as many KV heads as query heads: AOTriton 0.11b-0.11.2b
# compute dk and dv from the bias of the KV head's index ("CAVEAT: bias is incompatible with GQA" in
# their bwd_kernel_dk_dv.py and bwd_kernel_fuse.py; 0.12b takes the query head's), which execution
# shows (docs/emulate.md); validate's matrix never combines them either.
EXEC_SHAPE = Shape(1, 2, 1, 67, 45)
EXEC_SHAPE_BIAS = Shape(1, 2, 2, 67, 45)
INPUTS = ("q", "k", "v", "b", "do")
COMPARED = ("out", "lse", "dq", "dk", "dv", "db")


def label(arch: str) -> str:
    return f"kernels executed on an emulated {arch} ISA (CPU); never run on a card"


def execute_cases(spec: TargetSpec) -> list[DispatchCase]:
    """The executed matrix: every dtype the build serves × every head dim of the spec × every
    variant its features make (causal, bias without causal, dropout), on EXEC_SHAPE (a bias on
    EXEC_SHAPE_BIAS)."""
    out = []
    for dtype in served_dtypes(spec.dtypes):
        for hd in sorted(spec.head_dims):
            for causal, bias, dropout in variants(spec):
                shape = EXEC_SHAPE_BIAS if bias else EXEC_SHAPE
                out.append(DispatchCase(f"{dtype}.d{hd}.{'causal' if causal else 'full'}{'.bias' if bias else ''}"
                                        f"{'.dropout' if dropout else ''}.{shape.tag}", dtype, hd, causal, shape,
                                        bias=bias, dropout=DROPOUT_P if dropout else 0.0))
    return out


def _numpy():
    try:
        import numpy  # noqa: F401  import-time dependency: numpy, of the `upstream` extra, not a base install
    except ImportError:
        raise EnvironmentMissing("executing kernels needs numpy for the fp64 reference",
                                 hint="pip install numpy (or mi100-codegen's 'upstream' extra)") from None
    from codegen.ship import reference  # import-time dependency: numpy, checked above
    return reference


@dataclass
class _Case:
    case: DispatchCase
    tensors: dict = field(default_factory=dict)     # name -> {"addr", "dtype", "shape", "strides"}
    inputs: dict = field(default_factory=dict)      # name -> float64 array written
    runs: dict = field(default_factory=dict)        # (phase, kernel) -> KernelRun fields
    phase: str = "fwd"
    fault: CaseFault | None = None
    started: float = 0.0
    result: ExecutedCase | None = None


class _Channel:
    """The parent's ends of the two pipes: frames in (type, payload), 4-byte answers out."""

    def __init__(self, req: int, rep: int, deadline: float):
        self.req, self.rep, self.deadline = req, rep, deadline

    def _read(self, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.req], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.req, min(n - len(buf), 1 << 20))
            if not chunk:
                return None
            buf += chunk
        return buf

    def frame(self) -> tuple[int, bytes] | None:
        head = self._read(8)
        if head is None:
            return None
        kind, size = struct.unpack("<II", head)
        if size > FRAME_LIMIT:
            raise UserError(f"the dispatch driver sent a frame of {size} bytes (at most {FRAME_LIMIT})")
        body = self._read(size) if size else b""
        if body is None:
            return None
        return kind, body

    def answer(self, code: int) -> None:
        try:
            os.write(self.rep, struct.pack("<i", code))
        except BrokenPipeError:
            pass


class _Session:
    """One run of the driver in execute mode: the frames' handlers (module doc)."""

    def __init__(self, *, arena, machine, index: ImageIndex, cases: list[DispatchCase], ref,
                 progress: Callable[[str], None]):
        self.arena, self.machine, self.index, self.ref, self.progress = arena, machine, index, ref, progress
        self.by_name = {c.name: c for c in cases}
        self.images: dict[str, bytes] = {}      # fnv1a64 -> code object
        self.names: dict[str, str] = {}         # fnv1a64 -> the stem it was packed under
        self.opcodes: dict[str, dict[str, int]] = {}   # kernel -> executed opcode -> count
        self.loaded: dict[str, tuple[str, str]] = {}   # kernel -> (fnv1a64 of its code object, its symbol)
        self.cur: _Case | None = None
        self.done: list[ExecutedCase] = []
        self.problems: list[str] = []

    # -- frames ---------------------------------------------------------------------------------
    def on_case(self, body: bytes) -> int:
        msg = json.loads(body)
        case = self.by_name.get(msg.get("case"))
        if case is None:
            self.problems.append(f"the driver announced a case it was not given: {msg.get('case')!r}")
            return 1
        self.cur = _Case(case, tensors=msg.get("tensors", {}), started=time.monotonic())
        rng = self.ref.np.random.default_rng(int.from_bytes(hashlib.sha256(case.name.encode()).digest()[:8], "little"))
        for name in INPUTS:
            t = self.cur.tensors.get(name)
            if t is not None:
                x = self.ref.rounded(rng.standard_normal(t["shape"]), t["dtype"])
                self._write(t, x)
                self.cur.inputs[name] = x
        for name, value in (("philox_seed", PHILOX_SEED), ("philox_offset1", PHILOX_OFFSET1)):
            if name in self.cur.tensors:
                self.arena.write(self.cur.tensors[name]["addr"], struct.pack("<Q", value))
        return 0

    def on_load(self, body: bytes) -> None:
        (h,) = struct.unpack_from("<Q", body)
        fnv, image = f"{h:016x}", body[8:]
        self.images[fnv] = image
        self.names[fnv] = self.index.find(len(image), fnv) or ""

    def on_launch(self, body: bytes) -> int:
        (h, name_len), pos = struct.unpack_from("<QI", body), 12
        kernel = body[pos:pos + name_len].decode("utf-8", "replace")
        pos += name_len
        dims = struct.unpack_from("<7I", body, pos)
        pos += 28
        (n,) = struct.unpack_from("<I", body, pos)
        kernarg = body[pos + 4:pos + 4 + n]
        fnv = f"{h:016x}"
        c = self.cur
        if c is None:
            self.problems.append(f"{kernel}: launched outside any case")
            return HIP_ERROR_LAUNCH_FAILURE
        stem = self.names.get(fnv) or kernel
        key = (c.phase, stem)
        run = c.runs.setdefault(key, {"phase": c.phase, "kernel": stem, "launches": 0, "waves": 0,
                                      "instructions": 0, "seconds": 0.0})
        run["launches"] += 1
        image = self.images.get(fnv)
        if image is None:
            c.fault = c.fault or CaseFault(kernel=stem, phase=c.phase, message="launched from a code object never loaded")
            return HIP_ERROR_LAUNCH_FAILURE
        self.loaded[stem] = (fnv, kernel)
        if c.fault is not None:      # after a fault the case's tensors are garbage: nothing more runs
            return HIP_ERROR_LAUNCH_FAILURE
        launch = Launch(kernel=kernel, grid=dims[0:3], block=dims[3:6], dynamic_lds=dims[6], kernarg=kernarg)
        t0 = time.monotonic()
        try:
            ex = self.machine.execute(image, launch)
        except KernelFault as exc:
            run["seconds"] += time.monotonic() - t0
            c.fault = CaseFault(kernel=stem, phase=c.phase, message=str(exc))
            return HIP_ERROR_LAUNCH_FAILURE
        run["seconds"] += ex.seconds
        run["waves"] += ex.waves
        run["instructions"] += ex.instructions
        counts = self.opcodes.setdefault(stem, {})
        for op, k in ex.opcodes.items():
            counts[op] = counts.get(op, 0) + k
        return 0

    def on_done(self, body: bytes) -> int:
        msg = json.loads(body)
        c = self.cur
        if c is None or msg.get("case") != c.case.name:
            self.problems.append(f"the driver finished a case it did not announce: {msg.get('case')!r}")
            return 1
        checks = [] if c.fault is not None or msg.get("fwd") != 0 or msg.get("bwd") != 0 else self._compare(c, msg)
        case = c.case
        c.result = ExecutedCase(
            case=case.name, dtype=case.dtype, head_dim=case.head_dim, causal=case.causal, bias=case.bias,
            dropout=case.dropout, shape=case.shape.tag, fwd=msg.get("fwd"), bwd=msg.get("bwd"), mask=msg.get("mask"),
            tensors=checks, kernels=[KernelRun(**r) for r in c.runs.values()], fault=c.fault,
            seconds=round(time.monotonic() - c.started, 3))
        self.done.append(c.result)
        self.cur = None
        r = c.result
        worst = max(r.tensors, key=lambda t: t.error / t.tolerance if t.tolerance else 0.0, default=None)
        self.progress(f"{'ok  ' if r.ok else 'FAIL'} {r.case}: {r.instructions:,} instructions, {r.seconds:.1f} s"
                      + (f"; worst {worst.name} {worst.error:.2e} (tolerance {worst.tolerance:.2e})" if worst else "")
                      + (f"; {r.fault.message}" if r.fault else ""))
        return 0

    def phase(self, name: str) -> None:
        if self.cur is not None:
            self.cur.phase = name

    # -- arena ----------------------------------------------------------------------------------
    def _write(self, t: dict, x) -> None:
        self.arena.write(t["addr"], self.ref.to_bytes(x, t["dtype"]))

    def _read(self, t: dict):
        np, shape, strides = self.ref.np, tuple(t["shape"]), tuple(t["strides"])
        size = self.ref.ITEMSIZE[t["dtype"]]
        count = 1 + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
        flat = self.ref.from_bytes(self.arena.read(t["addr"], count * size), t["dtype"], count)
        return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * 8 for s in strides)).copy()

    def _compare(self, c: _Case, msg: dict) -> list[TensorCheck]:
        case, ref, inp = c.case, self.ref, c.inputs
        keep = None
        if case.dropout > 0:
            if msg.get("mask") != 0 or "mask" not in c.tensors:
                return []
            keep = self._read(c.tensors["mask"]) >= 0
        scale = float(ref.np.float32(1.0) / ref.np.sqrt(ref.np.float32(case.head_dim)))   # the driver's fp32 Sm_scale
        want = ref.attention(inp["q"], inp["k"], inp["v"], inp["do"], scale=scale,
                             causal=case.causal, bias=inp.get("b"), keep=keep, dropout_p=case.dropout)
        out = []
        for name in COMPARED:
            r = getattr(want, name)
            if r is None or name not in c.tensors:
                continue
            got = self._read(c.tensors[name])
            out.append(TensorCheck(name=name, error=ref.max_error(got, r), tolerance=ref.tolerance(name, case.dtype, r),
                                   magnitude=float(abs(r).max()) if r.size else 0.0))
        return out


def _present(session: _Session) -> dict[str, list[str]]:
    """kernel that ran -> the distinct opcodes of its code (the emulator's decoder); [] where it
    cannot decode them (the kernel's fault says why)."""
    out = {}
    for stem, (fnv, symbol) in session.loaded.items():
        try:
            out[stem] = sorted(session.machine.opcodes(session.images[fnv], symbol))
        except KernelFault:
            out[stem] = []
    return out


def run_execute(*, lib: Path, prefix: Path, images: Path, hip_include: Path, stub: Stub, arch: str, target: str,
                cases: list[DispatchCase], cache: Path, wave: int = 64, budget: int | None = None,
                timeout: float | None = None, icache: bool = True,
                progress: Callable[[str], None] = lambda s: None) -> ExecuteReport:
    """Execute `cases` through the library at `lib` (module doc) on an emulated `arch`, the stub
    reporting one device of `target` (the spec's target string). `timeout`: for the whole run
    (default CASE_TIMEOUT_S per case); `icache`: the emulator's cache of compiled instructions
    across runs (off: every instruction compiled again, as on a first run)."""
    timeout = CASE_TIMEOUT_S * max(1, len(cases)) if timeout is None else timeout
    if arch not in AMDGPU_MACH:
        raise UserError(f"{arch}: no EF_AMDGPU_MACH value known for this arch")
    ref = _numpy()
    driver = compile_driver(prefix, hip_include, lib, stub, cache)
    index = ImageIndex(images)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mi100-execute-") as td:
        arena = Arena.create(Path(td) / "arena", ARENA_BYTES)
        region = arena.alloc(DRIVER_BYTES)
        kw = {"cache": icache} if budget is None else {"budget": budget, "cache": icache}
        try:
            with Machine(arch, arena, **kw) as machine:   # its child starts before the pipes exist
                session = _Session(arena=arena, machine=machine, index=index, cases=cases, ref=ref,
                                   progress=progress)
                rc, stderr = _drive(driver, session, td=Path(td), arena=arena, region=region, stub=stub, lib=lib,
                                    arch=arch, target=target, wave=wave, cases=cases, timeout=timeout)
                coverage = _present(session)
        finally:
            arena.close()
    missing = [c.name for c in cases if c.name not in {r.case for r in session.done}]
    problems = list(session.problems)
    if rc < 0 and session.cur is not None:   # a crash in the library or the stub, before the launch left
        problems.append(f"the dispatch driver died (signal {-rc}) in case {session.cur.case.name}, "
                        f"phase {session.cur.phase}")
    if missing:
        problems.append(f"{len(missing)} case(s) never finished: {', '.join(missing[:4])}"
                        + (f" (driver: {stderr.strip().splitlines()[-1]})" if stderr.strip() else ""))
    return ExecuteReport(label=label(arch), arch=arch, target=target, cases=session.done,
                         opcodes=[OpcodeCoverage(kernel=k, present=coverage[k], executed=session.opcodes.get(k, {}))
                                  for k in sorted(coverage)],
                         packed_kernels=sum(len(v) for v in index.by_size.values()),
                         returncode=rc, stderr_tail="\n".join(stderr.strip().splitlines()[-10:]),
                         seconds=round(time.monotonic() - t_start, 3), problems=problems)


def _drive(driver: Path, session: _Session, *, td: Path, arena, region: int, stub: Stub, lib: Path, arch: str,
           target: str, wave: int, cases: list[DispatchCase], timeout: float) -> tuple[int, str]:
    """Run the driver in execute mode, answering its frames until it exits (module doc);
    (its exit status, its stderr)."""
    (td / "cases").write_text("".join(c.line() + "\n" for c in cases))
    log = td / "stub.jsonl"
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    env = {**os.environ, "MI100_STUB_TARGET": target, "MI100_STUB_MACH": str(AMDGPU_MACH[arch]),
           "MI100_STUB_WAVE": str(wave), "MI100_STUB_LOG": str(log), "MI100_STUB_EXEC": f"{req_w},{rep_r}",
           "MI100_EXEC_ARENA": str(arena.path), "MI100_EXEC_BASE": f"{arena.device_base:x}",
           "MI100_EXEC_SIZE": str(arena.size), "MI100_EXEC_REGION": f"{region:x},{DRIVER_BYTES}",
           "LD_LIBRARY_PATH": os.pathsep.join([str(stub.path.parent), str(lib.parent)])}
    chan = _Channel(req_r, rep_w, time.monotonic() + timeout)
    with open(td / "cases", "rb") as stdin, open(td / "stdout", "wb") as out, open(td / "stderr", "wb") as err:
        proc = processes.start([str(driver)], stdin=stdin, stdout=out, stderr=err, env=env, pass_fds=(req_w, rep_r))
    os.close(req_w)
    os.close(rep_r)
    try:
        while True:
            frame = chan.frame()
            if frame is None:
                break
            kind, body = frame
            if kind == EXEC_LOAD:
                session.on_load(body)
            elif kind == EXEC_CASE:
                chan.answer(session.on_case(body))
            elif kind == EXEC_PHASE:
                session.phase(body.decode("ascii", "replace"))
            elif kind == EXEC_LAUNCH:
                chan.answer(session.on_launch(body))
            elif kind == EXEC_DONE:
                chan.answer(session.on_done(body))
            else:
                session.problems.append(f"the driver sent a frame of unknown type {kind}")
                break
        rc = proc.wait(timeout=max(1.0, chan.deadline - time.monotonic()))
    except TimeoutError:
        processes.kill_group(proc)
        proc.wait()
        session.problems.append(f"the run did not finish within {timeout:.0f} s (killed)")
        rc = 124
    except BaseException:
        processes.kill_group(proc)
        proc.wait()
        raise
    finally:
        os.close(req_r)
        os.close(rep_w)
    return rc, (td / "stderr").read_text(errors="replace")


def execute_extracted(root: Path, manifest: BundleManifest, *, cases: list[DispatchCase] | None = None,
                      budget: int | None = None, icache: bool = True,
                      progress: Callable[[str], None] = lambda s: None) -> ExecuteReport:
    """Execute `cases` (default: `execute_cases` of the bundle's spec) through the library of an
    extracted bundle, against the stub of its HIP major."""
    spec = load_spec(root / SPEC).spec
    sysroot = ensure_sysroot(manifest.hip_major, progress=progress)
    cache = user_cache_dir("bundle-check")
    stub = build_stub(sysroot.include, sysroot.runtime, cache / "stub")
    cases = execute_cases(spec) if cases is None else cases
    progress(f"executing {len(cases)} case(s) on an emulated {manifest.arch} ({spec.target_string}), stub HIP "
             f"{manifest.hip_major}")
    return run_execute(lib=root / manifest.library.file, prefix=root, images=root / "lib" / IMAGES_DIR,
                       hip_include=sysroot.include, stub=stub, arch=manifest.arch, target=spec.target_string,
                       wave=spec.warp_size, cases=cases, cache=cache / "driver", budget=budget, icache=icache,
                       progress=progress)


def execute_bundle(path: Path, *, pick: Callable[[list[DispatchCase]], list[DispatchCase]] | None = None,
                   budget: int | None = None, icache: bool = True,
                   progress: Callable[[str], None] = lambda s: None) -> ExecuteReport:
    """`execute_extracted` of a bundle file (every member verified first); `pick` chooses among
    the spec's executed matrix (a pick that leaves none is a UserError)."""
    b = open_bundle(path)
    with tempfile.TemporaryDirectory(prefix="mi100-bundle-") as td:
        root = extract(b, Path(td) / "bundle")
        cases = execute_cases(load_spec(root / SPEC).spec)
        if pick is not None:
            chosen = pick(cases)
            if not chosen:
                raise UserError(f"no case of {path.name}'s executed matrix is chosen; its cases: "
                                + ", ".join(c.name for c in cases))
            cases = chosen
        return execute_extracted(root, b.manifest, cases=cases, budget=budget, icache=icache, progress=progress)


__all__ = ["ARENA_BYTES", "EXEC_SHAPE", "EXEC_SHAPE_BIAS", "execute_bundle", "execute_cases", "execute_extracted", "label",
           "run_execute"]
