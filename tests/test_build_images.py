"""Dispatch-table parsing and AKS2 directory reading (no AOTriton tree needed)."""

from __future__ import annotations

import lzma
import struct

import pytest

from codegen.models.image_name import SIG
from codegen.formats.aks2 import (ImageError, blake2b_64, parse_dispatch_table, read_aks2_directory,
                                  read_aks2_images, referenced_kernels)

PKG = "amd-gfx908/flash/attn_fwd/FONLY__＊fp16@16_F_F_0_0___gfx908"
FUNC = "＊fp16@16_F_F_0_0"


def _meta_line(raw: str) -> str:
    h = blake2b_64(raw)
    return (f"    {{ 0x{h >> 32:08x}u, 0x{h & 0xFFFFFFFF:08x}u, 0, 16 }}, "
            f"// {h:016x} = b2sum -l 64 <<< {raw}")


def _table(raws: list[str], pkg: str = PKG) -> str:
    metas = "\n".join(_meta_line(r) for r in raws)
    return f"""
constexpr pstring_view PACKAGE_PATH
#if defined(_WIN32)
{{ LR"xyzw({pkg})xyzw" }};
#else
{{ R"xyzw({pkg})xyzw" }};
#endif
constexpr std::string_view FUNC_NAME {{ R"xyzw({FUNC})xyzw" }};
static AOTRITON_NS::TritonKernelCompactMeta meta_list[] = {{
{metas}
}};
"""


def _aks2(names_sizes: list[tuple[str, int]]) -> bytes:
    directory, blobs, offset = b"", b"", 0
    for name, size in names_sizes:
        fn = name.encode() + b"\0"
        directory += struct.pack("<IIIII", 0, 256 if size else 0, offset, size, len(fn)) + fn
        blobs += b"\x7fELF" * (size // 4)
        offset += size
    payload = lzma.compress(directory + blobs)
    return b"AKS2" + struct.pack("<III", len(directory) + len(blobs), len(names_sizes), len(directory)) + payload


def test_dispatch_table_stems(tmp_path):
    raws = [f"{PKG}__P__0_2_64_32_False__CO__wave1_warp4_stg1--Arch_gfx908",
            f"{PKG}__P__0_2_16_16_False__CO__wave2_warp4_stg1--Arch_gfx908"]
    p = tmp_path / "v3src" / "flash" / "autotune.attn_fwd" / "x.cc"
    p.parent.mkdir(parents=True)
    p.write_text(_table(raws), encoding="utf-8")
    refs = parse_dispatch_table(p, SIG)
    assert [r.stem for r in refs] == [
        f"attn_fwd-Sig-F__{FUNC}__P__0_2_64_32_False__CO__wave1_warp4_stg1--Arch_gfx908",
        f"attn_fwd-Sig-F__{FUNC}__P__0_2_16_16_False__CO__wave2_warp4_stg1--Arch_gfx908",
    ]
    assert {r.kernel for r in refs} == {"attn_fwd"}
    assert referenced_kernels(tmp_path, SIG) == sorted(refs, key=lambda r: (r.package, r.stem))


def test_dispatch_table_bad_hash_is_refused(tmp_path):
    raw = f"{PKG}__P__0_2_64_32_False__CO__wave1_warp4_stg1--Arch_gfx908"
    text = _table([raw]).replace("wave1_warp4_stg1--Arch_gfx908\n", "wave9_warp4_stg1--Arch_gfx908\n")
    p = tmp_path / "t.cc"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(ImageError, match="BLAKE2b"):
        parse_dispatch_table(p, SIG)


def test_table_without_kernels_is_empty(tmp_path):
    p = tmp_path / "t.cc"
    p.write_text("// nothing here\n", encoding="utf-8")
    assert parse_dispatch_table(p, SIG) == []


def test_aks2_directory(tmp_path):
    p = tmp_path / "k.aks2"
    p.write_bytes(_aks2([("a-Sig-F__x", 64), ("b-Sig-F__y", 0)]))
    entries = read_aks2_directory(p)
    assert [(e.name, e.image_size, e.block_threads) for e in entries] == [("a-Sig-F__x", 64, 256), ("b-Sig-F__y", 0, 0)]


def test_aks2_images_and_directory_agree_and_refuse_alike(tmp_path):
    """The one AKS2 reader: the images read whole and the directory read alone name the same
    kernels; a cut or corrupt package is one ImageError from either, never a traceback."""
    p = tmp_path / "k.aks2"
    data = _aks2([("a-Sig-F__x", 64), ("b-Sig-F__y", 8)])
    p.write_bytes(data)
    images = read_aks2_images(p)
    assert {k: len(v) for k, v in images.items()} == {e.name: e.image_size for e in read_aks2_directory(p)}
    assert images["b-Sig-F__y"] == b"\x7fELF" * 2
    for bad, why in ((data[:10], "truncated kernel package"), (data[:16] + b"\xff" * 40, "corrupt kernel package")):
        p.write_bytes(bad)
        for read in (read_aks2_images, read_aks2_directory):
            with pytest.raises(ImageError, match=why):
                read(p)


def test_aks2_bad_magic(tmp_path):
    p = tmp_path / "k.aks2"
    p.write_bytes(b"NOPE" + b"\0" * 12)
    with pytest.raises(ImageError, match="not an AKS2"):
        read_aks2_directory(p)
