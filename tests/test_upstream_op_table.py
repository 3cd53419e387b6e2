"""codegen.formats.op_table on a hand-written table in the generator's form (the real trees'
tables: tests/test_build_reach.py): trivial and tuned entries, several arch blocks, the backend
index from the header, and what it refuses."""

from __future__ import annotations

import pytest

from codegen.core.errors import UpstreamError
from codegen.formats.op_table import read_bwd_op_table

HEADER = """\
struct OpAttnBwdContext {
    enum BackendEnum : int32_t {
        None = -1,
        kMetro_TritonSplit = 0,
        kShim_BwdKernelFuse = 1,
        kMetro_AiterAsm = 2,
        Max = 3
    };
};
"""

IFACE = """\
int64_t OpAttnBwdContext::godel_number() const
{
    int64_t sum = 0;
    const auto& args = *params;
    {
        int64_t number = -1;
        if (args.Q->dtype() == DType::kFloat16) number = 0 ;
        if (args.Q->dtype() == DType::kBFloat16) number = 1 ;
        sum += number * 2;
    }
    {
        int64_t number = -1;
        if (args.PADDED_HEAD == false) number = 0 ;
        if (args.PADDED_HEAD == true) number = 1 ;
        sum += number * 1;
    }

    return sum;
}

OpAttnBwdContext::OpTuneTableEntry
OpAttnBwdContext::optune_table[][ 4 ] = {
    {
        &optune::Optune_op_attn_bwd__A0__F0,
        &optune_op_attn_bwd__Trivial_kMetro_TritonSplit,
        &optune::Optune_op_attn_bwd__A0__F2,
        &optune_op_attn_bwd__Trivial_kShim_BwdKernelFuse,
    },
ARCH1};
"""


def _lut(name: str, rows: str) -> str:
    return (f"#define CURRENT_ENTRY_PUBLIC {name}\n\nstatic int8_t lut[1][2][2] =\n{{\n// GPU gfx1030_mod0\n"
            f"{rows}\n// End of GPU gfx1030_mod0\n}}\n;\n")


def _flash(tmp_path, arch1: str = ""):
    flash = tmp_path / "flash"
    (flash / "optune.op_attn_bwd").mkdir(parents=True)
    (flash / "iface.op_attn_bwd.h").write_text(HEADER, encoding="utf-8")
    (flash / "iface.op_attn_bwd.cc").write_text(IFACE.replace("ARCH1", arch1), encoding="utf-8")
    (flash / "optune.op_attn_bwd" / "a.cc").write_text(_lut("Optune_op_attn_bwd__A0__F0", "{{0,1},\n {0,0}}"))
    (flash / "optune.op_attn_bwd" / "b.cc").write_text(_lut("Optune_op_attn_bwd__A0__F2", "{{0,0},\n {2,0}}"))
    return flash


def test_trivial_and_tuned_entries(tmp_path):
    table = read_bwd_op_table(_flash(tmp_path))
    assert [f[0] for f in table.fields] == ["Q", "PADDED_HEAD"]
    assert table.fused == (True, False, False, True)  # tuned with a 1; trivial split; tuned without; trivial fused
    assert table.number({"Q": "kBFloat16", "PADDED_HEAD": "true"}) == 3
    assert not table.can_pick_fused({"Q": "kFloat16", "PADDED_HEAD": "true"})
    # a value the table does not number is not proven unreachable
    assert table.number({"Q": "kFloat32", "PADDED_HEAD": "true"}) is None
    assert table.can_pick_fused({"Q": "kFloat32", "PADDED_HEAD": "true"})
    assert read_bwd_op_table(tmp_path / "none") is None


def test_a_second_arch_block_can_pick_what_the_first_does_not(tmp_path):
    arch1 = """    {
        &optune_op_attn_bwd__Trivial_kMetro_TritonSplit,
        &optune_op_attn_bwd__Trivial_kShim_BwdKernelFuse,
        &optune_op_attn_bwd__Trivial_kMetro_TritonSplit,
        &optune_op_attn_bwd__Trivial_kMetro_TritonSplit,
    },
"""
    assert read_bwd_op_table(_flash(tmp_path, arch1)).fused == (True, True, False, True)


@pytest.mark.parametrize("damage", ["header", "entry", "count", "lut"])
def test_a_table_in_another_form_is_one_message(tmp_path, damage):
    flash = _flash(tmp_path)
    if damage == "header":
        (flash / "iface.op_attn_bwd.h").write_text("enum BackendEnum { kMetro_TritonSplit = 0 };\n")
    elif damage == "entry":
        (flash / "optune.op_attn_bwd" / "b.cc").unlink()
    elif damage == "count":
        text = (flash / "iface.op_attn_bwd.cc").read_text().replace("        &optune::Optune_op_attn_bwd__A0__F2,\n", "")
        (flash / "iface.op_attn_bwd.cc").write_text(text)
    else:
        (flash / "optune.op_attn_bwd" / "a.cc").write_text("#define CURRENT_ENTRY_PUBLIC Optune_op_attn_bwd__A0__F0\n")
    with pytest.raises(UpstreamError, match="not in the form this tool reads"):
        read_bwd_op_table(flash)
