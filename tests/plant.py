"""Planted faults in a real bundle, for the executed-dispatch tests (tests/test_execute_real.py):
a copy of a bundle whose `.aks2` image packages a function rewrote, every hash and size in the
manifest computed again (what a miscompile, or a careless repack, leaves: `bundle check`'s
integrity, identity and dispatch all pass it). Two faults:

- `exp_to_log`: every `v_exp_f32` of a code object turned into `v_log_f32` (the VOP1 and VOP3
  opcodes one apart; the instructions found by llvm-objdump, an independent decoder);
- `swapped`: a package's code objects replaced by those of another package (with the launch
  fields of the package directory that go with them).

The AKS2 layout (codegen.formats.aks2 reads it): "AKS2", the uncompressed size, the count, the
directory size, then xz of the directory (per image: shared bytes, block threads, offset, size,
name length, name) and the images."""

from __future__ import annotations

import lzma
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Callable

from elftools.elf.elffile import ELFFile

from codegen.formats.aks2 import PackedEntry, read_aks2_directory, read_aks2_images
from codegen.upstream.releases import IMAGES_DIR

Entries = list[tuple[PackedEntry, bytes]]


def write_aks2(entries: Entries) -> bytes:
    directory, blob = b"", b""
    for e, img in entries:
        name = e.name.encode() + b"\0"
        directory += struct.pack("<IIIII", e.shared_memory, e.block_threads, len(blob), len(img), len(name)) + name
        blob += img
    payload = directory + blob
    return struct.pack("<4sIII", b"AKS2", len(payload), len(entries), len(directory)) + lzma.compress(payload)


def rewrite_bundle(bundle: Path, dest: Path, change: Callable[[str, Entries, dict], Entries | None]) -> list[str]:
    """Write to `dest` a copy of `bundle` in which `change(package, entries, every_package)`
    rewrote the packages it returns entries for (package: the path below aotriton.images/;
    every_package: package -> entries, to take images from); the packages it changed."""
    from codegen.core.fsutil import sha256
    from codegen.formats.bundle_zip import MANIFEST, extract, manifest_of, open_bundle, write_bundle

    b = open_bundle(bundle)
    stage = dest.parent / f"{dest.name}.stage"
    shutil.rmtree(stage, ignore_errors=True)
    root = extract(b, stage)
    images = root / "lib" / IMAGES_DIR
    packages = {}
    for pkg in sorted(images.rglob("*.aks2")):
        imgs = read_aks2_images(pkg)
        packages[pkg.relative_to(images).as_posix()] = [(e, imgs[e.name]) for e in read_aks2_directory(pkg)]
    changed = []
    for rel, entries in packages.items():
        new = change(rel, entries, packages)
        if new is not None:
            (images / rel).write_bytes(write_aks2(new))
            changed.append(rel)
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    data = dict(b.manifest.to_json(), files={n: {"sha256": sha256(d), "size": len(d)} for n, d in files.items()})
    write_bundle(dest, manifest_of(data, f"{dest}: {MANIFEST}"), files)
    shutil.rmtree(stage, ignore_errors=True)
    return changed


_INSN = re.compile(r"^\s*(v_exp_f32_(?:e32|e64|sdwa|dpp))\b.*//\s*([0-9A-Fa-f]+):")


def exp_to_log(image: bytes, work: Path) -> tuple[bytes, int]:
    """The code object with every v_exp_f32 turned into v_log_f32, and how many there were."""
    work.mkdir(parents=True, exist_ok=True)
    co = work / "k.co"
    co.write_bytes(image)
    text = subprocess.run(["llvm-objdump", "-d", "--mcpu=gfx908", str(co)], capture_output=True, text=True,
                          check=True).stdout
    with open(co, "rb") as f:
        sections = [(s["sh_addr"], s["sh_offset"], s["sh_size"]) for s in ELFFile(f).iter_sections()
                    if s["sh_type"] == "SHT_PROGBITS" and s["sh_flags"] & 0x4]   # SHF_EXECINSTR
    out, n = bytearray(image), 0
    for line in text.splitlines():
        m = _INSN.match(line)
        if not m:
            continue
        addr = int(m.group(2), 16)
        off = next(o + addr - a for a, o, size in sections if a <= addr < a + size)
        word = struct.unpack_from("<I", out, off)[0]
        if m.group(1) == "v_exp_f32_e64":   # VOP3: opcode in bits 25:16 (0x160 -> 0x161)
            assert (word >> 16) & 0x3FF == 0x160, hex(word)
            word += 1 << 16
        else:                                # VOP1 (and its SDWA/DPP forms): opcode in bits 16:9 (0x20 -> 0x21)
            assert (word >> 9) & 0xFF == 0x20, hex(word)
            word += 1 << 9
        struct.pack_into("<I", out, off, word)
        n += 1
    return bytes(out), n
