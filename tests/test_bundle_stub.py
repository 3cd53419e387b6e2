"""The stub HIP runtime (codegen/ship/stub/hip_stub.c), compiled here with gcc against HIP
headers (a cached private sysroot when present, else the system's), called through ctypes on
code objects built in Python: the device it reports, the checks on code objects and launches,
each failing case named. The dispatch driver on a stand-in library: tests/test_bundle_dispatch.py;
on a real library: tests/test_bundle_real.py."""

from __future__ import annotations

import ctypes
import json
import shutil
import struct
from pathlib import Path

import msgpack
import pytest

from codegen.ship.stub import build_stub, version_script
from codegen.ship.sysroot import find_sysroot
from codegen.formats.elf import AMDGPU_MACH, read_code_object, read_dynamic

SYSTEM_HIP = (Path("/usr/include"), Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5"))


def hip_headers() -> list[tuple[Path, Path]]:
    out = []
    for major in (6, 7):
        s = find_sysroot(major)
        if s is not None:
            out.append((s.include, s.runtime))
    if (SYSTEM_HIP[0] / "hip" / "hip_runtime_api.h").is_file() and SYSTEM_HIP[1].exists():
        out.append(SYSTEM_HIP)
    return out


HEADERS = hip_headers()
pytestmark = pytest.mark.skipif(not HEADERS or shutil.which("gcc") is None,
                                reason="needs gcc and HIP headers (a HIP sysroot: tests/test_bundle_sysroot.py -m slow, "
                                       "or apt-get install -y libamdhip64-dev)")


def code_object(mach: int, kernel: str = "attn_fwd", kernarg: int = 96, kd_kernarg: int | None = None,
                max_wg: int = 256, wave: int = 64, features: int = 0x100 | 0x400, note: dict | None = None,
                target: str = "amdgcn-amd-amdhsa--gfx908") -> bytes:
    """An AMDGPU ELF64 with the parts a runtime reads: e_flags, the metadata note, a symbol
    table with the kernel and its descriptor `<kernel>.kd` (kernarg_size at byte 8). `note`:
    more (or other) fields of the kernel's metadata entry."""
    meta = {"amdhsa.version": [1, 2], "amdhsa.target": target,
            "amdhsa.kernels": [{".name": kernel, ".symbol": kernel + ".kd", ".kernarg_segment_size": kernarg,
                                ".max_flat_workgroup_size": max_wg, ".wavefront_size": wave,
                                ".args": [{".offset": 0, ".size": 8, ".value_kind": "global_buffer"},
                                          {".offset": 8, ".size": 4, ".value_kind": "by_value"},
                                          {".offset": 16, ".size": 8, ".value_kind": "hidden_block_count_x"}],
                                **(note or {})}]}
    desc = msgpack.packb(meta)
    note = struct.pack("<III", 7, len(desc), 32) + b"AMDGPU\0\0" + desc + b"\0" * (-len(desc) % 4)
    shstr = b"\0.shstrtab\0.note\0.strtab\0.symtab\0.rodata\0"
    strtab = b"\0" + kernel.encode() + b"\0" + kernel.encode() + b".kd\0"
    kd = bytearray(64)
    struct.pack_into("<I", kd, 8, kernarg if kd_kernarg is None else kd_kernarg)
    sym = struct.Struct("<IBBHQQ")
    symtab = (sym.pack(0, 0, 0, 0, 0, 0) + sym.pack(1, 0x12, 0, 5, 0x1000, 4)
              + sym.pack(1 + len(kernel) + 1, 0x11, 0, 5, 0x1000, 64))
    body, offs = b"", []
    for part in (shstr, note, strtab, symtab, bytes(kd)):
        while (64 + len(body)) % 8:
            body += b"\0"
        offs.append(64 + len(body))
        body += part
    while (64 + len(body)) % 8:
        body += b"\0"
    shoff = 64 + len(body)
    hdr = bytearray(64)
    hdr[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<HHI", hdr, 0x10, 3, 224, 1)
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<I", hdr, 0x30, mach | features)
    struct.pack_into("<HHHHHH", hdr, 0x34, 64, 0, 0, 64, 6, 1)

    def sh(name, typ, off, size, link=0, entsize=0, addr=0):
        return struct.pack("<IIQQQQIIQQ", name, typ, 0, addr, off, size, link, 0, 8, entsize)

    heads = (sh(0, 0, 0, 0) + sh(1, 3, offs[0], len(shstr)) + sh(11, 7, offs[1], len(note))
             + sh(17, 3, offs[2], len(strtab)) + sh(25, 2, offs[3], len(symtab), link=3, entsize=24)
             + sh(33, 1, offs[4], 64, addr=0x1000))
    return bytes(hdr) + body + heads


class Stub:
    def __init__(self, path: Path, log: Path):
        self.lib = ctypes.CDLL(str(path))
        self.log = log

    def events(self) -> list[dict]:
        return [json.loads(x) for x in self.log.read_text().splitlines()] if self.log.exists() else []

    def load(self, image: bytes):
        self._keep = ctypes.create_string_buffer(image, len(image))
        mod = ctypes.c_void_p()
        return self.lib.hipModuleLoadDataEx(ctypes.byref(mod), self._keep, 0, None, None), mod

    def function(self, mod, name: str):
        fn = ctypes.c_void_p()
        return self.lib.hipModuleGetFunction(ctypes.byref(fn), mod, name.encode()), fn

    def launch(self, fn, block=(256, 1, 1), grid=(4, 1, 1), buffer: int | None = None, params: int | None = 2):
        L = self.lib.hipModuleLaunchKernel
        L.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        if buffer is not None:
            buf = ctypes.create_string_buffer(buffer)
            size = ctypes.c_size_t(buffer)
            extra = (ctypes.c_void_p * 5)(1, ctypes.cast(buf, ctypes.c_void_p), 2,
                                          ctypes.cast(ctypes.pointer(size), ctypes.c_void_p), 3)
            return L(fn, *grid, *block, 0, None, None, extra)
        vals = [ctypes.c_uint64(7) for _ in range(params)]
        arr = (ctypes.c_void_p * max(params, 1))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        return L(fn, *grid, *block, 0, None, arr, None)


@pytest.fixture(params=HEADERS, ids=lambda h: str(h[0]), scope="module")
def stub_path(request, tmp_path_factory):
    include, runtime = request.param
    return build_stub(include, runtime, tmp_path_factory.mktemp("stub"))


def _run(stub_path, tmp_path, code: str, target="gfx908:sramecc+:xnack-", mach="gfx908") -> dict:
    """Runs `code` in a child process (the stub reads its environment once), returns its JSON."""
    import subprocess
    import sys

    env = {"MI100_STUB_TARGET": target, "MI100_STUB_MACH": str(AMDGPU_MACH[mach]), "MI100_STUB_LOG": str(tmp_path / "log"),
           "PATH": "/usr/bin:/bin"}
    prog = (f"import sys; sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parents[1])]!r}\n"
            "from test_bundle_stub import *\n"
            f"s = Stub(Path({str(stub_path.path)!r}), Path({str(tmp_path / 'log')!r}))\n" + code)
    r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_stub_soname_and_versions(stub_path):
    d = read_dynamic(stub_path.path)
    assert d.soname == f"libamdhip64.so.{stub_path.major}"
    exports = dict(d.export_versions)
    assert exports["hipModuleLaunchKernel"] == "hip_4.2"
    if stub_path.major >= 6:
        assert exports["hipGetDevicePropertiesR0600"] == "hip_6.0"
    else:
        assert "hipGetDevicePropertiesR0600" not in exports and "hipStreamGetDevice" not in exports  # HIP 5.2


def test_version_script_follows_the_real_runtime():
    for include, runtime in HEADERS:
        script, versions = version_script(runtime, 6 if "R0600" in dict(read_dynamic(runtime).export_versions).get(
            "hipGetDevicePropertiesR0600", "R0600") else 5)
        assert script.startswith("hip_4.2 {") and "local: *;" in script
        assert all(v.startswith("hip_") for v in versions.values())


def test_device_and_valid_launches(stub_path, tmp_path):
    co = code_object(AMDGPU_MACH["gfx908"])
    assert read_code_object(co).kernels["attn_fwd"][".kernarg_segment_size"] == 96  # the one ELF reader agrees
    out = _run(stub_path, tmp_path, (
        f"rc, mod = s.load({co!r})\nrf, fn = s.function(mod, 'attn_fwd')\n"
        "print(json.dumps({'load': rc, 'func': rf, 'params': s.launch(fn), 'buffer': s.launch(fn, buffer=12),"
        " 'events': [e['event'] for e in s.events()]}))"))
    assert out == {"load": 0, "func": 0, "params": 0, "buffer": 0, "events": ["load", "function", "launch", "launch"]}


VIOLATIONS = [  # (what, code setting rc, hipError_t, words of the violation)
    ("another arch", "rc, mod = s.load(code_object(AMDGPU_MACH['gfx90a']))", 209, "EF_AMDGPU_MACH 0x3f"),
    ("xnack on for an xnack- device", "rc, mod = s.load(code_object(AMDGPU_MACH['gfx908'], features=0x300))",
     209, "xnack on"),
    ("a missing kernel", "_, mod = s.load(code_object(AMDGPU_MACH['gfx908']))\nrc, f = s.function(mod, 'attn_bwd')",
     500, "kernel attn_bwd not in the code object"),
    ("descriptor against metadata", "_, mod = s.load(code_object(AMDGPU_MACH['gfx908'], kd_kernarg=64))\n"
     "rc, f = s.function(mod, 'attn_fwd')", 200, "kernarg_size 64 != metadata"),
    ("a block too large", "_, mod = s.load(code_object(AMDGPU_MACH['gfx908']))\n_, f = s.function(mod, 'attn_fwd')\n"
     "rc = s.launch(f, block=(512, 1, 1))", 9, "the kernel allows 1..256"),
    ("a block off the wave size", "_, mod = s.load(code_object(AMDGPU_MACH['gfx908']))\n_, f = s.function(mod, 'attn_fwd')\n"
     "rc = s.launch(f, block=(96, 1, 1))", 9, "not a multiple of the wave size 64"),
    ("a short argument buffer", "_, mod = s.load(code_object(AMDGPU_MACH['gfx908']))\n_, f = s.function(mod, 'attn_fwd')\n"
     "rc = s.launch(f, buffer=8)", 1, "explicit arguments take 12"),
    ("a wave32 kernel on a wave64 device", "_, mod = s.load(code_object(AMDGPU_MACH['gfx908'], wave=32))\n"
     "rc, f = s.function(mod, 'attn_fwd')", 209, "wavefront size 32"),
]


def test_violations_fail_loudly(stub_path, tmp_path):
    """Each violation returns its HIP error and logs one named violation line (one child process)."""
    prog = "out = []\n"
    for _what, code, _err, _words in VIOLATIONS:
        prog += code + "\nout.append([rc, [e['what'] for e in s.events() if e['event'] == 'violation'][-1:]])\n"
    prog += "print(json.dumps({'out': out}))"
    got = _run(stub_path, tmp_path, prog)["out"]
    for (what, _code, error, words), (rc, last) in zip(VIOLATIONS, got):
        assert rc == error and last and words in last[0], (what, rc, last)


def test_device_properties_are_the_headers_struct(stub_path, tmp_path):
    """gcnArchName at the offset of the major's own hipDeviceProp_t (1160 in HIP 6 and 7)."""
    out = _run(stub_path, tmp_path, (
        "buf = ctypes.create_string_buffer(4096)\n"
        f"fn = getattr(s.lib, {'hipGetDevicePropertiesR0600' if stub_path.major >= 6 else 'hipGetDeviceProperties'!r})\n"
        "rc = fn(buf, 0)\nraw = buf.raw\n"
        "print(json.dumps({'rc': rc, 'at': raw.find(b'\\0gfx908:sramecc+:xnack-\\0') + 1, 'other': fn(buf, 1)}))"))
    assert out["rc"] == 0 and out["other"] == 101  # hipErrorInvalidDevice
    if stub_path.major >= 6:
        assert out["at"] == 1160
