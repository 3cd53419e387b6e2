"""codegen.models.image_name, the one model of upstream's kernel image names: every spelling
parses and prints back byte for byte (every real tree's names: tests/test_apply_real.py), refuses
what it does not spell, and a release record naming a third spelling is followed by plan (the
compile list), formats (the dispatch tables) and the bundle rows without any other change."""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3

import pytest

from codegen.formats.aks2 import ImageError, blake2b_64, parse_dispatch_table, parse_zip_table
from codegen.models.image_name import ENTRY, SIG, Spelling
from codegen.plan.kernel_list import parse_compile_list
from codegen.models.functional import Functional
from codegen.ship.rows import TuningDatabase, match_row, parse_stem
from codegen.upstream import SUPPORTED
from codegen.upstream.releases import by_release

SIG_NAME = "attn_fwd-Sig-F__＊fp16@16_64_F_F_0_0__P__0_2_64_32_False_1__CO__wave2_warp4_stg1--Arch_gfx908"
ENTRY_NAME = (";;#F;Q='*fp16:16';BLOCK_DMODEL=64;PADDED_HEAD=False;ENABLE_DROPOUT=False;CAUSAL_TYPE=0;BIAS_TYPE=0"
              ";;#P;PERSISTENT_TYPE=0;GRID_CU_MULTIP=2;BLOCK_M=64;BLOCK_N=32;PRE_LOAD_V=False;NUM_XCDS=1"
              ";;#CO;waves_per_eu=2;num_warps=4;num_stages=1;;arch=gfx908")


def test_every_release_names_a_spelling():
    assert by_release("0.12.1b").image_names is SIG and by_release("0.13b").image_names is ENTRY
    assert {r.image_names for r in SUPPORTED if r.image_format == "zip"} == {ENTRY}
    assert {r.image_names for r in SUPPORTED if r.image_format == "aks2"} == {SIG}


def test_sig_round_trip():
    n = SIG.parse(SIG_NAME)
    assert (n.kernel, n.functional, n.perf, n.waves_per_eu, n.num_warps, n.num_stages, n.arch) == (
        "attn_fwd", "＊fp16@16_64_F_F_0_0", ("0", "2", "64", "32", "False", "1"), 2, 4, 1, "gfx908")
    assert str(n) == n.file_stem == SIG_NAME and n.perf_text == "0_2_64_32_False_1"
    assert str(n.with_waves(1)) == SIG_NAME.replace("wave2", "wave1")
    assert SIG.functional_dtype(n.functional) == "*fp16:16" and SIG.functional_head_dim(n.functional) == 64
    tail = SIG_NAME[SIG_NAME.index("__P__"):]
    assert SIG.table_tail(n) == tail and SIG.parse_table(tail, "attn_fwd", n.functional) == n


def test_entry_round_trip_and_file_digest():
    n = ENTRY.parse(ENTRY_NAME, "attn_fwd")
    assert n.named_perf["BLOCK_M"] == "64" and n.functional.startswith("Q='*fp16:16';") and n.arch == "gfx908"
    assert str(n) == ENTRY_NAME and n.file_stem == "attn_fwd-" + hashlib.sha256(ENTRY_NAME.encode()).hexdigest()
    assert ENTRY.functional_dtype(n.functional) == "*fp16:16" and ENTRY.functional_head_dim(n.functional) == 64
    assert ENTRY.parse(ENTRY_NAME) is None            # the name leaves the kernel out: its zip gives it
    assert ENTRY.table_tail(n) == ENTRY_NAME and ENTRY.parse_table(ENTRY_NAME, "attn_fwd", n.functional) == n
    assert ENTRY.parse_table(ENTRY_NAME, "attn_fwd", "Q='*bf16:16'") is None


@pytest.mark.parametrize("spelling,name", [
    (SIG, SIG_NAME.replace("wave2", "wave02")),       # not how int() prints: no round trip, no name
    (SIG, SIG_NAME.replace("--Arch_", "--Arch-")),
    (SIG, SIG_NAME + "\n"),
    (SIG, "not-a-name"),
    (ENTRY, ENTRY_NAME.replace("num_stages=1", "num_stages=x")),
    (ENTRY, ENTRY_NAME.replace("BLOCK_M=64;", "BLOCK_M;")),   # a perf field without its value
    (ENTRY, "x" + ENTRY_NAME),
])
def test_what_a_spelling_does_not_spell_is_no_name(spelling, name):
    assert spelling.parse(name, "attn_fwd") is None


# --- a release that renames its images ------------------------------------------------------------
# what a release renaming its images adds to codegen.models.image_name (and names in its record)
THIRD = Spelling("third (a test's)", "{kernel}@{functional}@{perf}@w{waves_per_eu}n{num_warps}s{num_stages}@{arch}",
                 head="{kernel}@{functional}", sep=",")
FAKE = dataclasses.replace(by_release("0.12.1b"), release="0.99b", version=(0, 99, 0), image_names=THIRD)
FUNC = "*fp16:16,64,causal0"
NAME = f"attn_fwd@{FUNC}@0,2,64,32,0@w2n4s1@gfx908"


def test_a_third_spelling_round_trips():
    n = FAKE.image_names.parse(NAME)
    assert str(n) == NAME and n.perf == ("0", "2", "64", "32", "0") and n.waves_per_eu == 2
    assert SIG.parse(NAME) is None and ENTRY.parse(NAME, "attn_fwd") is None


def test_plan_follows_a_third_spelling(tmp_path):
    src = tmp_path / "tree" / "tritonsrc"
    src.mkdir(parents=True)
    (src / "flash.py").write_text("def attn_fwd(Q, K, BLOCK_M, BLOCK_N):\n    pass\n")
    build = tmp_path / "build"
    build.mkdir()
    listing = build / "Bare.compile"
    listing.write_text(f"{build}/flash/{NAME}.hsaco;{src}/flash.py;attn_fwd;4;1;2;gfx908;*fp16:16, *fp16:16, 64, 32\n")
    (e,) = parse_compile_list(listing, tmp_path / "tree", build, FAKE.image_names)
    assert (e.id, e.functional, e.perf) == (NAME, FUNC, "0,2,64,32,0")
    assert e.config.name == "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1"   # dtype and head dim from its functional
    moved = e.with_waves(1, FAKE.image_names)
    assert moved.id == NAME.replace("@w2", "@w1") and moved.hsaco == f"flash/{moved.id}.hsaco"
    (old,) = parse_compile_list(listing, tmp_path / "tree", build, SIG)     # another release's spelling: unnamed
    assert old.functional == "" and old.with_waves(1, SIG).id == NAME


def _table(package: str, tails: list[str], func: str, path_key: str = "PACKAGE_PATH") -> str:
    rows = []
    for i, tail in enumerate(tails):
        h = blake2b_64(package + tail)
        rows.append(f"    {{ 0x{h >> 32:08x}u, 0x{h & 0xFFFFFFFF:08x}u, {i}, 1 }}, // {h:016x} = b2sum -l 64 <<< "
                    f"{package}{tail}")
    return (f'constexpr pstring_view {path_key}\n{{ R"xyzw({package})xyzw" }};\n'
            f'constexpr std::string_view FUNC_NAME {{ R"xyzw({func})xyzw" }};\n' + "\n".join(rows) + "\n};\n")


def test_formats_follow_a_third_spelling(tmp_path):
    package = "amd-gfx908/flash/attn_fwd/FONLY__x"
    table = tmp_path / "t.cc"
    n = THIRD.parse(NAME)
    table.write_text(_table(package, [THIRD.table_tail(n), THIRD.table_tail(n.with_waves(1))], FUNC), encoding="utf-8")
    refs = parse_dispatch_table(table, FAKE.image_names)
    assert [r.stem for r in refs] == [NAME, NAME.replace("@w2", "@w1")] and {r.kernel for r in refs} == {"attn_fwd"}
    with pytest.raises(ImageError, match="spelt as sig"):
        parse_dispatch_table(table, SIG)
    zipped = tmp_path / "z.cc"    # 0.13b's tables, in the third spelling
    zipped.write_text(_table("amd-gfx908/flash/attn_fwd.zip", [THIRD.table_tail(n)], FUNC, "FLATZIP_PATH"))
    (ref,) = parse_zip_table(zipped, FAKE.image_names)
    assert (ref.member, ref.entry, ref.kernel) == (FUNC, NAME, "attn_fwd")


def test_rows_follow_a_third_spelling():
    cols = ["gpu", "inputs$Q_dtype", "inputs$Max_seqlen_q", "inputs$Max_seqlen_k", "inputs$CAUSAL_TYPE",
            "inputs$BLOCK_DMODEL", "inputs$ENABLE_DROPOUT", "inputs$PADDED_HEAD", "inputs$BIAS_TYPE",
            "tuned_kernel$PERSISTENT_TYPE", "tuned_kernel$GRID_CU_MULTIP", "tuned_kernel$BLOCK_M",
            "tuned_kernel$BLOCK_N", "tuned_kernel$PRE_LOAD_V", "compiler_options$waves_per_eu",
            "compiler_options$num_warps", "compiler_options$num_stages"]
    conn = sqlite3.connect(":memory:")
    conn.execute('create table "FLASH$attn_fwd" (' + ", ".join(f'"{c}"' for c in cols) + ")")
    conn.execute('insert into "FLASH$attn_fwd" values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                 ("gfx908_mod0", "torch.float16", 128, 128, 0, 64, 0, 0, 0, 0, 2, 64, 32, 0, 2, 4, 1))
    tdb = TuningDatabase.from_sqlite([conn])
    stem = f"amd-gfx908/flash/attn_fwd/FONLY__x/{NAME}"
    assert parse_stem(stem, FAKE.image_names) == THIRD.parse(NAME)
    got = match_row(tdb, "gfx908_mod0", stem, Functional("fp16", 64, False, False, False, 100, 100), FAKE.image_names)
    assert got.ok and got.got == got.want == "0_2_64_32_0|wave2_warp4_stg1"
    wrong = match_row(tdb, "gfx908_mod0", stem.replace("@w2", "@w1"), Functional("fp16", 64, False, False, False, 100, 100),
                      FAKE.image_names)
    assert not wrong.ok and match_row(tdb, "gfx908_mod0", stem, Functional("fp16", 64, False, False, False, 9, 9), SIG) is None
