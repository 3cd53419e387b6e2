"""The default spec, config expansion and naming, warnings, the JSON Schema golden file."""

from __future__ import annotations

import pytest

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from codegen.cli import app
from codegen.models import KernelConfig, expand_family, expand_space
from codegen.core.resources import default_spec_path
from codegen.formats.spec import load_spec, spec_json_schema

REPO = Path(__file__).resolve().parents[1]


def test_default_spec_is_mi100():
    loaded = load_spec(None)
    spec = loaded.spec
    assert spec.arch == "gfx908" and spec.gpus == ["gfx908_mod0"]
    assert spec.head_dims == [32, 64]
    assert sorted(spec.dtypes) == ["bf16", "fp16", "fp32"]
    assert spec.hardware.vgprs_per_lane == 256 and not spec.hardware.unified_register_file
    assert loaded.warnings == []


def test_config_names_encode_every_axis():
    cfg = KernelConfig("attn_fwd", "gfx908", "fp16", 64, 64, 32, 2, 4, 1, False)
    assert cfg.name == "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"
    bwd = KernelConfig("bwd_kernel_dq", "gfx908", "bf16", 32, 32, 16, 1, 4, 1)
    assert bwd.name == "bwd_kernel_dq.gfx908.bf16.d32.M32N16.wpe1.w4.s1"


def test_config_name_has_one_parser_and_one_printer():
    spec = load_spec(None).spec
    cfgs = [c for group in expand_space(spec).values() for c in group]
    assert len(cfgs) > 100
    for c in cfgs:
        assert KernelConfig.parse(c.name) == c and str(c) == c.name and c.tunable
        assert c.with_waves(1).limit_key == c.limit_key and ".wpe" not in c.limit_key
        assert c.with_waves(3).name == c.name.replace(f".wpe{c.waves_per_eu}.", ".wpe3.")
    pre = KernelConfig.parse("bwd_preprocess.gfx908.fp16.d64.M128.wpe2.w4.s1")
    assert (pre.block_m, pre.block_n, pre.tunable) == (128, None, False)
    assert pre.config_key == "M128.wpe2.w4.s1"
    dbg = KernelConfig.parse("debug_simulate_encoded_softmax.gfx908.fp32.M64N32.wpe2.w4.s1")
    assert dbg.head_dim is None and dbg.config_key == "M64N32.wpe2.w4.s1"
    for bad in ("attn_fwd.gfx908.fp16.d64.M64N32.w4.s1", "attn_fwd.gfx908.fp16.d064.M64N32.wpe2.w4.s1",
                "attn_fwd.gfx908.fp16.d64.N32.wpe2.w4.s1", "x", "",
                "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1\n", "attn_fwd.gfx908.fp16.d6\u0664.M64N32.wpe2.w4.s1"):
        with pytest.raises(ValueError):
            KernelConfig.parse(bad)
        assert KernelConfig.try_parse(bad) is None


_NUM = st.text(alphabet="0123456789\u0664", min_size=1, max_size=3)  # leading zeros, a non-ASCII digit
_OPT = lambda fmt: st.none() | _NUM.map(fmt.format)  # noqa: E731


@settings(max_examples=400, deadline=None)
@given(st.tuples(st.sampled_from(["attn_fwd", "bwd_preprocess", "Attn", "x"]), _OPT(".d{}"), _OPT(".M{}"),
                 _OPT("N{}"), _NUM, _NUM, _NUM, st.sampled_from(["", ".plv0", ".plv1", ".plv2"]),
                 st.sampled_from(["", "\n", " ", ".x"])))
def test_a_name_parses_only_when_it_is_the_printed_spelling(parts):
    """Whatever parses is exactly the name its config prints (parse has no roundtrip check: its
    pattern admits one spelling), and every printed spelling parses."""
    family, hd, bm, bn, wpe, warps, stages, plv, tail = parts
    name = (f"{family}.gfx908.fp16{hd or ''}{bm or ''}{bn or ''}.wpe{wpe}.w{warps}.s{stages}{plv}{tail}")
    cfg = KernelConfig.try_parse(name)
    if cfg is not None:
        assert cfg.name == name
    canonical = all(p is None or p.lstrip(".dMN") == str(int(p.lstrip(".dMN"))) and p.isascii()
                    for p in (hd, bm, bn, wpe, warps, stages))
    valid = (canonical and family in ("attn_fwd", "bwd_preprocess", "x") and not (bn and not bm)
             and plv != ".plv2" and tail == "")
    assert (cfg is not None) == valid, name


def test_default_space_respects_fork_lessons_and_exclusions():
    spec = load_spec(None).spec
    for family, cfgs in expand_space(spec).items():
        assert cfgs, family
        names = [c.name for c in cfgs]
        assert len(names) == len(set(names))
        for c in cfgs:
            assert c.block_m >= c.block_n  # M < N was faulty in the gfx908 fork
            assert not (c.num_warps == 1 and c.block_m * c.block_n >= 8192)
            # 2-7 configs per family and (dtype, head dim): a small starting space (2: fuse fp32
            # d64, where precompile pruned both waves_per_eu=2 variants for spilling)
        for dt in spec.dtypes:
            for hd in spec.head_dims:
                assert 2 <= len(expand_family(spec, family, dt, hd)) <= 8
    fwd = expand_family(spec, "attn_fwd", "fp16", 64)
    assert all(c.waves_per_eu == 1 for c in fwd if c.block_m == 128)
    assert all(c.block_m < 128 for c in expand_family(spec, "attn_fwd", "fp32", 64))


def test_adding_head_dim_128_is_a_one_line_edit(tmp_path):
    text = (REPO / "rules/mi100.yaml").read_text()
    edited = text.replace("head_dims: [32, 64]\n", "head_dims: [32, 64, 128]\n")
    assert sum(a != b for a, b in zip(text.splitlines(), edited.splitlines())) == 1
    p = tmp_path / "mi100-128.yaml"
    p.write_text(edited)
    loaded = load_spec(p)
    assert loaded.spec.head_dims == [32, 64, 128]
    assert {c.head_dim for c in expand_space(loaded.spec)["attn_fwd"]} == {32, 64, 128}


def test_single_head_dim_and_alu_dtype_warn_but_pass(tmp_path):
    text = (REPO / "rules/mi100.yaml").read_text()
    text = text.replace("head_dims: [32, 64]\n", "head_dims: [64]\n")
    text = text.replace("matrix_core_dtypes: [fp16, bf16, fp32]", "matrix_core_dtypes: [fp16, bf16]")
    p = tmp_path / "w.yaml"
    p.write_text(text)
    loaded = load_spec(p)
    assert len(loaded.warnings) == 2
    assert any("fp32" in w and "matrix-core" in w for w in loaded.warnings)
    assert all(":" in w.split(" ")[0] for w in loaded.warnings)
    result = CliRunner().invoke(app, ["spec", "check", str(p)])
    assert result.exit_code == 0
    assert "warning:" in result.output


def test_spec_sha_ignores_comments(tmp_path):
    text = (REPO / "rules/mi100.yaml").read_text()
    p = tmp_path / "c.yaml"
    p.write_text("# another comment\n" + text.replace("# AOTriton's GPU names", "# renamed"))
    assert load_spec(p).sha256 == load_spec(None).sha256


def test_json_schema_golden_is_current():
    committed = (REPO / "rules/schema/target-spec.schema.json").read_text()
    assert committed == spec_json_schema(), (
        "regenerate: mi100-codegen spec schema > rules/schema/target-spec.schema.json"
    )
    schema = json.loads(committed)
    assert "tuning" in schema["properties"] and schema["additionalProperties"] is False


def test_spec_schema_command_prints_it():
    result = CliRunner().invoke(app, ["spec", "schema"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["title"] == "mi100-codegen target spec"


def test_every_example_spec_is_valid():
    specs = sorted((REPO / "rules").rglob("*.yaml"))
    names = {p.relative_to(REPO / "rules").as_posix() for p in specs}
    assert {"mi100.yaml", "examples/smoke.yaml"} <= names, names  # never passes on an empty glob
    for p in specs:
        loaded = load_spec(p)
        assert loaded.spec.arch and loaded.sha256, p


def test_one_rule_matcher_for_exclusions_caps_and_replacements():
    from codegen.models.match import rule_matches
    from codegen.models.rows import RowTile
    from codegen.models.target import ExcludeRule, TileReplacement, WavesCap

    cfg = KernelConfig("attn_fwd", "gfx908", "fp16", 64, 128, 64, 2, 4, 1, False)
    tile = RowTile("attn_fwd", "fp16", 64, 128, 64)
    assert rule_matches(ExcludeRule(reason="r", block_m=128, dtype="fp16"), cfg)
    assert not rule_matches(ExcludeRule(reason="r", block_m=128, dtype="bf16"), cfg)
    assert rule_matches(ExcludeRule(reason="r", min_tile_area=128 * 64), cfg)
    assert not rule_matches(ExcludeRule(reason="r", min_tile_area=128 * 64 + 1), cfg)
    assert rule_matches(WavesCap(block_m=128, block_n=64, max_waves_per_eu=1, reason="r"), tile)
    assert not rule_matches(WavesCap(family="bwd_kernel_dq", block_m=128, block_n=64, max_waves_per_eu=1,
                                     reason="r"), tile)
    rep = TileReplacement(family="attn_fwd", block_m=128, block_n=64, head_dim=64, to=(64, 64), reason="r")
    assert rule_matches(rep, tile) and rule_matches(rep, cfg)
    assert not rule_matches(rep, RowTile("attn_fwd", "fp16", 32, 128, 64))


def test_one_dtype_table_has_every_spelling():
    from codegen.models.dtypes import DTYPE_INFO, by_signature, by_torch
    from codegen.models.target import DTYPE_BYTES, DTYPES

    assert tuple(DTYPE_INFO) == DTYPES
    for short, d in DTYPE_INFO.items():
        assert d.bytes == DTYPE_BYTES[short]
        assert by_torch(d.torch) is d and by_torch(d.torch_attr) is d and by_signature(d.triton_signature) is d
    assert DTYPE_INFO["bf16"].db_value == "torch.bfloat16" and DTYPE_INFO["fp32"].triton_signature == "*fp32:16"


def test_sgpr_occupancy_steps_stay_within_the_addressable_sgprs(tmp_path):
    """hardware.sgprs_per_wave bounds the SGPR counts of the occupancy table (a located error)."""
    from codegen.core.errors import SpecError

    text = default_spec_path().read_text()
    assert "sgprs_per_wave: 102" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("sgprs_per_wave: 102", "sgprs_per_wave: 90"))  # the step [100, 8] exceeds it
    with pytest.raises(SpecError) as exc:
        load_spec(bad)
    assert "hardware.sgpr_occupancy" in str(exc.value) and "exceed the 90 a wave can address" in str(exc.value)
