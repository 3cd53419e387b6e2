"""The one ELF reader (`codegen.formats.elf`, pyelftools) on real ELF files built here with gcc: a
library exporting versioned symbols the way ROCm's HIP runtime does (`hip_4.2`, `hip_6.0`
nodes), a consumer importing them, and AMDGPU code-object headers and metadata notes."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import msgpack
import pytest

from codegen.formats.elf import (AMDGPU_MACH, ElfError, amdgpu_metadata, elf_extent, loaded_digest, parse_dynamic,
                                 parse_target_id, read_code_object, read_dynamic, text_size, version_key)

CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler (gcc)")


def _cc(out: Path, src: str, *flags: str) -> Path:
    c = out.with_suffix(".c")
    c.write_text(src)
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(c), *flags], check=True, capture_output=True)
    return out


@needs_cc
def test_symbol_versions_needs_and_glibc(tmp_path):
    (tmp_path / "hip.map").write_text(
        "hip_4.2 { global: hipGetDevice; hipModuleUnload; local: *; };\n"
        "hip_6.0 { global: hipGetDevicePropertiesR0600; } hip_4.2;\n")
    prov = _cc(tmp_path / "libamdhip64.so", "int hipGetDevice(int*d){*d=0;return 0;}\n"
               "int hipModuleUnload(void*m){return 0;}\nint hipGetDevicePropertiesR0600(void*p,int d){return 0;}\n",
               "-Wl,-soname,libamdhip64.so.6", f"-Wl,--version-script={tmp_path / 'hip.map'}")
    p = read_dynamic(prov)
    assert p.soname == "libamdhip64.so.6"
    assert p.version_defs == ("hip_4.2", "hip_6.0")
    assert dict(p.export_versions) == {"hipGetDevice": "hip_4.2", "hipModuleUnload": "hip_4.2",
                                       "hipGetDevicePropertiesR0600": "hip_6.0"}
    user = _cc(tmp_path / "libuser.so",
               "#include <string.h>\nint hipGetDevice(int*);int hipGetDevicePropertiesR0600(void*,int);\n"
               "int f(char*a,const char*b){int d; hipGetDevice(&d); strcpy(a,b); return hipGetDevicePropertiesR0600(a,d);}\n",
               f"-L{tmp_path}", "-l:libamdhip64.so", "-Wl,-rpath,$ORIGIN", "-Wl,--disable-new-dtags")
    u = read_dynamic(user)
    assert u.needed[0] == "libamdhip64.so.6" and u.rpath == ("$ORIGIN",) and u.runpath == ()
    assert dict(u.import_versions)["hipGetDevice"] == "hip_4.2"
    assert dict(u.import_versions)["hipGetDevicePropertiesR0600"] == "hip_6.0"
    assert {v for f, vs in u.version_needs if f.startswith("libamdhip64") for v in vs} == {"hip_4.2", "hip_6.0"}
    glibc = u.highest("GLIBC")
    assert glibc is not None and version_key(glibc) >= (2, 2, 5)
    assert u.highest("GLIBCXX") is None
    # the same bytes through parse_dynamic
    assert parse_dynamic(user.read_bytes(), "x").import_versions == u.import_versions


def test_not_an_elf_and_truncated(tmp_path):
    f = tmp_path / "x.so"
    f.write_bytes(b"not an elf at all")
    with pytest.raises(ElfError, match="not an ELF file"):
        read_dynamic(f)
    with pytest.raises(ElfError, match="not a regular file"):
        read_dynamic(tmp_path)
    if CC:
        lib = _cc(tmp_path / "libt.so", "int g(void){return 1;}\n")
        with pytest.raises(ElfError):
            parse_dynamic(lib.read_bytes()[:200], "cut")


def test_code_object_readers_refuse_alike():
    """Every reader of a code object: one ElfError, one message form, for what is not ELF or is cut."""
    obj = code_object(0x30)
    assert loaded_digest(obj) == loaded_digest(obj + b"\0" * 8) and elf_extent(obj + b"\0" * 8) == len(obj)
    for read in (loaded_digest, read_code_object, amdgpu_metadata):
        with pytest.raises(ElfError, match="x: not an ELF file"):
            read(b"not an elf at all", "x")
        with pytest.raises(ElfError, match=r"cut: truncated or corrupt ELF file \("):
            read(obj[:80], "cut")
    assert text_size(obj[:80]) == 0 and elf_extent(b"not an elf") == 0


def code_object(mach: int, features: int = 0, meta: dict | None = None, machine: int = 224) -> bytes:
    """A minimal AMDGPU ELF64: header with e_machine/e_flags, and an NT_AMDGPU_METADATA note."""
    names = b"\0.shstrtab\0.note\0"
    desc = msgpack.packb(meta or {})
    note = struct.pack("<III", 7, len(desc), 32) + b"AMDGPU\0\0" + desc + b"\0" * (-len(desc) % 4)
    shoff = 64 + len(names) + len(note)
    hdr = bytearray(64)
    hdr[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<HHI", hdr, 0x10, 3, machine, 1)
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<I", hdr, 0x30, mach | features)
    struct.pack_into("<HHHHHH", hdr, 0x34, 64, 0, 0, 64, 3, 1)

    def sh(name, typ, off, size, align=1):
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, 0, 0, align, 0)

    heads = sh(0, 0, 0, 0) + sh(1, 3, 64, len(names)) + sh(11, 7, 64 + len(names), len(note), 4)
    return bytes(hdr) + names + note + heads


def test_code_object_target_and_metadata():
    meta = {"amdhsa.target": "amdgcn-amd-amdhsa--gfx908:sramecc+:xnack-",
            "amdhsa.kernels": [{".name": "attn_fwd", ".kernarg_segment_size": 288,
                                ".max_flat_workgroup_size": 256, ".wavefront_size": 64}]}
    co = read_code_object(code_object(AMDGPU_MACH["gfx908"], 0x200 | 0xC00, meta))
    assert co.arch == "gfx908" and co.xnack == "off" and co.sramecc == "on"
    assert co.target_id() == "gfx908:sramecc+:xnack-" and co.features() == {"sramecc": "on", "xnack": "off"}
    assert parse_target_id(co.target) == parse_target_id(co.target_id()) == ("gfx908", co.features())
    assert parse_target_id("gfx908") == ("gfx908", {}) and co.text_bytes == 0
    for bad in ("gfx908:xnack", "gfx908:xnack+:xnack-", "gfx908:+"):
        with pytest.raises(ValueError, match="not a target feature"):
            parse_target_id(bad)
    assert co.kernels["attn_fwd"][".kernarg_segment_size"] == 288
    co = read_code_object(code_object(AMDGPU_MACH["gfx1030"], 0, {}))
    assert co.arch == "gfx1030" and co.target_id() == "gfx1030" and co.kernels == {}
    with pytest.raises(ElfError, match="not an AMDGPU code object"):
        read_code_object(code_object(0x30, 0, meta, machine=62))
