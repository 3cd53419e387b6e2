"""`build`'s GPU check (codegen.imagebuild.gpu_check): check_gpu of the installed library on a stand-in device.

The verdict rules and the error paths run everywhere. The stand-in device itself needs HIP's
headers and a C++ compiler (the build's prerequisites); without them that test skips. Real
libraries are checked by tests/test_build_real.py (marked `build`) and by every `build`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.imagebuild import gpu_check
from codegen.imagebuild.gpu_check import GpuCheckError, run_gpu_check
from conftest import cached_sysroot

CHECK_GPU = "_ZN8aotriton2v25flash9check_gpuENS_14StreamTemplateIP12ihipStream_tEE"


def _fake_calls(monkeypatch, answers: dict[str, int | str]) -> list[str]:
    asked: list[str] = []
    monkeypatch.setattr(gpu_check, "hip_include_dir", lambda hip_dir: Path("/hip/include"))
    monkeypatch.setattr(gpu_check, "check_symbol", lambda lib: CHECK_GPU)
    monkeypatch.setattr(gpu_check, "compile_stub", lambda cxx, include, work: work / "stub.so")

    def call(lib, symbol, stub, arch, **kw):
        asked.append(arch)
        return answers[arch]

    monkeypatch.setattr(gpu_check, "call_check_gpu", call)
    return asked


def _run(tmp_path: Path, arch: str = "gfx1030", like: str = "gfx1100"):
    return run_gpu_check(tmp_path / "lib.so", arch=arch, like=like, compute_units=80, warp_size=32, cxx="c++",
                         hip_dir=None, work=tmp_path)


def test_pass_needs_the_arch_accepted_and_both_controls_refused(monkeypatch, tmp_path):
    asked = _fake_calls(monkeypatch, {"gfx1030": 0, "gfx000": 209, "gfx1100": 209})
    check = _run(tmp_path)
    assert asked == ["gfx1030", "gfx000", "gfx1100"]
    assert check.ok and check.problems == []
    assert check.summary()["check_gpu"] == {"gfx1030": 0, "gfx000": 209, "gfx1100": 209}


def test_refused_arch_is_a_problem_naming_the_fallback(monkeypatch, tmp_path):
    _fake_calls(monkeypatch, {"gfx1030": 209, "gfx000": 209, "gfx1100": 209})
    check = _run(tmp_path)
    assert not check.ok
    assert check.problems == ["check_gpu refuses gfx1030 (hipErrorNoBinaryForGpu): the library's GPU classifier "
                              "or its dispatch tables do not know the arch, so PyTorch would fall back to the math "
                              "backend"]


def test_a_control_accepted_voids_the_pass(monkeypatch, tmp_path):
    _fake_calls(monkeypatch, {"gfx1030": 0, "gfx000": 0, "gfx1100": 209})
    check = _run(tmp_path)
    assert [p.split(":")[0] for p in check.problems] == ["check_gpu accepts the control gfx000"]


def test_a_child_that_cannot_run_is_no_verdict(monkeypatch, tmp_path):
    """The library could not even be loaded (say the HIP runtime is not on the loader path): the
    check could not run, which `build` reports as a warning, not as a wrong answer."""
    _fake_calls(monkeypatch, {"gfx1030": "could not run (exit 1): OSError: libamdhip64.so.5: cannot open",
                              "gfx000": 209, "gfx1100": 209})
    with pytest.raises(GpuCheckError, match="stand-in gfx1030: could not run .*libamdhip64.so.5: cannot open"):
        _run(tmp_path)


def test_missing_headers_and_a_failing_compiler_are_check_errors_not_verdicts(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "hip_include_dir", lambda hip_dir: None)
    with pytest.raises(GpuCheckError, match="no HIP headers"):
        _run(tmp_path)
    with pytest.raises(GpuCheckError, match="cannot compile the stand-in HIP device") as exc:
        gpu_check.compile_stub("false", tmp_path, tmp_path / "w")
    assert "false -std=c++17" in str(exc.value)
    assert not list((tmp_path / "w").glob("*.so")) and not list((tmp_path / "w").glob(".*.tmp"))


def test_describe_names_the_codes_it_knows():
    assert gpu_check.describe(0) == "hipSuccess"
    assert gpu_check.describe(209) == "hipErrorNoBinaryForGpu"
    assert gpu_check.describe(101) == "hipError_t 101"
    assert gpu_check.describe("could not run") == "could not run"


# A library with upstream's check_gpu signature whose answer depends only on the reported arch:
# it exercises the stand-in device, the preload and the call, not AOTriton (test_build_real.py does).
_FIXTURE_LIB = r"""
#include <hip/hip_runtime_api.h>
#include <cstring>
namespace aotriton {
template <typename T> class StreamTemplate { public: T stream_; };
namespace v2::flash {
hipError_t check_gpu(StreamTemplate<hipStream_t>) {
  int dev = -1;
  hipDeviceProp_t prop;
  if (hipGetDevice(&dev) != hipSuccess || hipGetDeviceProperties(&prop, dev) != hipSuccess)
    return hipErrorInvalidDevice;
  if (prop.multiProcessorCount != 80 || prop.warpSize != 32)
    return hipErrorInvalidValue;
  return std::strncmp(prop.gcnArchName, "gfx1030:", 8) == 0 ? hipSuccess : hipErrorNoBinaryForGpu;
}
}
}
"""


def _cxx() -> str | None:
    return next((c for c in ("clang++", "g++", "c++") if shutil.which(c)), None)


def test_stand_in_device_answers_a_library_built_against_hip(tmp_path):
    from codegen.imagebuild.prereq import find_cmake_package

    # the system's HIP, else the private HIP 6 sysroot bundle build makes (CI fetches it)
    sysroot = cached_sysroot(6)
    hip_dir = find_cmake_package("hip") or (find_cmake_package("hip", [sysroot.prefix]) if sysroot else None)
    include = gpu_check.hip_include_dir(hip_dir)
    cxx = _cxx()
    if include is None or cxx is None:
        pytest.skip("needs HIP's headers (apt-get install -y libamdhip64-dev, or the HIP 6 sysroot: "
                    "tests/test_bundle_sysroot.py -m slow) and a C++ compiler, as `build` does")
    src = tmp_path / "fixture.cc"
    src.write_text(_FIXTURE_LIB)
    lib = tmp_path / "libfixture.so"
    subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__", f"-I{include}", str(src),
                    "-o", str(lib)], check=True)
    assert gpu_check.check_symbol(lib) == CHECK_GPU
    check = run_gpu_check(lib, arch="gfx1030", like="gfx1100", compute_units=80, warp_size=32, cxx=cxx,
                          hip_dir=hip_dir, work=tmp_path / "w")
    assert check.summary()["check_gpu"] == {"gfx1030": 0, "gfx000": 209, "gfx1100": 209}, check.problems
    assert check.ok
    # the same library asked for an arch it does not know: a problem, not a pass
    check = run_gpu_check(lib, arch="gfx906", like="gfx90a", compute_units=80, warp_size=32, cxx=cxx,
                          hip_dir=hip_dir, work=tmp_path / "w")
    assert not check.ok and check.results["gfx906"] == 209
