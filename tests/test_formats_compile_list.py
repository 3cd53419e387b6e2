"""codegen.formats.compile_list without a tree: the line formats of the generator's lists and the
rewrites that leave kernels and packages out (on real trees: tests/test_build_reach.py)."""

from __future__ import annotations

import pytest

from codegen.core.errors import UpstreamError
from codegen.formats.compile_list import (CLUSTER_LIST, COMPILE_LIST, FLATZIP_LIST, clusters_without,
                                          compile_list_without, count_compiled, member_list, parse_compile_line,
                                          read_clusters, read_compile_list, zips_without)

FIELDS = "tritonsrc/flash.py;attn_fwd;4;1;2;gfx908;*fp16:16,64"


def test_a_compile_line_with_and_without_the_0_12b_prefix():
    plain = parse_compile_line(f"/b/v3src/k.hsaco;{FIELDS}")
    assert plain is not None and (plain.hsaco, plain.num_warps, plain.num_stages, plain.waves_per_eu) == \
        ("/b/v3src/k.hsaco", 4, 1, 2)
    assert parse_compile_line(f"venv;/usr/bin/python;/b/v3src/k.hsaco;{FIELDS}") == plain
    assert parse_compile_line(f"/b/v3src/k.hsaco;{FIELDS};extra") is None
    assert parse_compile_line(f"/b/v3src/k.hsaco;{FIELDS}".replace(";4;", ";four;")) is None


def test_a_bad_compile_line_is_one_located_message(tmp_path):
    listing = tmp_path / COMPILE_LIST
    listing.write_text(f"/b/k.hsaco;{FIELDS}\n\n/b/j.hsaco;warps\n")
    with pytest.raises(UpstreamError, match=r"Bare.compile:3: unexpected compile-list line \(2 fields\)"):
        read_compile_list(listing)


def test_counting_listed_and_compiled_kernels(tmp_path):
    assert count_compiled(tmp_path) == (None, None)
    done, empty = tmp_path / "a.hsaco", tmp_path / "b.hsaco"
    done.write_bytes(b"\x7fELF")
    empty.write_bytes(b"")
    (tmp_path / COMPILE_LIST).write_text(f"{done};{FIELDS}\n{empty};{FIELDS}\n{tmp_path / 'c.hsaco'};x\nno image\n")
    assert count_compiled(tmp_path) == (3, 1)


def test_leaving_out_a_package_rewrites_the_compile_and_cluster_lists(tmp_path):
    v3 = tmp_path / "v3src"
    v3.mkdir()
    k = [f"{v3}/flash/gpu_kernel_image.bwd_kernel_fuse/k{i}.hsaco" for i in range(3)]
    (v3 / COMPILE_LIST).write_text("".join(f"{h};{FIELDS}\n" for h in k))
    (v3 / CLUSTER_LIST).write_text(f"amd-gfx908;flash;bwd_kernel_fuse;A;{k[0]};{k[1]}\n"
                                   f"amd-gfx908;flash;bwd_kernel_fuse;B;{k[2]}\nshort;line\n")
    clusters = read_clusters(v3)
    assert [c.images for c in clusters] == [
        ("flash/gpu_kernel_image.bwd_kernel_fuse/k0.hsaco", "flash/gpu_kernel_image.bwd_kernel_fuse/k1.hsaco"),
        ("flash/gpu_kernel_image.bwd_kernel_fuse/k2.hsaco",), ()]
    assert clusters[0].aks2 == "amd-gfx908/flash/bwd_kernel_fuse/A.aks2"
    assert clusters_without(clusters, {0}).decode() == f"amd-gfx908;flash;bwd_kernel_fuse;B;{k[2]}\nshort;line\n"
    assert compile_list_without(v3, set(clusters[0].images)).decode() == f"{k[2]};{FIELDS}\n"


def test_leaving_out_zip_members(tmp_path):
    """0.13b: a zip keeps its other members; a zip left with none goes, with its member list."""
    v3 = tmp_path / "v3src"
    a, b, c = (f"{v3}/aks2/amd-gfx908/flash/{k}/{m}.aks2" for k, m in
               (("bwd_kernel_fuse", "A"), ("bwd_kernel_fuse", "B"), ("attn_fwd", "C")))
    fuse, fwd = member_list("amd-gfx908", "flash", "bwd_kernel_fuse"), member_list("amd-gfx908", "flash", "attn_fwd")
    (v3 / fuse).parent.mkdir(parents=True)
    (v3 / FLATZIP_LIST).write_text(f"amd-gfx908;flash;bwd_kernel_fuse;{a};{b}\namd-gfx908;flash;attn_fwd;{c}\n")
    (v3 / fuse).write_text(f"{a}\0FA\0\n{b}\0FB\0\n")
    (v3 / fwd).write_text(f"{c}\0FC\0\n")
    r = zips_without(v3, {"aks2/amd-gfx908/flash/bwd_kernel_fuse/A.aks2", "aks2/amd-gfx908/flash/attn_fwd/C.aks2"})
    assert r.dropped == [("amd-gfx908/flash/bwd_kernel_fuse.zip", "FA", "aks2/amd-gfx908/flash/bwd_kernel_fuse/A.aks2"),
                         ("amd-gfx908/flash/attn_fwd.zip", "FC", "aks2/amd-gfx908/flash/attn_fwd/C.aks2")]
    assert r.files == {fuse: f"{b}\0FB\0\n".encode(),
                       FLATZIP_LIST: f"amd-gfx908;flash;bwd_kernel_fuse;{b}\n".encode()}
    assert r.stale == [fwd, "aotriton.images/amd-gfx908/flash/attn_fwd.zip"]
