"""Parsing of the generator's compile list, config naming and counting (fast, synthetic inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.core.errors import UpstreamError, UserError
from codegen.plan.kernel_list import (
    KernelEntry,
    config_of,
    kernel_arg_names,
    parse_compile_list,
)
from codegen.models.image_name import SIG
from codegen.plan.summary import summarize

# A synthetic kernel module tree (our own code): flash.py re-exports kernels from siblings,
# like the layout the compile list points at.
FLASH = "from fwd import attn_fwd\nfrom pre import bwd_pre as bwd_preprocess\n"
FWD = "def attn_fwd(Q, K, Out, Stride, BLOCK_DMODEL, PADDED_HEAD, BLOCK_M, BLOCK_N, PRE_LOAD_V):\n    pass\n"
PRE = "def bwd_pre(Out, DO, Delta, BLOCK_M, D_HEAD, PADDED_HEAD):\n    pass\n"


def _tree(tmp_path: Path) -> Path:
    src = tmp_path / "tree" / "tritonsrc"
    src.mkdir(parents=True)
    (src / "flash.py").write_text(FLASH)
    (src / "fwd.py").write_text(FWD)
    (src / "pre.py").write_text(PRE)
    return tmp_path / "tree"


def _fwd_line(tree: Path, build: Path, dtype: str, hd: int, m: int, n: int, wpe: int, plv: bool,
              prefix: str = "") -> str:
    tok = dtype.replace("*", "＊").replace(":", "@")
    name = (f"attn_fwd-Sig-F__{tok}_{hd}_F__P__0_2_{m}_{n}_{plv}__CO__wave{wpe}_warp4_stg1"
            f"--Arch_gfx908.hsaco")
    hsaco = f"{tree}/../build/flash/gpu_kernel_image.attn_fwd/{name}"
    sig = f"{dtype}, {dtype}, {dtype}, u64:8, {hd}, False, {m}, {n}, {plv}"
    return f"{prefix}{hsaco};{tree}/tritonsrc/flash.py;attn_fwd;4;1;{wpe};gfx908;{sig}"


def _pre_line(tree: Path, dtype: str, hd: int) -> str:
    tok = dtype.replace("*", "＊").replace(":", "@")
    name = f"bwd_preprocess-Sig-F__{tok}_{hd}_F__P__128__CO__wave2_warp4_stg1--Arch_gfx908.hsaco"
    sig = f"{dtype}, {dtype}, *fp32:16, 128, {hd}, False"
    return f"{tree}/../build/flash/gpu_kernel_image.bwd_preprocess/{name};{tree}/tritonsrc/flash.py;bwd_preprocess;4;1;2;gfx908;{sig}"


def test_parse_compile_list_names_and_paths(tmp_path):
    tree = _tree(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    lines = [
        _fwd_line(tree, build, "*fp16:16", 64, 64, 32, 2, False),
        _fwd_line(tree, build, "*bf16:16", 32, 128, 64, 1, True),
        _pre_line(tree, "*fp32:16", 32),
    ]
    listing = build / "Bare.compile"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    entries = parse_compile_list(listing, tree, build, SIG)
    assert [e.config.name for e in entries] == [
        "attn_fwd.gfx908.bf16.d32.M128N64.wpe1.w4.s1.plv1",
        "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0",
        "bwd_preprocess.gfx908.fp32.d32.M128.wpe2.w4.s1",
    ]
    e = entries[1]
    c = e.config
    assert (c.family, c.dtype, c.head_dim, c.block_m, c.block_n, c.pre_load_v) == ("attn_fwd", "fp16", 64, 64, 32, False)
    assert e.source == "tritonsrc/flash.py"
    assert e.hsaco.startswith("flash/gpu_kernel_image.attn_fwd/attn_fwd-Sig-")
    assert e.hsaco.endswith(".hsaco") and not e.id.endswith(".hsaco")
    assert (c.num_warps, c.num_stages, c.waves_per_eu, c.arch) == (4, 1, 2, "gfx908")
    assert c.config_key == "M64N32.wpe2.w4.s1.plv0"
    assert entries[2].config.head_dim == 32 and entries[2].config.block_n is None
    assert e.model_dump()["config"] == "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"  # JSON: its name
    assert KernelEntry.model_validate(e.model_dump()) == e


def test_parse_compile_list_012_prefix_fields(tmp_path):
    tree = _tree(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    listing = build / "Bare.compile"
    listing.write_text(_fwd_line(tree, build, "*fp16:16", 32, 16, 16, 2, False,
                                 prefix="default;/venv/bin/python;") + "\n", encoding="utf-8")
    (e,) = parse_compile_list(listing, tree, build, SIG)
    assert e.config.name == "attn_fwd.gfx908.fp16.d32.M16N16.wpe2.w4.s1.plv0"


def test_parse_compile_list_rejects_bad_and_duplicate_lines(tmp_path):
    tree = _tree(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    listing = build / "Bare.compile"
    listing.write_text("a;b;c\n", encoding="utf-8")
    with pytest.raises(UpstreamError, match=r"Bare.compile:1: unexpected compile-list line"):
        parse_compile_list(listing, tree, build, SIG)
    line = _fwd_line(tree, build, "*fp16:16", 32, 16, 16, 2, False)
    listing.write_text(f"{line}\n{line}\n", encoding="utf-8")
    with pytest.raises(UpstreamError, match="listed twice"):
        parse_compile_list(listing, tree, build, SIG)


def test_kernel_arg_names_follows_imports(tmp_path):
    tree = _tree(tmp_path)
    names = kernel_arg_names(str(tree / "tritonsrc" / "flash.py"), "bwd_preprocess")
    assert names == ("Out", "DO", "Delta", "BLOCK_M", "D_HEAD", "PADDED_HEAD")
    assert kernel_arg_names(str(tree / "tritonsrc" / "flash.py"), "missing") is None


def test_config_name_matches_kernel_config_naming():
    assert config_of("bwd_kernel_dq", "gfx908", "fp16", 64, 64, 32, 2, 4, 1, None).name == \
        "bwd_kernel_dq.gfx908.fp16.d64.M64N32.wpe2.w4.s1"
    # pre_load_v is an attn_fwd axis only
    assert config_of("bwd_kernel_dq", "gfx908", "fp16", 64, 64, 32, 2, 4, 1, True).name.endswith(".s1")
    assert config_of("debug_simulate_encoded_softmax", "gfx908", "fp32", None, 64, 32, 2, 4, 1, None).name == \
        "debug_simulate_encoded_softmax.gfx908.fp32.M64N32.wpe2.w4.s1"


def test_summarize_counts(tmp_path):
    tree = _tree(tmp_path)
    build = tmp_path / "build"
    build.mkdir()
    lines = [_fwd_line(tree, build, dt, hd, 64, 32, w, False)
             for dt in ("*fp16:16", "*bf16:16") for hd in (32, 64) for w in (1, 2)]
    lines.append(_pre_line(tree, "*fp16:16", 64))
    listing = build / "Bare.compile"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    s = summarize(parse_compile_list(listing, tree, build, SIG), ["gfx908_mod0"], "0.11b")
    assert s.total == 9
    assert s.by_family == {"attn_fwd": 8, "bwd_preprocess": 1}
    assert s.by_head_dim == {"32": 4, "64": 5}
    assert s.by_dtype == {"bf16": 4, "fp16": 5}
    assert s.by_config["attn_fwd.gfx908.fp16.d64.M64N32.wpe1.w4.s1.plv0"] == 1
    assert s.head_dims == [32, 64] and s.gpu == "gfx908_mod0"


def test_gpu_names_have_one_parser():
    from codegen.models.target import gpu_arch, gpu_mod

    assert (gpu_arch("gfx908_mod0"), gpu_mod("gfx908_mod0")) == ("gfx908", 0)
    assert (gpu_arch("gfx90a_mod1"), gpu_mod("gfx90a_mod1")) == ("gfx90a", 1)
    for bad in ("gfx908", "gfx908_mod", "mi100"):
        with pytest.raises(ValueError):
            gpu_arch(bad)
