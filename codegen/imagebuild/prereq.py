"""Prerequisites of an AOTriton build, checked up front: each missing piece is named with the
command that installs it (Debian 12 package names; pip where that is the usual route)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import InvalidVersion, Version

from codegen.core import processes
from codegen.core.errors import EnvironmentMissing
from codegen.models import TargetSpec
from codegen.formats.spec import load_spec
from codegen.toolchain import generator_requirements, triton_mismatch, venv_fix
from codegen.toolchain.interpreter import probe as probe_python

# The Triton that compiles the kernels comes from the spec (toolchain.triton; codegen.toolchain):
# for gfx908 3.5.1 .. 3.8.x (3.4 needs an external ld.lld; 3.3.1 and 3.9.0 fail), gfx906 3.8 only.
CMAKE_MIN = Version("3.18")

HIP_PACKAGES = "hipcc libamdhip64-dev rocm-device-libs libhsa-runtime-dev libamd-comgr-dev"
APT_ALL = f"apt-get install -y cmake ninja-build g++ pkg-config liblzma-dev {HIP_PACKAGES}"

# CMake package -> Debian package that ships its config file (find_package(hip) pulls them all).
HIP_CMAKE_PACKAGES = (
    ("hip", "libamdhip64-dev"),
    ("amd_comgr", "libamd-comgr-dev"),
    ("hsa-runtime64", "libhsa-runtime-dev"),
    ("AMDDeviceLibs", "rocm-device-libs"),
)
HIP_VERSION_RE = {k: re.compile(rf"#define\s+HIP_VERSION_{k}\s+(\d+)") for k in ("MAJOR", "MINOR", "PATCH")}
MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu")


class PrerequisiteError(EnvironmentMissing):
    """Tools or libraries the build needs are missing; the message lists each with its fix
    (exit 3, the one rule for a missing environment)."""


@dataclass(frozen=True)
class Toolchain:
    cmake: str
    cmake_version: str
    ninja: str
    ninja_version: str
    cxx: str
    cc: str
    hip_dir: str | None  # directory holding hip-config.cmake
    hip_version: tuple[int, int, int] | None
    python: str  # interpreter whose environment provides triton and the generator's packages
    site_packages: tuple[str, ...] = ()
    triton_version: str | None = None
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def needs_hip_compat(self) -> bool:
        """hipStreamGetDevice appeared in HIP 5.6; older HIP needs our compatibility header."""
        return self.hip_version is not None and self.hip_version[:2] < (5, 6)

    def summary(self) -> dict:
        return {
            "cmake": self.cmake_version, "ninja": self.ninja_version, "cxx": self.cxx,
            "hip": ".".join(map(str, self.hip_version)) if self.hip_version else None,
            "python": self.python, "triton": self.triton_version,
        }


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """A probe of a tool (`--version`, pkg-config): its whole process group killed after `timeout`."""
    kw.setdefault("stdin", subprocess.DEVNULL)
    return processes.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _pkg_config_lacks(pkgconfig: str, package: str) -> bool:
    try:
        return _run([pkgconfig, "--exists", package]).returncode != 0
    except (OSError, subprocess.TimeoutExpired):
        return True


def _tool_version(exe: str) -> str:
    try:
        out = _run([exe, "--version"], timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"(\d+\.\d+(\.\d+)?)", out)
    return m.group(1) if m else ""


def _prefixes() -> list[Path]:
    """CMAKE_PREFIX_PATH's folders, $ROCM_PATH, $HIP_PATH, then the usual ones; each once."""
    out = [Path(p) for p in os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
    out += [Path(os.environ[var]) for var in ("ROCM_PATH", "HIP_PATH") if os.environ.get(var)]
    return list(dict.fromkeys(out + [Path("/opt/rocm"), Path("/usr"), Path("/usr/local")]))


def find_cmake_package(name: str, prefixes: list[Path] | None = None) -> Path | None:
    """The directory holding `<name>-config.cmake` / `<Name>Config.cmake` under the usual prefixes."""
    files = (f"{name}-config.cmake", f"{name}Config.cmake", f"{name.lower()}-config.cmake")
    for prefix in prefixes or _prefixes():
        libdirs = ["lib", "lib64", "share"] + [f"lib/{m}" for m in MULTIARCH]
        for lib in libdirs:
            d = prefix / lib / "cmake" / name
            if any((d / f).is_file() for f in files):
                return d
    return None


def hip_header(hip_dir: Path | None, name: str) -> Path | None:
    """hip/NAME of the HIP whose cmake config is HIP_DIR (or of the usual prefixes)."""
    candidates = []
    if hip_dir is not None:
        # <prefix>/lib[/<multiarch>]/cmake/hip -> <prefix>/include
        for up in (3, 4):
            with contextlib.suppress(IndexError):
                candidates.append(hip_dir.parents[up - 1] / "include" / "hip" / name)
    candidates += [p / "include" / "hip" / name for p in _prefixes()]
    return next((c for c in candidates if c.is_file()), None)


def hip_version_of(hip_dir: Path | None) -> tuple[int, int, int] | None:
    """HIP version from hip_version.h next to the cmake config (or in the usual include dirs)."""
    header = hip_header(hip_dir, "hip_version.h")
    if header is None:
        return None
    text = header.read_text(errors="replace")
    parts = [HIP_VERSION_RE[k].search(text) for k in ("MAJOR", "MINOR", "PATCH")]
    if all(parts):
        return tuple(int(p.group(1)) for p in parts)  # type: ignore[return-value]
    return None


def clang_major(exe: str | None) -> int | None:
    """The major version a Clang reports (`clang version 19.1.7 …`); None for GCC or no answer.
    Asked once per compiler file (finding the compiler and checking its minimum ask the same one)."""
    if not exe:
        return None
    try:
        st = os.stat(exe)
    except OSError:
        return None
    return _clang_major(os.path.realpath(exe), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _clang_major(exe: str, _mtime_ns: int, _size: int) -> int | None:
    try:
        out = _run([exe, "--version"], timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"clang version (\d+)", out)
    return int(m.group(1)) if m else None


def find_compiler(clang: str, others: tuple[str, ...]) -> str | None:
    """The newest Clang first, as upstream builds with (ROCm's clang via hipcc): `clang++` or a
    versioned `clang++-N` on PATH (Debian's hipcc brings clang-15 without the plain name; 0.12b+
    needs Clang 16+, Debian 12 has clang-16 and clang-19), else GCC (enough for 0.10b-0.11.2b)."""
    found: dict[int, str] = {}
    plain = shutil.which(clang)
    if plain:
        found[clang_major(plain) or 0] = plain
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        for p in Path(folder or ".").glob(f"{clang}-[0-9]*"):
            tail = p.name[len(clang) + 1:]
            if tail.isdigit() and os.access(p, os.X_OK):
                found.setdefault(int(tail), str(p))
    if found:
        return found[max(found)]
    return next((shutil.which(o) for o in others if shutil.which(o)), None)


def _check_tools(missing: list[str], warnings: list[str], min_clang: int | None = None) -> dict:
    """cmake, ninja, the C/C++ compilers, pkg-config and liblzma."""
    cmake = shutil.which("cmake")
    cmake_v = _tool_version(cmake) if cmake else ""
    if not cmake:
        missing.append("cmake (>= 3.18): apt-get install -y cmake   (or: pip install cmake)")
    else:
        try:
            if Version(cmake_v) < CMAKE_MIN:
                missing.append(f"cmake >= 3.18 (found {cmake_v} at {cmake}): pip install 'cmake>=3.26'")
        except InvalidVersion:
            warnings.append(f"cannot read the version of {cmake}")
    ninja = shutil.which("ninja")
    if not ninja:
        missing.append("ninja: apt-get install -y ninja-build   (or: pip install ninja)")
    cxx = os.environ.get("CXX") or find_compiler("clang++", ("g++", "c++"))
    cc = os.environ.get("CC") or find_compiler("clang", ("gcc", "cc"))
    if not cxx or not shutil.which(cxx):
        missing.append("a C++20 compiler: apt-get install -y clang-19")
    elif min_clang and (clang_major(shutil.which(cxx)) or 0) < min_clang:
        missing.append(f"Clang >= {min_clang} as the C++ compiler (found {cxx}): this release's runtime captures "
                       f"structured bindings in lambdas, which older Clang rejects, and GCC rejects its "
                       f"attribute order: apt-get install -y clang-19 (or CXX=<a newer clang++>)")
    if not cc or not shutil.which(cc):
        missing.append("a C compiler: apt-get install -y clang-19")
    pkgconfig = shutil.which("pkg-config") or shutil.which("pkgconf")
    if not pkgconfig:
        missing.append("pkg-config: apt-get install -y pkg-config")
    elif _pkg_config_lacks(pkgconfig, "liblzma"):
        missing.append("liblzma (development files, found through pkg-config): apt-get install -y liblzma-dev")
    return {"cmake": cmake or "", "cmake_version": cmake_v, "ninja": ninja or "",
            "ninja_version": _tool_version(ninja) if ninja else "",
            "cxx": (shutil.which(cxx) or cxx) if cxx else cxx, "cc": (shutil.which(cc) or cc) if cc else cc}


def _check_hip(missing: list[str], hip_prefix: Path | None = None) -> tuple[Path | None, str | None]:
    """HIP's CMake packages, headers and hipcc; the common way to get them all is said once.

    `hip_prefix` (bundle build's private sysroot, codegen.ship.sysroot): HIP is taken from there
    alone, and neither hipcc nor the device libraries are asked for: the runtime is compiled by the
    host's C++ compiler and HIP 6/7's config loads AMDDeviceLibs only QUIET."""
    prefixes = [hip_prefix] if hip_prefix is not None else _prefixes()
    hip_dir = find_cmake_package("hip", prefixes)
    wanted = [(n, p) for n, p in HIP_CMAKE_PACKAGES if hip_prefix is None or n != "AMDDeviceLibs"]
    absent = [(name, pkg) for name, pkg in wanted if find_cmake_package(name, prefixes) is None]
    names = ", ".join(f"'{name}'" for name, _ in absent)
    if absent and hip_prefix is not None:
        missing.append(f"HIP: the sysroot {hip_prefix} lacks the CMake package(s) {names}: remove that "
                       f"folder and run the command again (it is made anew; docs/bundles.md)")
    elif absent:
        missing.append(f"HIP: CMake package(s) {names} (HIP headers and CMake config): apt-get install -y "
                       f"{' '.join(sorted({pkg for _, pkg in absent}))}   (all of HIP on Debian 12: apt-get "
                       f"install -y {HIP_PACKAGES}; or ROCm under /opt/rocm, or set ROCM_PATH)")
    hip_version = hip_version_of(hip_dir) if hip_dir else None
    if hip_dir is not None and hip_version is None:
        missing.append(f"HIP headers (hip/hip_version.h) for {hip_dir}: apt-get install -y libamdhip64-dev")
    if (hip_prefix is None and hip_dir is not None and shutil.which("hipcc") is None
            and not (hip_dir.parents[2] / "bin" / "hipcc").exists()):
        missing.append("hipcc: apt-get install -y hipcc")
    return hip_dir, hip_version


def _check_python(tree: Path, python: str, need_triton: bool, python_binding: bool, missing: list[str],
                  warnings: list[str], spec: TargetSpec | None = None) -> dict:
    """The interpreter's version, the tree's requirements and (for images) a compatible Triton."""
    names = list(generator_requirements(tree, python_binding))
    probe = probe_python(python, names)
    py_v = tuple(probe["python"])
    if py_v < (3, 10):
        missing.append(f"Python >= 3.10 (found {'.'.join(map(str, py_v))} at {python})")
    absent = [n for n in names if probe["found"].get(n) is None]
    if absent:
        missing.append(f"Python packages of the tree's requirements.txt in {python}'s environment: "
                       f"leave out --python (the build venv holds them), or, where that environment is yours "
                       f"to change and not the torch one: {python} -m pip install {' '.join(absent)}")
    triton_v = probe["triton"]
    if need_triton:
        target = spec or load_spec(None).spec
        why = triton_mismatch(target, triton_v)
        if why is not None:
            missing.append(f"a compatible Triton in {python}'s environment ({why}): {venv_fix(target)}")
    return {"site_packages": tuple(probe["site"]), "triton_version": triton_v}


def _refuse(missing: list[str]) -> None:
    raise PrerequisiteError(
        "missing build prerequisites:\n" + "\n".join(f"- {m}" for m in missing),
        hint=f"on Debian 12 everything system-wide: {APT_ALL}; Triton and the generator's packages: "
             f"the build venv that build creates when --python is left out (never the torch environment)",
    )


def check_prerequisites(tree: Path, python: str | Callable[[], str], *, need_triton: bool, python_binding: bool = False,
                        spec: TargetSpec | None = None, min_clang: int | None = None,
                        hip_prefix: Path | None = None) -> Toolchain:
    """Find every tool the build needs; raise one PrerequisiteError listing all that are missing.
    The Triton in `python`'s environment must be one the spec's toolchain names (default: the
    embedded gfx908 spec's). `python` may be a function that finds it (the build venv, created on
    first use): called only once the system's tools are all there."""
    missing: list[str] = []
    warnings: list[str] = []
    tools = _check_tools(missing, warnings, min_clang)
    hip_dir, hip_version = _check_hip(missing, hip_prefix)
    if callable(python):
        if missing:  # the system's tools first: no build venv is created for a build that cannot run
            _refuse(missing)
        python = python()
    py = _check_python(tree, python, need_triton, python_binding, missing, warnings, spec)
    if missing:
        _refuse(missing)
    return Toolchain(**tools, hip_dir=str(hip_dir) if hip_dir else None, hip_version=hip_version,
                     python=python, **py, warnings=tuple(warnings))
