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
import lzma
import os
import shutil
import struct
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from codegen.core import processes
from codegen.formats.elf import AMDGPU_MACH
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import move_into_place
from codegen.models import TargetSpec
from codegen.models.cases import SHAPES, Shape
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


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def aks2_images(path: Path, data: bytes | None = None) -> dict[str, bytes]:
    """Every kernel image of one .aks2 package by its stem (see codegen.formats.aks2 for the
    format): the file at `path`, or `data` (a member of a 0.13b image zip; `path` then only names
    it in messages). The decompressed size is bounded by the header's."""
    data = path.read_bytes() if data is None else data
    if len(data) < 16 or data[:4] != b"AKS2":
        raise UserError(f"{path}: not an AKS2 kernel package")
    _magic, total, count, dir_size = struct.unpack_from("<4sIII", data)
    if total > 1 << 30:
        raise UserError(f"{path}: kernel package claims {total} bytes")
    blob = lzma.LZMADecompressor().decompress(data[16:], max_length=total)
    out, pos = {}, 0
    for _ in range(count):
        _shared, _threads, offset, size, name_len = struct.unpack_from("<IIIII", blob, pos)
        pos += 20
        name = blob[pos:pos + name_len].rstrip(b"\0").decode("utf-8", errors="replace")
        pos += name_len
        out[name] = blob[dir_size + offset:dir_size + offset + size]
    return out


def zip_images(path: Path) -> dict[str, dict[str, bytes]]:
    """0.13b's image zips (`<arch pack>/flash/<kernel>.zip`, members stored, each member one
    .aks2 cluster named by its functional): {member: {stem: image}}. Members that are not AKS2
    packages are skipped; a zip that does not open is a UserError."""
    try:
        with zipfile.ZipFile(path) as z:
            out = {}
            for info in z.infolist():
                if info.is_dir() or info.file_size > 1 << 30:
                    continue
                data = z.read(info)
                if data[:4] == b"AKS2":
                    out[info.filename] = aks2_images(Path(f"{path}:{info.filename}"), data)
            return out
    except (OSError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path}: not a readable image zip ({exc})") from None


def remove_image(images: Path, container: str) -> None:
    """The missing-image control: take one image container out of an images folder (a copy):
    an `.aks2` file, or one member of an image zip (`<zip>:<member>`; the zip rewritten without
    it, members stored as the build stores them)."""
    if ":" not in container:
        (images / container).unlink(missing_ok=True)
        return
    rel, member = container.split(":", 1)
    path = images / rel
    with zipfile.ZipFile(path) as z:
        keep = [(i, z.read(i)) for i in z.infolist() if i.filename != member]
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for info, data in keep:
            z.writestr(info, data)
    move_into_place(tmp, path)


def elf_extent(image: bytes) -> int:
    """How far an ELF64 image reaches, computed as the stub computes it from the pointer it is
    given (the header tables and every section with file contents): the bytes it hashes."""
    if len(image) < 64 or image[:4] != b"\x7fELF":
        return 0
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + 0x28 > len(image):
            break
        typ = struct.unpack_from("<I", image, off + 4)[0]
        s_off, s_size = struct.unpack_from("<QQ", image, off + 0x18)
        if typ != 8 and s_off + s_size > end and s_off + s_size < (1 << 30):
            end = s_off + s_size
    return end


class ImageIndex:
    """The packed code objects of an images folder, found again from what the stub logs: the
    FNV-1a hash of the bytes a loaded image reaches (`elf_extent`). Hashes are computed only for
    images of the logged size. Both image formats: `.aks2` packages (up to 0.12.1b; a kernel is
    named `<package>/<stem>`) and 0.13b's stored zips of .aks2 clusters (named
    `<zip without .zip>/<member>/<stem>`); `container` gives what to remove to make it missing."""

    def __init__(self, images: Path):
        self.by_size: dict[int, list[tuple[str, bytes]]] = {}
        self._cache: dict[str, str] = {}
        self.containers: dict[str, str] = {}
        if not images.is_dir():
            return
        for pkg in sorted(images.rglob("*.aks2")):
            rel = pkg.relative_to(images).as_posix()
            self._add(rel.removesuffix(".aks2"), rel, aks2_images(pkg))
        for zp in sorted(images.rglob("*.zip")):
            rel = zp.relative_to(images).as_posix()
            for member, imgs in zip_images(zp).items():
                self._add(f"{rel.removesuffix('.zip')}/{member.removesuffix('.aks2')}", f"{rel}:{member}", imgs)

    def _add(self, prefix: str, container: str, imgs: dict[str, bytes]) -> None:
        for stem, img in imgs.items():
            n = elf_extent(img)
            name = f"{prefix}/{stem}"
            self.by_size.setdefault(n, []).append((name, img[:n]))
            self.containers[name] = container

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
    key = hashlib.sha256(b"\0".join([DRIVER.read_bytes(), headers, str(hip_include).encode(),
                                     str(lib).encode(), str(stub.path).encode(), cxx.encode()])).hexdigest()[:16]
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
                          violations=outside, containers=containers)


__all__ = ["DispatchCase", "DispatchReport", "ImageIndex", "LABEL", "aks2_images", "dispatch_cases",
           "elf_extent", "remove_image", "run_dispatch", "zip_images"]
