"""Prerequisite checks: every missing piece named with its install command."""

from __future__ import annotations

import shutil
import sys

import pytest

from codegen.imagebuild import prereq
from codegen.imagebuild.prereq import PrerequisiteError, check_prerequisites
from codegen.toolchain import requirement_names


def test_requirement_names(tmp_path):
    (tmp_path / "requirements.txt").write_text("numpy\n# comment\npandas>=2  # x\n-r other.txt\nPyYAML==6\n")
    assert requirement_names(tmp_path) == ["PyYAML", "numpy", "pandas"]


def test_everything_missing_is_listed(tmp_path, monkeypatch):
    (tmp_path / "requirements.txt").write_text("surely-not-installed-pkg-xyz\n")
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    monkeypatch.setattr(prereq, "find_cmake_package", lambda *_a, **_k: None)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(PrerequisiteError) as ei:
        check_prerequisites(tmp_path, sys.executable, need_triton=True)
    msg = str(ei.value)
    for needle in ("apt-get install -y cmake", "ninja-build", "clang-19", "pkg-config",
                   "libamdhip64-dev", "libamd-comgr-dev", "libhsa-runtime-dev", "rocm-device-libs",
                   "pip install surely-not-installed-pkg-xyz"):
        assert needle in msg, needle
    assert "apt-get install -y" in ei.value.hint
    assert msg.count("all of HIP on Debian 12") == 1  # each distinct hint once


def test_triton_version_window(tmp_path, monkeypatch):
    monkeypatch.setattr(prereq, "probe_python", lambda _py, names: {
        "found": {n: "1" for n in names}, "site": [], "python": [3, 11, 7], "triton": "3.9.0"})
    try:
        check_prerequisites(tmp_path, sys.executable, need_triton=True)
    except PrerequisiteError as exc:
        assert "compatible Triton" in str(exc) and "'triton>=3.5.1,<3.9'" in str(exc)
        assert "build venv" in str(exc) and "never pip install triton into the torch environment" in str(exc)
    else:
        pytest.fail("triton 3.9.0 accepted")


def test_triton_version_from_the_spec(tmp_path, monkeypatch):
    """gfx906's toolchain is Triton 3.8 only: 3.5.1 refused, 3.8.0 accepted (also AMD's fork's
    local version 3.8.0+rocm)."""
    from codegen.formats.spec import load_spec

    gfx906 = load_spec("rules/mi50.yaml").spec
    for version, ok in (("3.5.1", False), ("3.8.0", True), ("3.8.0+rocm7.1", True), ("3.9.0", False)):
        monkeypatch.setattr(prereq, "probe_python", lambda _py, names, v=version: {
            "found": {n: "1" for n in names}, "site": [], "python": [3, 11, 7], "triton": v})
        monkeypatch.setattr(prereq, "_check_tools", lambda *_a, **_k: dict(cmake="c", cmake_version="3.28", ninja="n", ninja_version="1.11", cxx="g++", cc="gcc"))
        monkeypatch.setattr(prereq, "_check_hip", lambda *_a: (None, None))
        if ok:
            assert check_prerequisites(tmp_path, sys.executable, need_triton=True, spec=gfx906).triton_version == version
        else:
            with pytest.raises(PrerequisiteError, match=r"gfx906.*'>=3.8.0,<3.9'"):
                check_prerequisites(tmp_path, sys.executable, need_triton=True, spec=gfx906)


def test_compiler_choice_prefers_the_newest_clang(tmp_path, monkeypatch):
    """0.12b+ headers need Clang (GCC rejects `[[deprecated]] AOTRITON_API` in a class head);
    Debian's hipcc brings clang-15 without the plain `clang++` name; the newest Clang wins."""
    def tool(name, says=""):
        p = tmp_path / name
        p.write_text(f"#!/bin/sh\necho '{says}'\n")
        p.chmod(0o755)
        return str(p)

    monkeypatch.setenv("PATH", str(tmp_path))
    assert prereq.find_compiler("clang++", ("g++",)) is None
    gxx = tool("g++", "g++ (Debian 12.2.0-14) 12.2.0")
    assert prereq.find_compiler("clang++", ("g++",)) == gxx
    tool("clang++-9")
    newest = tool("clang++-15", "Debian clang version 15.0.6")
    tool("clang++-15.bak")
    tool("clang++-tidy")
    assert prereq.find_compiler("clang++", ("g++",)) == newest
    v19 = tool("clang++-19", "Debian clang version 19.1.7")
    assert prereq.find_compiler("clang++", ("g++",)) == v19
    plain = tool("clang++", "clang version 20.0.0")
    assert prereq.find_compiler("clang++", ("g++",)) == plain
    assert prereq.clang_major(plain) == 20 and prereq.clang_major(gxx) is None


def test_a_release_that_needs_a_newer_clang_refuses_an_older_one(tmp_path, monkeypatch):
    """0.12b+ (adapter.min_clang 16): Clang 15 or GCC is refused before configure, naming the fix."""
    old = tmp_path / "clang++-15"
    old.write_text("#!/bin/sh\necho 'Debian clang version 15.0.6'\n")
    old.chmod(0o755)
    monkeypatch.setenv("CXX", str(old))
    missing: list[str] = []
    prereq._check_tools(missing, [], min_clang=16)
    assert any("Clang >= 16" in m and "clang-19" in m for m in missing), missing
    missing = []
    prereq._check_tools(missing, [], min_clang=None)
    assert not any("Clang >=" in m for m in missing), missing


def test_no_build_venv_while_system_tools_are_missing(tmp_path, monkeypatch):
    """build finds its interpreter (creating the build venv) only once cmake, ninja, compilers and
    HIP are all there: a build that cannot run downloads no Triton."""
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    monkeypatch.setattr(prereq, "find_cmake_package", lambda *_a, **_k: None)
    with pytest.raises(PrerequisiteError, match="apt-get install -y cmake") as ei:
        check_prerequisites(tmp_path, lambda: pytest.fail("build venv created"), need_triton=True)
    assert ei.value.exit_code == 3 and "build venv" in ei.value.hint


def test_build_interpreter_is_the_build_venv_unless_python_given(tmp_path, monkeypatch):
    """build: no --python -> the build venv of the spec's Triton with the tree's generator
    requirements (pybind11 too for --python-binding); --python as given; both together refused."""
    from rich.console import Console

    from codegen.imagebuild import builder
    from codegen.core.errors import UserError
    from codegen.formats.spec import load_spec
    from codegen.toolchain.interpreter import CompilerPython

    (tmp_path / "requirements.txt").write_text("numpy\npandas\npybind11\nwheel\n")
    spec = load_spec("rules/mi50.yaml").spec
    asked = []

    def fake(spec, stage, *, triton=None, requirements=(), console=None, **_k):
        asked.append((stage, triton, tuple(requirements)))
        return CompilerPython(python="/cache/venv/bin/python", triton=triton or "3.8.0", origin="build venv",
                              venv=tmp_path)

    monkeypatch.setattr(builder, "compiler_python", fake)
    quiet = Console(quiet=True)
    opts = builder.BuildOptions(tree=tmp_path, prefix=tmp_path / "p", python_binding=True, triton_version="3.8.0")
    assert builder.build_python(opts, tmp_path, spec, quiet) == "/cache/venv/bin/python"
    assert asked == [("build", "3.8.0", ("numpy", "pandas", "pybind11"))]
    given = builder.BuildOptions(tree=tmp_path, prefix=tmp_path / "p", python=sys.executable)
    assert builder.build_python(given, tmp_path, spec, quiet) == sys.executable and len(asked) == 1
    with pytest.raises(UserError, match="--triton-version picks the build venv"):
        builder.build_python(builder.BuildOptions(tree=tmp_path, prefix=tmp_path / "p", python=sys.executable,
                                                  triton_version="3.8.0"), tmp_path, spec, quiet)


def _sysroot(root):
    """A private HIP sysroot's `usr` as codegen.ship.sysroot unpacks it: the three CMake packages
    HIP 6/7's config loads, hip_version.h, no hipcc and no device libraries."""
    cm = root / "lib" / "x86_64-linux-gnu" / "cmake"
    for name in ("hip", "amd_comgr", "hsa-runtime64"):
        (cm / name).mkdir(parents=True)
        (cm / name / f"{name}-config.cmake").write_text("# stand-in\n")
    (root / "include" / "hip").mkdir(parents=True)
    (root / "include" / "hip" / "hip_version.h").write_text(
        "#define HIP_VERSION_MAJOR 6\n#define HIP_VERSION_MINOR 4\n#define HIP_VERSION_PATCH 43484\n")
    (root / "bin").mkdir()
    return root


def test_a_bundle_sysroot_needs_neither_hipcc_nor_device_libs(tmp_path, monkeypatch):
    """bundle build compiles the runtime with the host's compiler against the sysroot alone: a machine
    with no system HIP at all builds (the system's HIP is not consulted, not even when present)."""
    usr = _sysroot(tmp_path / "usr")
    monkeypatch.setattr(shutil, "which", lambda *_a, **_k: None)
    missing: list[str] = []
    hip_dir, version = prereq._check_hip(missing, usr)
    assert missing == []
    assert hip_dir == usr / "lib" / "x86_64-linux-gnu" / "cmake" / "hip"
    assert version == (6, 4, 43484)
    # the same folder as an ordinary prefix is not enough for `build`: hipcc and the device libs are named
    monkeypatch.setattr(prereq, "_prefixes", lambda: [usr])
    missing = []
    prereq._check_hip(missing, None)
    assert any("AMDDeviceLibs" in m for m in missing) and any(m.startswith("hipcc") for m in missing)
    # an empty sysroot is named as the HIP packages it lacks
    missing = []
    assert prereq._check_hip(missing, tmp_path / "empty") == (None, None)
    assert len(missing) == 1 and "remove that folder" in missing[0] and "apt-get" not in missing[0]
