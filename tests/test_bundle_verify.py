"""Fast tests of `bundle verify`'s pieces: the comparison of what a GPU loads of two code objects,
where the plan's kernels lie in the images (.aks2 packages, 0.13b's image zips), the sample's
seed, where the release tree comes from, and the command's refusals (one message, exit 2,
nothing left behind). The real rebuild: tests/test_bundle_verify_real.py."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path

import msgpack
import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.core.errors import UserError
from codegen.formats.aks2 import KernelRef, ZipRef, package_images, packed_kernels
from codegen.formats.bundle_zip import manifest_of, write_bundle
from codegen.formats.compile_list import image_refs
from codegen.formats.elf import AMDGPU_MACH
from codegen.ship.verify import compare_code_objects
from codegen.upstream import by_release, trees
from codegen.compile.sample import stratified_sample
from test_bundle_units import aks2, minimal_manifest
from test_precompile_units import _entry

REPO = Path(__file__).resolve().parents[1]
SHF_ALLOC, SHF_EXEC = 0x2, 0x4
SHT_PROGBITS, SHT_NOTE = 1, 7


def _note(owner: bytes, typ: int, desc: bytes) -> bytes:
    name = owner + b"\0"
    return (struct.pack("<III", len(name), len(desc), typ) + name + b"\0" * (-len(name) % 4)
            + desc + b"\0" * (-len(desc) % 4))


def elf(sections: list[tuple[str, int, int, bytes]], e_flags: int = AMDGPU_MACH["gfx908"] | 0x200 | 0xC00) -> bytes:
    """An AMDGPU ELF64 with `sections` (name, sh_type, sh_flags, bytes), as a loader reads it."""
    names = [".shstrtab"] + [s[0] for s in sections]
    shstr, offs = b"\0", []
    for n in names:
        offs.append(len(shstr))
        shstr += n.encode() + b"\0"
    body, where = b"", []
    for data in [shstr] + [s[3] for s in sections]:
        body += b"\0" * (-(64 + len(body)) % 8)
        where.append(64 + len(body))
        body += data
    body += b"\0" * (-(64 + len(body)) % 8)
    hdr = bytearray(64)
    hdr[:9] = b"\x7fELF\x02\x01\x01\x40\x02"          # ELFOSABI_AMDGPU_HSA, code object v4
    struct.pack_into("<HHI", hdr, 0x10, 3, 224, 1)
    struct.pack_into("<Q", hdr, 0x28, 64 + len(body))
    struct.pack_into("<I", hdr, 0x30, e_flags)
    struct.pack_into("<HHHHHH", hdr, 0x34, 64, 0, 0, 64, len(names) + 1, 1)

    def sh(name, typ, flags, off, size):
        return struct.pack("<IIQQQQIIQQ", name, typ, flags, 0, off, size, 0, 0, 4, 0)

    heads = sh(0, 0, 0, 0, 0) + sh(offs[0], 3, 0, where[0], len(shstr))
    for i, (_n, typ, flags, data) in enumerate(sections, 1):
        heads += sh(offs[i], typ, flags, where[i], len(data))
    return bytes(hdr) + body + heads


def kernel(text: bytes = b"\x00\x01\x02\x03" * 8, kernarg: int = 288, other_note: bytes = b"id-1",
           debug: bytes = b"/home/a/tree/flash.py") -> bytes:
    meta = msgpack.packb({"amdhsa.target": "amdgcn-amd-amdhsa--gfx908:sramecc+:xnack-",
                          "amdhsa.kernels": [{".name": "attn_fwd", ".kernarg_segment_size": kernarg}]})
    return elf([(".note", SHT_NOTE, SHF_ALLOC, _note(b"AMDGPU", 32, meta) + _note(b"GNU", 3, other_note)),
                (".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXEC, text),
                (".debug_str", SHT_PROGBITS, 0, debug)])


def test_the_comparison_sees_what_a_gpu_loads_and_only_that():
    built = kernel()
    assert compare_code_objects(built, kernel()) == ()
    # the folder it was compiled in (DWARF) and another owner's note: the loader reads neither
    assert compare_code_objects(built, kernel(debug=b"/tmp/other/flash.py", other_note=b"id-2")) == ()
    assert compare_code_objects(built, kernel(text=b"\x01" * 32)) == (".text",)
    assert compare_code_objects(built, kernel(kernarg=96)) == (".note",)            # the AMDGPU metadata
    xnack_on = elf([(".note", SHT_NOTE, SHF_ALLOC, b""), (".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXEC, b"\0")],
                   e_flags=AMDGPU_MACH["gfx908"] | 0x300 | 0xC00)
    assert compare_code_objects(built, xnack_on)[0] == "header"
    more = elf([(".note", SHT_NOTE, SHF_ALLOC, b""), (".rodata", SHT_PROGBITS, SHF_ALLOC, b"kd")])
    assert ".rodata" in compare_code_objects(built, more)
    assert compare_code_objects(built, b"\x7fELF but cut") == ("not a code object",)
    assert compare_code_objects(built, b"") == ("not a code object",)


def test_the_sample_seed_picks_other_kernels_of_the_same_strata():
    entries = [_entry(f, dt, hd, wpe=w, i=i) for f in ("attn_fwd", "bwd_kernel_dq") for dt in ("fp16", "bf16")
               for hd in (64, 128) for w in (1, 2) for i in range(4)]
    plain = stratified_sample(entries, 6)
    assert stratified_sample(entries, 6, seed=0) == plain                   # seed 0: precompile's order
    assert stratified_sample(list(reversed(entries)), 6, seed=7) == stratified_sample(entries, 6, seed=7)

    def strata(s):
        return sorted((e.config.family, e.config.dtype, e.config.head_dim) for e in s)

    others = [stratified_sample(entries, 6, seed=s) for s in range(1, 6)]
    assert all(strata(o) == strata(plain) for o in others)                  # the same coverage
    assert any({e.id for e in o} != {e.id for e in plain} for o in others)  # other kernels in it


def _lists(v3src: Path, zipped: bool) -> None:
    """A generator's lists for two kernels of one cluster, as 0.11b or 0.13b writes them."""
    flash = v3src / "flash" / "gpu_kernel_image.attn_fwd"
    flash.mkdir(parents=True)
    h = [flash / "attn_fwd-Sig-F__a__P__1__CO__w--Arch_gfx908.hsaco", flash / "attn_fwd-Sig-F__a__P__2__CO__w--Arch_gfx908.hsaco"]
    (v3src / "Bare.cluster").write_text(f"amd-gfx908;flash;attn_fwd;FONLY__a;{h[0]};{h[1]}\n")
    if zipped:
        cluster = v3src / "aks2" / "amd-gfx908" / "flash" / "attn_fwd" / "FONLY__a"
        cluster.parent.mkdir(parents=True)
        cluster.with_suffix(".nsv").write_text(f"{h[0]}\0;;#P;1\0\n{h[1]}\0;;#P;2\0\n")
        (v3src / "Bare.flatzip").write_text(f"amd-gfx908;flash;attn_fwd;{cluster}.aks2\n")
        members = v3src / "aotriton.images" / "amd-gfx908" / "flash" / "attn_fwd.nsv"
        members.parent.mkdir(parents=True)
        members.write_text(f"{cluster}.aks2\0Q=fp16\0\n")


def test_image_refs_and_packed_kernels_agree_for_both_image_formats(tmp_path):
    a, b = kernel(), kernel(text=b"\x05" * 32)
    for zipped in (False, True):
        v3src, images = tmp_path / f"v3src{zipped}" / "v3src", tmp_path / f"images{zipped}"
        _lists(v3src, zipped)
        refs = image_refs(v3src)
        assert len(refs) == 2
        first = refs["flash/gpu_kernel_image.attn_fwd/attn_fwd-Sig-F__a__P__1__CO__w--Arch_gfx908.hsaco"]
        if zipped:
            assert first == ZipRef("amd-gfx908/flash/attn_fwd.zip", "Q=fp16", ";;#P;1")
            (images / "amd-gfx908" / "flash").mkdir(parents=True)
            with zipfile.ZipFile(images / first.file, "w", zipfile.ZIP_STORED) as z:
                z.writestr("Q=fp16", aks2({";;#P;1": a, ";;#P;2": b}))
        else:
            assert first == KernelRef("amd-gfx908/flash/attn_fwd/FONLY__a", "attn_fwd-Sig-F__a__P__1__CO__w--Arch_gfx908")
            (images / first.file).parent.mkdir(parents=True)
            (images / first.file).write_bytes(aks2({r.name: img for r, img in zip(refs.values(), (a, b))}))
        assert set(packed_kernels(images)) == set(refs.values())
        got = package_images(images, first.file)
        assert got[first] == a and sorted(map(len, got.values())) == sorted((len(a), len(b)))


def test_release_tree_sources_and_the_message_without_one(tmp_path, monkeypatch):
    for env in (trees.SRC_ENV, trees.GIT_ENV):
        monkeypatch.delenv(env, raising=False)
    store = tmp_path / "upstream"
    store.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as t:
        for name, data in (("aotriton-0.11b/CMakeLists.txt", b"x"), ("aotriton-0.12b/CMakeLists.txt", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    (store / "aotriton-releases.tar.xz").write_bytes(buf.getvalue())
    (store / "TAGS").write_text("0.11b c1 2025-01-01\n0.12b c2 2025-06-01\nmain(0.14.0-dev) c3 2026-08-19\n")
    monkeypatch.setenv(trees.ARCHIVE_ENV, str(store / "aotriton-releases.tar.xz"))
    assert trees.archive_entries(store / "aotriton-releases.tar.xz")["0.14.0-dev"] == (
        store / "aotriton-main-20260819.tar.xz", "aotriton-main")
    where = trees.release_tree("0.11b", tmp_path / "work" / "tree")
    assert where == str(store / "aotriton-releases.tar.xz")
    assert (tmp_path / "work" / "tree" / "CMakeLists.txt").read_bytes() == b"x"
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["tree"]     # only the one tree
    with pytest.raises(UserError, match="no AOTriton 0.13b tree") as exc:
        trees.release_tree("0.13b", tmp_path / "work" / "other")
    assert all(env in exc.value.hint for env in (trees.SRC_ENV, trees.GIT_ENV, trees.ARCHIVE_ENV))
    assert not (tmp_path / "work" / "other").exists()

    def cut(release, folder):   # a fetch interrupted midway (a clone cut off)
        folder.mkdir()
        (folder / "half").write_bytes(b"")
        raise UserError("cut off")

    def whole(release, folder):
        folder.mkdir()
        (folder / "CMakeLists.txt").write_bytes(b"z")
        return "fetched"

    with pytest.raises(UserError, match="cut off"):
        trees.release_tree("0.13b", tmp_path / "work" / "other", fetch=cut)
    assert not (tmp_path / "work" / "other").exists()    # whole or absent
    assert trees.release_tree("0.13b", tmp_path / "work" / "other", fetch=whole) == "fetched"
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["other", "tree"]
    assert [p.name for p in (tmp_path / "work" / "other").iterdir()] == ["CMakeLists.txt"]


def test_a_git_dir_whose_tag_moved_is_no_tree_of_that_release(tmp_path, monkeypatch):
    """AOTRITON_GIT is archived at the commit the release's record names, never at the tag's name."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "aotriton"
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q", str(repo)], ["-C", str(repo), "commit", "-q", "--allow-empty", "-m", "moved"],
                ["-C", str(repo), "tag", "0.11b"]):
        subprocess.run(["git", *cmd], check=True, env=env, capture_output=True)
    monkeypatch.delenv(trees.SRC_ENV, raising=False)
    monkeypatch.setenv(trees.GIT_ENV, str(repo))
    with pytest.raises(UserError, match=f"git archive {by_release('0.11b').commit} \\(the commit of 0.11b\\)"):
        trees.release_tree("0.11b", tmp_path / "work" / "tree")
    assert not (tmp_path / "work" / "tree").exists()


def _bundle(tmp_path: Path, name: str, spec_yaml: bytes, **over) -> Path:
    files = {"lib/libaotriton_v2.so.0.11.0": b"lib", "spec.yaml": spec_yaml,
             "lib/aotriton.images/amd-gfx908/flash/attn_fwd/FONLY__a.aks2": aks2({"k": kernel()})}
    data = minimal_manifest(files, "lib/libaotriton_v2.so.0.11.0", **over)
    out = tmp_path / f"{name}.mi100-bundle.zip"
    write_bundle(out, manifest_of(data, str(out)), files)
    return out


def test_cli_refusals_are_one_message_and_leave_nothing(tmp_path, monkeypatch):
    import tempfile

    from codegen.formats.spec import load_spec

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    for env in (trees.SRC_ENV, trees.GIT_ENV):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv(trees.ARCHIVE_ENV, str(tmp_path / "no-archive.tar.xz"))
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    smoke = (REPO / "rules" / "examples" / "smoke.yaml").read_bytes()
    real = {"sha256": load_spec(REPO / "rules" / "examples" / "smoke.yaml").sha256, "file": "spec.yaml"}
    triton = {"toolchain": {"triton": "3.5.1"}, "kernels": "dispatched"}
    junk = tmp_path / "junk.mi100-bundle.zip"
    junk.write_bytes(b"not a zip")
    cases = {
        "not a bundle or a truncated one": junk,
        "records no Triton version": _bundle(tmp_path, "old", smoke, spec=real),
        "is not a version": _bundle(tmp_path, "pip", smoke, spec=real,
                                    built_with={"toolchain": {"triton": "3.5.1 --index-url=http://x"}}),
        "not the one its manifest names": _bundle(tmp_path, "respec", smoke, spec={**real, "sha256": "1" * 64},
                                                  built_with=triton),
        "no AOTriton 0.11b tree to rebuild from": _bundle(tmp_path, "ok", smoke, spec=real, built_with=triton),
    }
    for words, path in cases.items():
        r = CliRunner().invoke(app, ["bundle", "verify", str(path), "--rebuild", "2", "--json"])
        assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output, (words, r.output)
        assert r.stdout == ""                                # no report: nothing was verified
    assert list((tmp_path / "tmp").iterdir()) == []          # every temporary folder removed
    r = CliRunner().invoke(app, ["bundle", "verify", str(junk), "--rebuild", "0"])
    assert r.exit_code == 2 and "Traceback" not in r.output
