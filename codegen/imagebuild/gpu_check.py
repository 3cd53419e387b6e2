"""Asks the installed library whether it would run on the spec's GPU, without that GPU.

PyTorch calls `aotriton::v2::flash::check_gpu(stream)` before it picks flash attention; the call
reads the device's arch name (`hipDeviceProp_t::gcnArchName`), maps it with the library's GPU
classifier and looks the GPU up in every attention kernel's dispatch table. Any miss returns
`hipErrorNoBinaryForGpu` and PyTorch falls back to the math backend.

Here that very call runs on this machine: a small stand-in HIP device (templates/build/
hip_device_stub.cc.j2, compiled with the build's C++ compiler and HIP headers) is preloaded into a
child process that loads the installed library and calls `check_gpu`. The device reports the
spec's arch; two controls report an arch no classifier knows and the registration donor (known to
the classifier, absent from this build's tables), and must be refused: so a pass means the
library's classifier *and* its dispatch tables know the arch. What it cannot show: that the
kernels run on the card (that needs the GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from codegen.core import processes
from codegen.core.fsutil import move_into_place, write_if_changed
from codegen.imagebuild.configure import render_support
from codegen.imagebuild.prereq import hip_header
from codegen.imagebuild.verify import REQUIRED_SYMBOLS, defined_symbols

ENV_ARCH = "MI100_CODEGEN_STAND_IN_ARCH"
ENV_NAME = "MI100_CODEGEN_STAND_IN_NAME"
ENV_CUS = "MI100_CODEGEN_STAND_IN_CUS"
ENV_WARP = "MI100_CODEGEN_STAND_IN_WARP"
STUB_TEMPLATE = "build/hip_device_stub.cc.j2"
UNKNOWN_ARCH = "gfx000"  # no AMD GPU has this name: every classifier must refuse it
HIP_SUCCESS = 0
HIP_ERROR_NAMES = {HIP_SUCCESS: "hipSuccess", 209: "hipErrorNoBinaryForGpu"}  # hip_runtime_api.h, HIP 5 and 6


def describe(code: int | str) -> str:
    """hipError_t as its name where known (`hipErrorNoBinaryForGpu`), else the number; error text as is."""
    if isinstance(code, str):
        return code
    return HIP_ERROR_NAMES.get(code, f"hipError_t {code}")

# Runs in the child: load the library (the stand-in device is already preloaded) and call check_gpu
# with the null stream, PyTorch's default. Prints the hipError_t it returns.
_PROBE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
fn = getattr(lib, sys.argv[2])
fn.argtypes = [ctypes.c_void_p]  # StreamTemplate<hipStream_t>: one pointer, trivially copyable
fn.restype = ctypes.c_int
print(fn(None))
"""


class GpuCheckError(Exception):
    """The check could not run (compiler, headers, library); not a verdict on the library."""


@dataclass
class GpuCheck:
    arch: str
    results: dict[str, int | str] = field(default_factory=dict)  # reported arch -> hipError_t or error
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {"ok": self.ok, "arch": self.arch, "check_gpu": dict(self.results), "problems": list(self.problems)}


def hip_include_dir(hip_dir: str | Path | None) -> Path | None:
    """The include directory with hip/hip_runtime_api.h that belongs to the HIP the build used."""
    header = hip_header(Path(hip_dir) if hip_dir else None, "hip_runtime_api.h")
    return header.parent.parent if header else None


def compile_stub(cxx: str, include: Path, work: Path) -> Path:
    """Render and compile the stand-in device into WORK/libmi100_hip_device_stub.so (atomically)."""
    work.mkdir(parents=True, exist_ok=True)
    src = work / "hip_device_stub.cc"
    write_if_changed(src, render_support(STUB_TEMPLATE, env_arch=ENV_ARCH, env_name=ENV_NAME, env_cus=ENV_CUS,
                                         env_warp=ENV_WARP))
    out = work / "libmi100_hip_device_stub.so"
    tmp = work / f".{out.name}.{os.getpid()}.tmp"
    cmd = [cxx, "-std=c++17", "-shared", "-fPIC", "-O1", "-D__HIP_PLATFORM_AMD__", f"-I{include}", str(src),
           "-o", str(tmp)]
    try:
        try:
            proc = processes.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuCheckError(f"cannot compile the stand-in HIP device with {cxx}: {exc}") from None
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            raise GpuCheckError(f"cannot compile the stand-in HIP device ({' '.join(cmd)}):\n{tail}")
        move_into_place(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)  # a failed or interrupted compile leaves nothing behind
    return out


def call_check_gpu(lib: Path, symbol: str, stub: Path, arch: str, *, compute_units: int,
                   warp_size: int) -> int | str:
    """check_gpu's hipError_t when the device reports ARCH, or the child's error text."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(p for p in (str(stub), env.get("LD_PRELOAD", "")) if p)
    env.update({ENV_ARCH: f"{arch}:sramecc-:xnack-", ENV_NAME: f"stand-in {arch}", ENV_CUS: str(compute_units),
                ENV_WARP: str(warp_size)})
    try:
        proc = processes.run([sys.executable, "-c", _PROBE, str(lib), symbol], env=env, capture_output=True,
                             text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run: {exc}"
    out = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not out or not out[-1].lstrip("-").isdigit():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return f"could not run (exit {proc.returncode}): {' / '.join(tail)}"
    return int(out[-1])


def check_symbol(lib: Path) -> str:
    prefix = REQUIRED_SYMBOLS["aotriton::v2::flash::check_gpu"]
    found = sorted(s for s in defined_symbols(lib) if s.startswith(prefix))
    if not found:
        raise GpuCheckError(f"{lib.name} does not export aotriton::v2::flash::check_gpu")
    return found[0]


def run_gpu_check(lib: Path, *, arch: str, like: str, compute_units: int, warp_size: int, cxx: str,
                  hip_dir: str | Path | None, work: Path) -> GpuCheck:
    """check_gpu for ARCH must succeed; for an unknown arch and for LIKE (the donor, not built) it must fail."""
    include = hip_include_dir(hip_dir)
    if include is None:
        raise GpuCheckError("no HIP headers (hip/hip_runtime_api.h) next to the HIP the build used")
    symbol = check_symbol(lib)
    stub = compile_stub(cxx, include, work)
    check = GpuCheck(arch=arch)
    for reported in (arch, UNKNOWN_ARCH, like):
        if reported in check.results:
            continue
        code = call_check_gpu(lib, symbol, stub, reported, compute_units=compute_units, warp_size=warp_size)
        if isinstance(code, str):  # e.g. the HIP runtime is not on the loader path: no verdict either way
            raise GpuCheckError(f"check_gpu with a stand-in {reported}: {code}")
        check.results[reported] = code
    for reported, code in check.results.items():
        if reported == arch and code != HIP_SUCCESS:
            check.problems.append(
                f"check_gpu refuses {arch} ({describe(code)}): the library's GPU classifier or its dispatch tables "
                f"do not know the arch, so PyTorch would fall back to the math backend")
        elif reported != arch and code == HIP_SUCCESS:
            check.problems.append(
                f"check_gpu accepts the control {reported}: the check cannot tell archs apart, so its pass for "
                f"{arch} proves nothing")
    return check
