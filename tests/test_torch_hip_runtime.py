"""`torch install` refuses a library built against another ROCm major than torch's HIP runtime
(real ELF fixtures built with gcc: fake libamdhip64.so.N with their SONAME and the real one's
version nodes, a torch whose libtorch_hip.so links one, AOTriton libraries that link another),
before anything is swapped."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.formats.elf import read_dynamic
from codegen.ship.hip import HipRuntime, hip_mismatch, library_hip, torch_hip
from test_torch_install import (
    SYM_BWD,
    SYM_CHECK,
    SYM_FWD,
    _cc,
    aot_source,
    build_prefix,
    build_torch,
    cli,
    load_which,
    need_cc,
    snapshot,
)


def fake_hip(path: Path, major: int) -> Path:
    """A HIP runtime of `major` as the real one versions its symbols: `hipInit@@hip_4.2`, and the
    device-properties call of its ROCm (`hipGetDevicePropertiesR0600@@hip_6.0` from 6 on)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    props = "hipGetDevicePropertiesR0600" if major >= 6 else "hipGetDeviceProperties"
    script = Path(f"{path}.map")
    script.write_text("hip_4.2 { global: hipInit; local: *; };\nhip_6.0 { global: hipGetDevicePropertiesR0600; } hip_4.2;\n"
                      if major >= 6 else "hip_4.2 { global: hipInit; hipGetDeviceProperties; local: *; };\n")
    _cc(path, f"int hipInit(unsigned f) {{ return (int)f; }}\nint {props}(void *p, int d) {{ return d; }}\n",
        f"-Wl,-soname,libamdhip64.so.{major}", f"-Wl,--version-script={script}")
    script.unlink()
    return path


def torch_with_hip(site: Path, major: int | None, ship: bool = True, hip: str = "6.4.43482") -> Path:
    """A fake ROCm torch and the AOTriton it links. `ship`: laid out the way PyTorch's wheel
    scripts (.ci/manywheel/build_rocm.sh + build_common.sh) leave a ROCm wheel: the HIP runtime
    copied into torch/lib under the unversioned name `libamdhip64.so` (its SONAME stays
    `libamdhip64.so.<major>`), every DT_NEEDED on it rewritten to `libamdhip64.so`, DT_RPATH
    `$ORIGIN`. Not `ship`: a from-source build that needs the system's `libamdhip64.so.<major>`."""
    root = build_torch(site, hip=hip)
    lib = root / "lib"
    if major is not None:
        if ship:
            fake_hip(lib / "libamdhip64.so", major)
            # what patchelf --replace-needed leaves, without patchelf: link against a stand-in
            # whose SONAME is the unversioned name, then ship the copy with the real SONAME
            link = site / "link-time"
            link.mkdir()
            _cc(link / "libamdhip64.so", "int hipInit(unsigned f) { return (int)f; }\n", "-Wl,-soname,libamdhip64.so")
            hip_link = ("-l:libamdhip64.so", f"-L{link}")
        else:
            fake_hip(site / "system" / f"libamdhip64.so.{major}", major)
            hip_link = (f"-l:libamdhip64.so.{major}", f"-L{site / 'system'}")
        src = (
            f'const char *fwd(void) __asm__("{SYM_FWD}");\n'
            f'const char *bwd(void) __asm__("{SYM_BWD}");\n'
            f'const char *chk(void) __asm__("{SYM_CHECK}");\n'
            "int hipInit(unsigned);\n"
            "const char *which_aotriton(void) { hipInit(0); bwd(); chk(); return fwd(); }\n"
        )
        _cc(lib / "libtorch_hip.so", src, hip_link[1], f"-L{lib}", "-l:libaotriton_v2.so.0.11.0", hip_link[0],
            "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags", "-Wl,--no-as-needed")
    return root


def prefix_with_hip(base: Path, major: int | None, arch: str = "gfx908") -> Path:
    """An install prefix whose library needs `libamdhip64.so.<major>` and calls its runtime as a
    real build does (versioned imports, `hipGetDevicePropertiesR0600` from ROCm 6 on)."""
    prefix = build_prefix(base, arch=arch)
    if major is not None:
        hipdir = base.parent / f"rocm{major}"
        fake_hip(hipdir / f"libamdhip64.so.{major}", major)
        lib = prefix / "lib" / "libaotriton_v2.so.0.11.0"
        props = "hipGetDevicePropertiesR0600" if major >= 6 else "hipGetDeviceProperties"
        src = aot_source("mi100", [SYM_FWD, SYM_BWD, SYM_CHECK]) + (
            f"int hipInit(unsigned);\nint {props}(void *, int);\n"
            f"int use_hip(void) {{ return hipInit(0) + {props}(0, 0); }}\n")
        _cc(lib, src, "-Wl,-soname,libaotriton_v2.so.0.11.0", f"-L{hipdir}", f"-l:libamdhip64.so.{major}",
            "-Wl,--no-as-needed")
    return prefix


def test_hip_runtime_names_read_from_fixtures(tmp_path):
    need_cc()
    root = torch_with_hip(tmp_path / "site", 6)
    prefix = prefix_with_hip(tmp_path / "prefix", 5)
    dyn = read_dynamic(root / "lib" / "libtorch_hip.so")
    assert "libamdhip64.so" in dyn.needed and dyn.rpath == ("$ORIGIN",) and dyn.runpath == ()
    assert read_dynamic(root / "lib" / "libamdhip64.so").soname == "libamdhip64.so.6"
    ours = library_hip(read_dynamic(prefix / "lib" / "libaotriton_v2.so.0.11.0"))
    assert ours == HipRuntime("libamdhip64.so.5", 5, "DT_NEEDED")
    theirs = torch_hip(root / "lib", read_dynamic(root / "lib" / "libtorch_hip.so"), "6.4.43482")
    assert theirs == HipRuntime("libamdhip64.so.6", 6, f"ships {root / 'lib' / 'libamdhip64.so'}")
    assert "ROCm 5" in hip_mismatch(ours, theirs) and "ROCm 6" in hip_mismatch(ours, theirs)
    assert hip_mismatch(HipRuntime("libamdhip64.so.6", 6, "DT_NEEDED"), theirs) is None


@pytest.mark.parametrize("ship", [True, False])
def test_install_refuses_a_library_built_for_another_rocm_major(tmp_path, ship):
    need_cc()
    site = tmp_path / "site"
    root = torch_with_hip(site, 6, ship=ship)
    prefix = prefix_with_hip(tmp_path / "prefix", 5)
    before = snapshot(site)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(root))
    assert r.exit_code == 2, r.output
    assert "needs the HIP runtime libamdhip64.so.5 (built against ROCm 5)" in r.output
    assert "libamdhip64.so.6 (ROCm 6" in r.output and "Traceback" not in r.output
    assert snapshot(site) == before  # nothing swapped, no backup written


def test_torch_without_a_hip_dt_needed_falls_back_to_its_hip_version(tmp_path):
    need_cc()
    root = torch_with_hip(tmp_path / "site", None, hip="7.0.1")
    prefix = prefix_with_hip(tmp_path / "prefix", 6)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(root), "--dry-run")
    assert r.exit_code == 2 and "torch.version.hip 7.0.1" in r.output, r.output


def test_install_accepts_the_same_rocm_major(tmp_path):
    need_cc()
    root = torch_with_hip(tmp_path / "site", 6)
    prefix = prefix_with_hip(tmp_path / "prefix", 6)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(root), "--dry-run")
    assert r.exit_code == 0, r.output


def test_a_library_needing_the_versioned_name_loads_into_a_wheel_layout(tmp_path):
    """Our library needs `libamdhip64.so.6`; the wheel ships only `libamdhip64.so` (SONAME
    `libamdhip64.so.6`). libtorch_hip.so loads the copy first, and the dynamic linker matches our
    DT_NEEDED against that loaded object's SONAME: one HIP runtime, no system one needed."""
    need_cc()
    root = torch_with_hip(tmp_path / "site", 6)
    prefix = prefix_with_hip(tmp_path / "prefix", 6)
    r = cli("torch", "install", "--prefix", str(prefix), "--torch-dir", str(root))
    assert r.exit_code == 0, r.output
    assert not (root / "lib" / "libamdhip64.so.6").exists()
    assert load_which(root) == "mi100"
