"""verify_install on a synthetic install: images complete, missing, empty; symbols."""

from __future__ import annotations

import pytest

from codegen.imagebuild import verify as verify_mod
from codegen.formats.aks2 import ImageError, blake2b_64
from codegen.models.image_name import ENTRY
from codegen.imagebuild.verify import REQUIRED_SYMBOLS, V2_ATTN_SYMBOLS, V3_SYMBOLS, verify_install

from test_build_images import PKG, _aks2, _table

RAWS = [f"{PKG}__P__0_2_64_32_False__CO__wave1_warp4_stg1--Arch_gfx908",
        f"{PKG}__P__0_2_16_16_False__CO__wave2_warp4_stg1--Arch_gfx908"]
STEMS = [f"attn_fwd-Sig-F__＊fp16@16_F_F_0_0__P__0_2_64_32_False__CO__wave1_warp4_stg1--Arch_gfx908",
         f"attn_fwd-Sig-F__＊fp16@16_F_F_0_0__P__0_2_16_16_False__CO__wave2_warp4_stg1--Arch_gfx908"]


@pytest.fixture
def install(tmp_path, monkeypatch):
    build = tmp_path / "build"
    t = build / "v3src" / "flash" / "autotune.attn_fwd" / "FONLY.cc"
    t.parent.mkdir(parents=True)
    t.write_text(_table(RAWS), encoding="utf-8")
    prefix = tmp_path / "prefix"
    lib = prefix / "lib" / "libaotriton_v2.so.0.11.0"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    syms = {p + "XYZ" for p in [*REQUIRED_SYMBOLS.values(), *V2_ATTN_SYMBOLS.values(), *V3_SYMBOLS.values()]}
    monkeypatch.setattr(verify_mod, "defined_symbols", lambda _lib: syms)
    pkg = prefix / "lib" / "aotriton.images" / f"{PKG}.aks2"
    pkg.parent.mkdir(parents=True)
    return build, prefix, pkg, syms


def test_complete(install):
    build, prefix, pkg, _ = install
    pkg.write_bytes(_aks2([(STEMS[0], 64), (STEMS[1], 32)]))
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=True)
    assert v.ok, v.problems
    assert (v.kernels_referenced, v.kernels_packed, v.packages) == (2, 2, 1)
    assert v.summary()["kernels_by_family"] == {"attn_fwd": 2}


def test_missing_and_empty(install):
    build, prefix, pkg, _ = install
    pkg.write_bytes(_aks2([(STEMS[1], 0)]))
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=True)
    assert not v.ok
    assert len(v.missing) == 1 and STEMS[0] in v.missing[0]
    assert len(v.empty) == 1 and STEMS[1] in v.empty[0]


def test_missing_symbol_and_library(install, monkeypatch):
    build, prefix, pkg, syms = install
    monkeypatch.setattr(verify_mod, "defined_symbols",
                        lambda _lib: {s for s in syms if "check_gpu" not in s})
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=False)
    assert v.symbols["aotriton::v2::flash::check_gpu"] is False
    assert any("check_gpu" in p for p in v.problems)
    v2 = verify_install(prefix, build, version=(0, 12, 0), arch="gfx908", images=False)
    assert any("libaotriton_v2.so.0.12.0 is missing" in p for p in v2.problems)


def test_0_13_library_needs_no_v2_attention_entry_points(install, monkeypatch):
    """0.13b dropped the deprecated v2 attn_fwd/attn_bwd (its v2 namespace keeps check_gpu):
    with exports_v2_attn False only check_gpu and the v3 entry points are required."""
    build, prefix, pkg, syms = install
    v3_only = {s for s in syms if not any(s.startswith(p) for p in V2_ATTN_SYMBOLS.values())}
    monkeypatch.setattr(verify_mod, "defined_symbols", lambda _lib: v3_only)
    assert verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=False, v2_attn=False).ok
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=False)
    assert not v.ok and "aotriton::v2::flash::attn_fwd" in v.problems[0]


ZIP = "amd-gfx908/flash/attn_fwd.zip"
ZFUNC = "Q='*fp16:16';PADDED_HEAD=False;ENABLE_DROPOUT=False;CAUSAL_TYPE=0;BIAS_TYPE=0"
ZENTRIES = [f";;#F;{ZFUNC};;#P;BLOCK_M={m};BLOCK_N=16;;#CO;waves_per_eu=1;num_warps=4;num_stages=1;;arch=gfx908"
            for m in (16, 32, 64)]


def _zip_table(path: str = ZIP, entries: list[str] = ZENTRIES) -> str:
    """A dispatch table as AOTriton 0.13b generates it: FLATZIP_PATH, FUNC_NAME (the zip member)
    and one BLAKE2b-id line per kernel whose comment is the zip path plus the kernel's name."""
    rows = []
    for i, entry in enumerate(entries):
        h = blake2b_64(path + entry)
        rows.append(f"    {{ 0x{h >> 32:08x}u, 0x{h & 0xFFFFFFFF:08x}u, {i}, 1 }}, // {h:016x} = b2sum -l 64 <<< "
                    f"{path}{entry}")
    return (f'constexpr pstring_view FLATZIP_PATH\n#if defined(_WIN32)\n{{ LR"xyzw({path})xyzw" }};\n#else\n'
            f'{{ R"xyzw({path})xyzw" }};\n#endif\n'
            f'constexpr std::string_view FUNC_NAME   {{ R"xyzw({ZFUNC})xyzw"   }};\n'
            "static AOTRITON_NS::TritonKernelCompactMeta meta_list[] = {\n" + "\n".join(rows) + "\n};\n")


def test_zip_images_of_0_13(tmp_path, monkeypatch):
    """0.13b installs <arch>/<family>/<kernel>.zip; the runtime opens the zip a table names, takes the
    member named by its FUNC_NAME (an .aks2 cluster) and in it each kernel by name. Every link of
    that chain is checked: a missing zip, member or kernel is missing, an empty image is empty, a
    corrupt zip a problem."""
    import zipfile

    build = tmp_path / "build"
    t = build / "v3src" / "flash" / "autotune.attn_fwd" / "x.cc"
    t.parent.mkdir(parents=True)
    t.write_text(_zip_table(), encoding="utf-8")
    prefix = tmp_path / "prefix"
    lib = prefix / "lib" / "libaotriton_v2.so.0.13.0"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    monkeypatch.setattr(verify_mod, "defined_symbols",
                        lambda _lib: {p + "X" for p in [*REQUIRED_SYMBOLS.values(), *V3_SYMBOLS.values()]})
    kw = dict(version=(0, 13, 0), arch="gfx908", images=True, v2_attn=False, image_format="zip", names=ENTRY)
    v = verify_install(prefix, build, **kw)
    assert not v.ok and len(v.missing) == 3 and all(m.startswith(ZIP + ": " + ZFUNC) for m in v.missing)
    z = prefix / "lib" / "aotriton.images" / ZIP

    def install(members: dict[str, bytes]) -> None:
        z.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_STORED) as f:
            for name, data in members.items():
                f.writestr(name, data)

    install({ZFUNC: _aks2([(e, 64) for e in ZENTRIES]), "other": _aks2([("x", 8)])})
    v = verify_install(prefix, build, **kw)
    assert v.ok, v.problems
    assert (v.kernels_referenced, v.packages, v.kernels_packed) == (3, 1, 3)
    assert v.by_kernel == {"attn_fwd": 3}
    install({ZFUNC: _aks2([(ZENTRIES[0], 64), (ZENTRIES[1], 0)])})  # one kernel absent, one empty
    v = verify_install(prefix, build, **kw)
    assert not v.ok and v.missing == [f"{ZIP}: {ZFUNC} {ZENTRIES[2]}"] and v.empty == [f"{ZIP}: {ZFUNC} {ZENTRIES[1]}"]
    install({"another functional": _aks2([(e, 64) for e in ZENTRIES])})  # the member the table names is absent
    v = verify_install(prefix, build, **kw)
    assert not v.ok and len(v.missing) == 3
    z.write_bytes(b"PK\x03\x04 not a zip")
    v = verify_install(prefix, build, **kw)
    assert not v.ok and "not a readable image zip" in " ".join(v.problems)


def test_zip_table_comment_must_match_its_id(tmp_path):
    from codegen.formats.aks2 import parse_zip_table

    t = tmp_path / "x.cc"
    t.write_text(_zip_table().replace("BLOCK_M=32;", "BLOCK_M=33;", 1), encoding="utf-8")
    with pytest.raises(ImageError, match="does not match its BLAKE2b id"):
        parse_zip_table(t, ENTRY)


def test_tables_of_an_earlier_configuration_are_not_counted(install):
    """A build dir configured before for another spec keeps that spec's tables on disk; only the
    tables build.ninja compiles are what the library can select."""
    build, prefix, pkg, _ = install
    pkg.write_bytes(_aks2([(STEMS[0], 64), (STEMS[1], 32)]))
    current = build / "v3src" / "flash" / "autotune.attn_fwd" / "FONLY.cc"
    stale = current.with_name("STALE.cc")
    stale.write_text(_table([RAWS[0].replace("wave1", "wave3")]), encoding="utf-8")  # a kernel never packed
    (build / "build.ninja").write_text(f"build x.o: CXX_COMPILER {current.resolve()}\n", encoding="utf-8")
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=True)
    assert v.ok, v.problems
    (build / "build.ninja").write_text(f"build x.o: CXX {current.resolve()}\nbuild y.o: CXX {stale.resolve()}\n",
                                       encoding="utf-8")
    assert not verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=True).ok


def test_a_left_out_package_is_counted_apart_not_missing(install):
    """A package the build left out (codegen.imagebuild.reach) is not a missing one; any other still is."""
    from codegen.models.reach import LeftOut, Reach

    build, prefix, pkg, _ = install
    reach = Reach(proven_by="v3src/flash/iface.op_attn_bwd.cc", fused_kernels=2, kernels_left_out=2,
                  packages_left_out=[LeftOut(image=f"{PKG}.aks2", member=None, kernels=2)])
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=True, reach=reach)
    assert v.ok, v.problems
    assert (v.kernels_referenced, v.kernels_packed, v.left_out, v.packages) == (2, 0, 2, 0)
    assert v.summary()["kernels_left_out"] == 2
    other = Reach(packages_left_out=[
        LeftOut(image="amd-gfx908/flash/bwd_kernel_fuse/FONLY__other.aks2", member=None, kernels=1)])
    v = verify_install(prefix, build, version=(0, 11, 0), arch="gfx908", images=True, reach=other)
    assert not v.ok and v.left_out == 0 and len(v.missing) == 2


def test_the_build_summary_prints_from_the_typed_report():
    """`build` prints its summary from the BuildReport's typed parts (cli/build.py, issue 37 item 3):
    the GPU check by hipError_t name, the missing and empty kernels counted and listed, each problem."""
    from rich.console import Console

    from codegen.cli.build import _print_summary
    from codegen.imagebuild.builder import BuildReport
    from codegen.imagebuild.gpu_check import GpuCheck
    from codegen.imagebuild.verify import LIST_LIMIT, Verification

    ver = Verification(library="/p/lib/libaotriton_v2.so.0.11.0", symbols={"aotriton::v2::flash::attn_fwd": True},
                       images_dir="/p/lib/aotriton.images/amd-gfx908", packages=3, kernels_referenced=9,
                       kernels_packed=7, missing=[f"k{i}" for i in range(LIST_LIMIT + 2)], empty=["e"],
                       problems=["2 kernels missing"], by_kernel={"attn_fwd": 7}, left_out=4)
    rep = BuildReport(tree="/t", release="0.11b", arch="gfx908", spec="mi100", spec_sha256="a" * 64, prefix="/p",
                      build_dir="/b", log="/b/log", mode="images", verification=ver,
                      gpu_check=GpuCheck(arch="gfx908", results={"gfx908": 0, "gfx90a": 209}))
    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    _print_summary(con, rep)
    out = con.export_text()
    assert "attn_fwd ok" in out and "gfx908 hipSuccess, gfx90a hipErrorNoBinaryForGpu (ok: only" in out
    assert f"7 of 9 referenced kernels packed (missing {LIST_LIMIT + 2}, empty 1, left out 4" in out
    assert "by family  attn_fwd 7" in out and "problem: 2 kernels missing" in out
    assert out.count("  missing k") == LIST_LIMIT and "  empty e" in out
