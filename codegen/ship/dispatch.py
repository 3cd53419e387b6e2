"""Emulated dispatch: an AOTriton library's own entry points run on a CPU against the stub HIP
runtime, for every SDPA case of the validation matrix.

`run_dispatch` compiles the driver (`stub/driver.cc`) against the library's installed headers and
the HIP headers of its major, links it against the library and the stub (`stub.py`), and runs it
in a child process (a crash is a verdict, not ours) with the stub reporting one device of the
spec's target. Per case the driver calls `v3::flash::attn_fwd` and `attn_bwd`; the stub checks
every code object (AMDGPU ELF, the arch's mach value and target features, the kernel and its
descriptor present) and every launch (block within the kernel's `.max_flat_workgroup_size` and a
multiple of its wave size, kernel arguments against its metadata), and logs each as a JSON line.
Each loaded code object is matched, by its FNV-1a hash, to the kernel stem it was packed under in
the `.aks2` packages or 0.13b's image zips: that names the kernel and the tuned configuration (`__P__` perf fields, `__CO__`
compile options) the library's dispatch table picked.

Where it ran: a CPU; the kernels never run. Label: "CPU-built, dispatch emulated; never run on a card".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from codegen.core import processes
from codegen.formats.aks2 import (ImageError, container_name, read_aks2_images, read_zip_images, split_container,
                                  zip_without)
from codegen.formats.elf import AMDGPU_MACH, elf_extent
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import move_into_place
from codegen.models import TargetSpec
from codegen.models.cases import SHAPES, Shape
from codegen.models.dtypes import served_dtypes
from codegen.models.functional import Functional
from codegen.ship.stub import Stub, compile_c

DRIVER = Path(__file__).resolve().parent / "stub" / "driver.cc"
LABEL = "CPU-built, dispatch emulated; never run on a card"

# sequence lengths that are multiples of every tile (16..256), beside validate's primes
TILE_SHAPE = Shape(2, 4, 4, 256, 256)
HIP_SUCCESS = 0


@dataclass(frozen=True)
class DispatchCase:
    name: str
    dtype: str
    head_dim: int
    causal: bool
    shape: Shape
    bias: bool = False
    dropout: float = 0.0
    force_backend: int = -1   # >= 0: the backward's attn_options.force_backend_index (not PyTorch's call)
    pads_to: int = 0          # > 0: head_dim is below this declared head dim, which it pads to (PADDED_HEAD)

    @property
    def functional(self) -> Functional:
        """The key its launches' tuning rows are looked up by (codegen.models.functional)."""
        s = self.shape
        return Functional(self.dtype, self.head_dim, self.causal, self.dropout > 0, self.bias, s.seqlen_q, s.seqlen_k)

    @property
    def package(self) -> tuple[Functional, bool]:
        """What picks its image packages: its key at the declared head dim, without the seqlens (a
        package serves them all), and whether the head is padded."""
        return replace(self.functional, head_dim=self.pads_to or self.head_dim, seqlen_q=0, seqlen_k=0), self.pads_to > 0

    def line(self) -> str:
        s = self.shape
        return (f"{self.name} {self.dtype} {self.head_dim} {int(self.causal)} {s.batch} {s.heads_q} {s.heads_k} "
                f"{s.seqlen_q} {s.seqlen_k} {int(self.bias)} {self.dropout} {self.force_backend}")


def dispatch_cases(spec: TargetSpec) -> list[DispatchCase]:
    """validate's SDPA matrix (dtypes × head dims × causal × its prime-length shapes), one shape
    whose lengths are tile multiples, and bias (not causal) / dropout variants where the spec
    builds them."""
    out = []
    for dtype in spec.dtypes:
        for hd in sorted(spec.head_dims):
            for causal in ((False, True) if spec.features.causal else (False,)):
                for shape in (*SHAPES, TILE_SHAPE):
                    base = f"{dtype}.d{hd}.{'causal' if causal else 'full'}.{shape.tag}"
                    out.append(DispatchCase(base, dtype, hd, causal, shape))
                shape = SHAPES[1]
                tag = f"{dtype}.d{hd}.{'causal' if causal else 'full'}.{shape.tag}"
                # PyTorch refuses attn_mask together with is_causal, and upstream's generator
                # disables causal functionals with a bias (rules/flash/_common.py): bias only without
                if spec.features.bias and not causal:
                    out.append(DispatchCase(tag + ".bias", dtype, hd, causal, shape, bias=True))
                if spec.features.dropout:
                    out.append(DispatchCase(tag + ".dropout", dtype, hd, causal, shape, dropout=0.25))
    return out


def padded_head(hd: int, head_dims) -> int | None:
    """A head dim that pads to the declared `hd`: 8 below it (None where another declared head
    dim is in the way, or nothing is below it)."""
    below = [d for d in head_dims if d < hd]
    p = hd - 8
    return p if p > 0 and p > max(below, default=0) else None


def variants(spec: TargetSpec) -> list[tuple[bool, bool, bool]]:
    """(causal, bias, dropout) of every functional the spec's features make: bias only without
    causal (see dispatch_cases)."""
    f = spec.features
    return [(c, b, d) for c in ((False, True) if f.causal else (False,)) for b in ((False, True) if f.bias else (False,))
            for d in ((False, True) if f.dropout else (False,)) if not (b and c)]


def coverage_cases(spec: TargetSpec) -> list[DispatchCase]:
    """One case (a square shape) for each functional the spec's axes make that `dispatch_cases`
    does not dispatch: every dtype the build serves (codegen.models.dtypes.served_dtypes: bf16
    too where the spec lists fp16 only), every head dim, with a head dim 8 below it that pads to
    it, every variant. A package missing for any of them fails its case."""
    have = {c.package for c in dispatch_cases(spec)}
    out, shape = [], SHAPES[0]
    for dtype in served_dtypes(spec.dtypes):
        for hd in sorted(spec.head_dims):
            for head, pads in ((hd, 0), (padded_head(hd, spec.head_dims), hd)):
                for causal, bias, dropout in variants(spec) if head is not None else ():
                    case = DispatchCase(f"{dtype}.d{head}{'.padded' if pads else ''}.{'causal' if causal else 'full'}"
                                        f"{'.bias' if bias else ''}{'.dropout' if dropout else ''}.{shape.tag}",
                                        dtype, head, causal, shape, bias=bias, dropout=0.25 if dropout else 0.0,
                                        pads_to=pads)
                    if case.package not in have:
                        out.append(case)
    return out


def check_cases(spec: TargetSpec) -> list[DispatchCase]:
    """What bundle check dispatches: validate's matrix (`dispatch_cases`) and the functionals it
    leaves (`coverage_cases`)."""
    return dispatch_cases(spec) + coverage_cases(spec)


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def remove_image(images: Path, container: str) -> None:
    """The missing-image control: take one image container out of an images folder (a copy):
    an `.aks2` file, or one member of an image zip (`<zip>:<member>`; the zip rewritten without
    it: codegen.formats.aks2.zip_without)."""
    rel, member = split_container(container)
    if member is None:
        (images / rel).unlink(missing_ok=True)
        return
    zip_without(images / rel, member)


class ImageIndex:
    """The packed code objects of an images folder, found again from what the stub logs: the
    FNV-1a hash of the bytes a loaded image reaches (`codegen.formats.elf.elf_extent`). Hashes are
    computed only for images of the logged size. Both image formats (codegen.formats.aks2):
    `.aks2` packages (up to 0.12.1b; a kernel is named `<package>/<stem>`) and 0.13b's stored zips
    of .aks2 clusters (named `<zip without .zip>/<member>/<stem>`); `container` gives what to remove
    to make it missing. Images that cannot be read are one UserError (a bundle's or a prefix the
    user names: their input)."""

    def __init__(self, images: Path):
        self.by_size: dict[int, list[tuple[str, bytes]]] = {}
        self._cache: dict[str, str] = {}
        self.containers: dict[str, str] = {}
        if not images.is_dir():
            return
        try:
            for pkg in sorted(images.rglob("*.aks2")):
                rel = pkg.relative_to(images).as_posix()
                self._add(rel.removesuffix(".aks2"), container_name(rel), read_aks2_images(pkg))
            for zp in sorted(images.rglob("*.zip")):
                rel = zp.relative_to(images).as_posix()
                for member, imgs in read_zip_images(zp).items():
                    self._add(f"{rel.removesuffix('.zip')}/{member.removesuffix('.aks2')}", container_name(rel, member), imgs)
        except ImageError as exc:
            raise UserError(str(exc)) from None

    def _add(self, prefix: str, container: str, imgs: dict[str, bytes]) -> None:
        for stem, img in imgs.items():
            n = elf_extent(img)
            name = f"{prefix}/{stem}"
            self.by_size.setdefault(n, []).append((name, img[:n]))
            self.containers[name] = container

    def packed(self) -> set[str]:
        """Every container (see `container`) the images folder packs."""
        return set(self.containers.values())

    def container(self, name: str) -> str | None:
        """The file (or `<zip>:<member>`) below the images folder that holds kernel `name`."""
        return self.containers.get(name)

    def find(self, size: int, fnv: str) -> str | None:
        if fnv in self._cache:
            return self._cache[fnv]
        for name, img in self.by_size.get(size, []):
            h = fnv1a64(img)
            self._cache[h] = name
            if h == fnv:
                return name
        return None


@dataclass
class CaseResult:
    case: str
    fwd: int | None = None
    bwd: int | None = None
    kernels: dict[str, list[str]] = field(default_factory=lambda: {"fwd": [], "bwd": []})
    launches: dict[str, int] = field(default_factory=lambda: {"fwd": 0, "bwd": 0})
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.fwd == HIP_SUCCESS and self.bwd == HIP_SUCCESS and not self.violations
                and self.launches["fwd"] > 0 and self.launches["bwd"] > 0)


@dataclass
class DispatchReport:
    target: str
    hip_major: int
    check_gpu: int | None
    cases: list[CaseResult]
    loads: int
    stderr_tail: str = ""
    returncode: int = 0
    violations: list[str] = field(default_factory=list)   # outside any case (e.g. during check_gpu)
    containers: dict[str, str] = field(default_factory=dict)  # launched kernel -> ImageIndex.container
    packed: set[str] = field(default_factory=set)              # every ImageIndex.container of the images

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and self.check_gpu == HIP_SUCCESS and bool(self.cases) and not self.violations
                and all(c.ok for c in self.cases))

    def summary(self) -> dict:
        return {"label": LABEL, "target": self.target, "hip_major": self.hip_major, "check_gpu": self.check_gpu,
                "cases": len(self.cases), "cases_ok": sum(c.ok for c in self.cases), "code_objects_loaded": self.loads,
                "launches": sum(sum(c.launches.values()) for c in self.cases), "ok": self.ok,
                "violations_outside_cases": self.violations,
                "returncode": self.returncode}


def compile_driver(prefix: Path, hip_include: Path, lib: Path, stub: Stub, cache: Path) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise EnvironmentMissing("no C++ compiler for the dispatch driver", hint="apt-get install -y g++")
    inc = prefix / "include"
    headers = b"".join(p.read_bytes() for p in sorted(inc.rglob("*.h")))
    # keyed by the library's name and content, not its path: bundle check extracts each bundle into a
    # new temporary folder, and a key with that path compiled (and kept) one more driver per check
    key = hashlib.sha256(b"\0".join([DRIVER.read_bytes(), headers, str(hip_include).encode(), lib.name.encode(),
                                     hashlib.sha256(lib.read_bytes()).digest(), str(stub.path).encode(),
                                     cxx.encode()])).hexdigest()[:16]
    out = cache / f"driver-{key}"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-driver-", dir=cache))
    try:
        # the system's own include folder stays where the compiler has it (its #include_next chain)
        system = [] if hip_include.resolve() == Path("/usr/include") else ["-isystem", str(hip_include)]
        cmd = [cxx, "-std=c++20", "-O1", "-D__HIP_PLATFORM_AMD__", "-I", str(inc), *system,
               str(DRIVER), "-o", str(tmp / "driver"), f"-L{lib.parent}", f"-l:{lib.name}",
               f"-L{stub.path.parent}", f"-l:{stub.path.name}", "-Wl,--allow-shlib-undefined"]
        compile_c(cmd, "the dispatch driver", inc)
        move_into_place(tmp / "driver", out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def run_dispatch(*, lib: Path, prefix: Path, images: Path, hip_include: Path, stub: Stub, arch: str,
                 cases: list[DispatchCase], cache: Path, target: str, wave: int = 64,
                 timeout: int = 600) -> DispatchReport:
    """Run `cases` through the library at `lib` against `stub` (see the module doc), the stub
    reporting one device of `target` (the spec's `target_string`, e.g. gfx908:sramecc+:xnack-)."""
    if arch not in AMDGPU_MACH:
        raise UserError(f"{arch}: no EF_AMDGPU_MACH value known for this arch")
    driver = compile_driver(prefix, hip_include, lib, stub, cache)
    index = ImageIndex(images)
    with tempfile.TemporaryDirectory(prefix="mi100-dispatch-") as td:
        log = Path(td) / "stub.jsonl"
        env = {**os.environ, "MI100_STUB_TARGET": target, "MI100_STUB_MACH": str(AMDGPU_MACH[arch]),
               "MI100_STUB_WAVE": str(wave), "MI100_STUB_LOG": str(log),
               "LD_LIBRARY_PATH": os.pathsep.join([str(stub.path.parent), str(lib.parent)])}
        try:
            r = processes.run([str(driver)], input="".join(c.line() + "\n" for c in cases), env=env,
                              capture_output=True, text=True, timeout=timeout)
            rc, stdout, stderr = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stdout, stderr = 124, (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), "timed out"
        events = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.is_file() else []
    check = None
    results: dict[str, CaseResult] = {c.name: CaseResult(c.name) for c in cases}
    for line in stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "check_gpu" in rec:
            check = rec["check_gpu"]
        elif rec.get("case") in results:
            results[rec["case"]].fwd, results[rec["case"]].bwd = rec["fwd"], rec["bwd"]
    cur, phase, loads, sizes, outside = None, "fwd", 0, {}, []
    for ev in events:
        kind = ev.get("event")
        if kind == "case":
            cur, phase = results.get(ev.get("case")), ev.get("phase", "fwd")
        elif kind == "load":
            loads += 1
            sizes[ev.get("fnv1a64")] = ev.get("bytes", 0)
        elif kind == "launch" and cur is not None:
            cur.launches[phase] += 1
            h = ev.get("fnv1a64", "")
            stem = index.find(sizes.get(h, 0), h) or f"(not in the images: {ev.get('kernel')})"
            if stem not in cur.kernels[phase]:
                cur.kernels[phase].append(stem)
        elif kind == "violation":
            (cur.violations if cur is not None else outside).append(f"{ev.get('kernel')}: {ev.get('what')}")
    containers = {k: index.container(k) for c in results.values() for ks in c.kernels.values() for k in ks
                  if index.container(k)}
    return DispatchReport(target=target, hip_major=stub.major, check_gpu=check, cases=list(results.values()),
                          loads=loads, stderr_tail="\n".join(stderr.strip().splitlines()[-10:]), returncode=rc,
                          violations=outside, containers=containers, packed=index.packed())
