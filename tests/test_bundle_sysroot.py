"""The private HIP sysroot: the machine's Debian mirror read from apt's sources (one-line and
deb822), an unreachable mirror as one message (exit 3), and (`slow`: it downloads ~10 MB) the
real HIP 6 sysroot made from suite sid and compiled against."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from codegen.ship.sysroot import HIP_SOURCES, debian_mirrors, ensure_sysroot, find_sysroot
from codegen.core.errors import EnvironmentMissing


def _etc(tmp_path: Path, files: dict[str, str]) -> Path:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    return etc


def test_mirror_from_deb822_and_one_line_sources(tmp_path):
    etc = _etc(tmp_path, {
        "sources.list": "# nothing here\n",
        "sources.list.d/debian.sources": (
            "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
            "Components: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
            "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n"),
        "sources.list.d/other.sources.disabled-by-farm": "Types: deb\nURIs: http://x.example/\nSuites: nodistro\n",
        "sources.list.d/off.sources": "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\n",
    })
    ms = debian_mirrors(etc)
    assert [(m.uri, m.components, m.signed_by) for m in ms] == [
        ("http://mirror.example/debian", ("main", "contrib"), "/usr/share/keyrings/debian-archive-keyring.gpg")]
    etc2 = _etc(tmp_path / "b", {
        "sources.list": "deb [arch=amd64 signed-by=/k.gpg] http://m.example/debian/ bookworm main\n"
                        "deb http://m.example/debian bookworm-updates main\ndeb-src http://m.example/debian bookworm main\n"})
    assert [(m.uri, m.components, m.signed_by) for m in debian_mirrors(etc2)] == [
        ("http://m.example/debian", ("main",), "/k.gpg")]
    assert debian_mirrors(_etc(tmp_path / "c", {"sources.list": ""})) == []


@pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
def test_unreachable_mirror_is_one_message(tmp_path):
    etc = _etc(tmp_path, {"sources.list": "deb [trusted=yes] http://127.0.0.1:9/debian bookworm main\n"})
    seen: list[str] = []
    with pytest.raises(EnvironmentMissing) as e:
        ensure_sysroot(6, root=tmp_path / "cache", etc_apt=etc, progress=seen.append)
    assert "cannot fetch Debian's HIP 6 packages" in str(e.value) and "suite sid" in str(e.value)
    assert e.value.exit_code == 3 and "copy" in e.value.hint
    assert find_sysroot(6, tmp_path / "cache") is None
    assert not list((tmp_path / "cache").glob("hip6*")) and seen and "apt-get update" in seen[0]
    with pytest.raises(EnvironmentMissing, match="no Debian archive source"):
        ensure_sysroot(7, root=tmp_path / "cache", etc_apt=_etc(tmp_path / "e", {"sources.list": ""}))


@pytest.mark.slow
@pytest.mark.parametrize("major", sorted(HIP_SOURCES))
def test_real_sysroot(major, tmp_path_factory):
    """Downloads Debian's HIP packages of the major (sid / experimental), unpacks them, compiles
    against the header with gcc; a second call is the cache."""
    from codegen.ship.sysroot import default_root
    from codegen.formats.elf import read_dynamic

    lines: list[str] = []
    s = ensure_sysroot(major, progress=lines.append)
    assert s.root == default_root() / f"hip{major}"
    assert s.record.packages["libamdhip64-dev"].version.startswith(f"{major}.")
    assert read_dynamic(s.runtime).soname == f"libamdhip64.so.{major}"
    assert ensure_sysroot(major, progress=lines.append) == s
    cc = shutil.which("gcc")
    if cc:
        d = tmp_path_factory.mktemp("hdr")
        (d / "t.c").write_text("#include <hip/hip_runtime_api.h>\n#include <stdio.h>\n#include <stddef.h>\n"
                               "int main(void){printf(\"%zu\\n\", offsetof(hipDeviceProp_t, gcnArchName));return 0;}\n")
        subprocess.run([cc, "-D__HIP_PLATFORM_AMD__", f"-I{s.include}", str(d / "t.c"), "-o", str(d / "t")], check=True)
        assert int(subprocess.run([str(d / "t")], capture_output=True, text=True).stdout) > 256
