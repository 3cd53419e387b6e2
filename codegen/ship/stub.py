"""Build the stub HIP runtime (`stub/hip_stub.c`) for one HIP major.

The stub is compiled with the system's C compiler against that major's HIP headers (a private
sysroot's, or the system's), so `hipDeviceProp_t` is the major's real struct. Its SONAME is
`libamdhip64.so.<major>`, and each function it defines gets the symbol version the real runtime
of that major gives it, read from the real library's `.gnu.version_d` with the one ELF reader;
a function the real runtime does not export stays local (the stub offers no more than the
runtime it stands in for). The result is cached by the hash of its inputs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from codegen.core import processes
from codegen.formats.elf import read_dynamic
from codegen.core.errors import EnvironmentMissing
from codegen.core.fsutil import move_into_place

SOURCE = Path(__file__).resolve().parent / "stub" / "hip_stub.c"

# the functions hip_stub.c defines; hipGetDevicePropertiesR0600 only against HIP >= 6 headers
FUNCTIONS = ("hipGetDevice", "hipGetDeviceCount", "hipStreamGetDevice", "hipGetDeviceProperties",
             "hipGetDevicePropertiesR0600", "hipPeekAtLastError", "hipGetLastError", "hipModuleLoadDataEx",
             "hipModuleGetFunction", "hipModuleLaunchKernel", "hipModuleUnload")

COMPILE_TIMEOUT_S = 600  # one small C/C++ file; a compiler that hangs is killed


def compile_c(cmd: list[str], what: str, include: Path) -> None:
    """Run one compiler command of ours (the stub, the dispatch driver) with a time limit; a
    failure is EnvironmentMissing with the compiler's last lines."""
    try:
        r = processes.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EnvironmentMissing(f"compiling {what} did not finish within {COMPILE_TIMEOUT_S} s (killed)") from None
    if r.returncode != 0:
        raise EnvironmentMissing(f"{what} does not compile against {include}:\n"
                                 + "\n".join(r.stderr.strip().splitlines()[-15:]))


@dataclass(frozen=True)
class Stub:
    major: int
    path: Path                          # .../libamdhip64.so.<major>
    versions: dict[str, str]            # function -> version node


def hip_major_of_headers(include: Path) -> int:
    text = (include / "hip" / "hip_version.h").read_text(errors="replace")
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[:2] == ["#define", "HIP_VERSION_MAJOR"]:
            return int(parts[2])
    raise EnvironmentMissing(f"{include}/hip/hip_version.h: no HIP_VERSION_MAJOR")


def version_script(runtime: Path, major: int) -> tuple[str, dict[str, str]]:
    """A linker version script giving each stub function the node the real runtime gives it
    (functions the real runtime does not export are left out: local to the stub)."""
    real = read_dynamic(runtime)
    exports = dict(real.export_versions)
    wanted = [f for f in FUNCTIONS if not (f == "hipGetDevicePropertiesR0600" and major < 6)]
    # a function the real runtime lacks (HIP 5.2 has no hipStreamGetDevice) stays local: a
    # library importing it fails to load against the stub as it would against the runtime
    versions = {f: exports[f] for f in wanted if f in exports}
    if not versions:
        raise EnvironmentMissing(f"{runtime}: exports none of the HIP functions the stub stands in for "
                                 "with a symbol version; not a HIP runtime?")
    order = [n for n in real.version_defs if n in versions.values()]
    lines, prev = [], None
    for i, node in enumerate(order):
        syms = " ".join(f"{f};" for f in wanted if versions.get(f) == node)
        local = " local: *;" if i == 0 else ""
        lines.append(f"{node} {{ global: {syms}{local} }}{(' ' + prev) if prev else ''};")
        prev = node
    return "\n".join(lines) + "\n", versions


def build_stub(include: Path, runtime: Path, cache: Path, cc: str | None = None) -> Stub:
    """Compile the stub for the HIP headers under `include` (their major), versioned like
    `runtime`, into `cache/<hash>/libamdhip64.so.<major>`."""
    cc = cc or os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise EnvironmentMissing("no C compiler for the stub HIP runtime", hint="apt-get install -y gcc")
    major = hip_major_of_headers(include)
    script, versions = version_script(runtime, major)
    src = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([src, script.encode(), str(include.resolve()).encode(),
                                     (include / "hip" / "hip_runtime_api.h").read_bytes(), cc.encode()])).hexdigest()[:16]
    out = cache / f"hip{major}-{key}" / f"libamdhip64.so.{major}"
    if out.is_file():
        return Stub(major, out, versions)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-stub-", dir=cache))
    try:
        (tmp / "hip_stub.map").write_text(script)
        system = [] if include.resolve() == Path("/usr/include") else ["-isystem", str(include)]
        cmd = [cc, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-D__HIP_PLATFORM_AMD__",
               *system, "-o", str(tmp / out.name), str(SOURCE),
               f"-Wl,-soname,libamdhip64.so.{major}", f"-Wl,--version-script={tmp / 'hip_stub.map'}"]
        compile_c(cmd, "the stub HIP runtime", include)
        # the unversioned name too: what a torch wheel's libraries need after patchelf
        os.symlink(out.name, tmp / "libamdhip64.so")
        try:
            move_into_place(tmp, out.parent)
        except OSError:
            if not out.is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Stub(major, out, versions)


__all__ = ["FUNCTIONS", "SOURCE", "Stub", "build_stub", "hip_major_of_headers", "version_script"]
