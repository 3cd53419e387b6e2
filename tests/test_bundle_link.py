"""Link identity (codegen.ship.identity.link_identity) on libraries built here with gcc against
the stub HIP runtime of each major (versioned like the real one): what a HIP 6 torch wheel
accepts, and each way a library can miss it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.ship.identity import link_identity
from codegen.ship.stub import build_stub
from codegen.formats.elf import read_dynamic
from conftest import cached_sysroot

SYS6 = cached_sysroot(6)
pytestmark = pytest.mark.skipif(SYS6 is None or shutil.which("gcc") is None,
                                reason="needs gcc and the cached HIP 6 sysroot (tests/test_bundle_sysroot.py -m slow)")

SRC = ("#include <hip/hip_runtime_api.h>\n"
       "int probe(void){int d; hipDeviceProp_t p; hipGetDevice(&d); return hipGetDeviceProperties(&p, d);}\n")


def _lib(tmp: Path, include: Path, stub: Path, *flags: str) -> Path:
    (tmp / "l.c").write_text(SRC)
    out = tmp / "libaotriton_v2.so.0.11.0"
    system = [] if include == Path("/usr/include") else ["-isystem", str(include)]
    subprocess.run(["gcc", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__", *system, str(tmp / "l.c"), "-o", str(out),
                    f"-L{stub.parent}", f"-l:{stub.name}", *flags], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = {6: build_stub(SYS6.include, SYS6.runtime, tmp_path_factory.mktemp("s6"))}
    if Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5").exists():
        out[5] = build_stub(Path("/usr/include"), Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5"),
                            tmp_path_factory.mktemp("s5"))
    return out


def _claims(lib: Path, hip: int = 6, stated: dict | None = None) -> dict[str, bool]:
    nodes = set(read_dynamic(SYS6.runtime).version_defs)
    return {c.name: c.ok for c in link_identity(read_dynamic(lib), hip, nodes, stated)}


def test_a_hip6_library_passes(stubs, tmp_path):
    lib = _lib(tmp_path, SYS6.include, stubs[6].path)
    d = read_dynamic(lib)
    assert dict(d.import_versions)["hipGetDevicePropertiesR0600"] == "hip_6.0"
    claims = _claims(lib, stated={"glibc": d.highest("GLIBC"), "glibcxx": d.highest("GLIBCXX")})
    assert all(claims.values()), claims


def test_an_absolute_runpath_fails(stubs, tmp_path):
    lib = _lib(tmp_path, SYS6.include, stubs[6].path, "-Wl,-rpath,/opt/rocm/lib")
    claims = _claims(lib)
    assert claims["no RPATH/RUNPATH outside the library's folder"] is False
    assert claims["DT_NEEDED names the HIP runtime of its major"] is True


def test_a_hip5_library_fails_for_hip6(stubs, tmp_path):
    if 5 not in stubs:
        pytest.skip("needs Debian's HIP 5 (apt-get install -y libamdhip64-dev)")
    lib = _lib(tmp_path, Path("/usr/include"), stubs[5].path)
    claims = _claims(lib)
    assert claims["DT_NEEDED names the HIP runtime of its major"] is False
    assert claims["hipDeviceProp_t of HIP >= 6 (hipGetDevicePropertiesR0600)"] is False


def test_a_misstated_glibc_fails(stubs, tmp_path):
    lib = _lib(tmp_path, SYS6.include, stubs[6].path)
    claims = _claims(lib, stated={"glibc": "GLIBC_2.17", "glibcxx": None})
    assert claims["GLIBC/GLIBCXX needs as the manifest states"] is False
