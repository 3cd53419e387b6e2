"""Seeded rows x compile report: the waves_per_eu limits table render writes into
rows/<arch>.json, and apply's capping of the seeded rows to the largest spill-free waves_per_eu."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from codegen.apply.dbrows import build_db, db_targets
from codegen.formats.tuning_db import read_archive
from fake_tree import make_fake_tree
from codegen.models import KernelConfig
from codegen.models.image_name import ENTRY, SIG
from codegen.models.limits import CompileReport, cap_waves_per_eu, waves_per_eu_limits
from codegen.models.rows import OverlayInputs, RowsPlan
from codegen.render.inputs import load_limits, render_overlay
from codegen.render.overlay import plan_overlay
from codegen.formats.spec import load_spec
from codegen.upstream import detect

REPO = Path(__file__).resolve().parents[1]


def _report(verdicts: dict[str, str], arch: str = "gfx908") -> CompileReport:
    return CompileReport.model_validate({"arch": arch, "gpu": f"{arch}_mod0", "release": "0.11b", "triton": "3.5.1",
                                         "configs": {n: {"verdict": v, "kernels": 1} for n, v in verdicts.items()}})


FWD = "attn_fwd.gfx908.fp16.d64.M64N32.wpe{}.w4.s1.plv0"
DQ = "bwd_kernel_dq.gfx908.bf16.d32.M32N32.wpe{}.w4.s1"


def test_parse_and_keys_round_trip():
    p = KernelConfig.parse(FWD.format(2))
    assert p == KernelConfig("attn_fwd", "gfx908", "fp16", 64, 64, 32, 2, 4, 1, False)
    assert p.limit_key == "attn_fwd.gfx908.fp16.d64.M64N32.w4.s1.plv0"
    assert p.with_waves(3).name == FWD.format(3)
    dq = KernelConfig("bwd_kernel_dq", "gfx908", "bf16", 32, 32, 32, 0, 4, 1, None)
    assert dq.limit_key == "bwd_kernel_dq.gfx908.bf16.d32.M32N32.w4.s1"
    assert dq.with_waves(2).name == DQ.format(2)
    pre = KernelConfig.parse("bwd_preprocess.gfx908.fp16.d64.M128.wpe2.w4.s1")
    assert not pre.tunable and pre.block_n is None  # not a row family


def test_limits_table_is_largest_clean_and_sorted():
    rep = _report({FWD.format(1): "ok", FWD.format(2): "low occupancy", FWD.format(3): "spills",
                   FWD.format(4): "spills", DQ.format(1): "spills", DQ.format(2): "failed",
                   "attn_fwd.gfx908.fp32.d64.M64N32.wpe1.w4.s1.plv0": "ok",      # dtype not asked for
                   "bwd_preprocess.gfx908.fp16.d64.M128.wpe2.w4.s1": "ok"})      # not a row family
    lim = waves_per_eu_limits(rep, "gfx908", {"fp16", "bf16"}, {32, 64})
    assert lim["triton"] == "3.5.1" and lim["release"] == "0.11b"
    assert lim["source"] == "tuning/gfx908/compile_report.json"
    assert list(lim["configs"]) == sorted(lim["configs"]) == [
        "attn_fwd.gfx908.fp16.d64.M64N32.w4.s1.plv0", "bwd_kernel_dq.gfx908.bf16.d32.M32N32.w4.s1"]
    assert lim["configs"]["attn_fwd.gfx908.fp16.d64.M64N32.w4.s1.plv0"] == {
        "max_waves_per_eu": 2, "clean": [1, 2], "spills": [3, 4], "failed": []}
    assert lim["configs"]["bwd_kernel_dq.gfx908.bf16.d32.M32N32.w4.s1"] == {
        "max_waves_per_eu": None, "clean": [], "spills": [1], "failed": [2]}
    assert waves_per_eu_limits(rep, "gfx90a") is None      # a report for another arch
    assert waves_per_eu_limits(None, "gfx908") is None


@pytest.mark.parametrize("verdicts, asked, expected", [
    ({1: "ok", 2: "ok", 3: "spills"}, 4, (2, "clean")),        # capped to the largest clean
    ({1: "ok", 2: "ok", 3: "spills"}, 2, (2, "clean")),        # already clean: untouched
    ({1: "ok", 2: "ok", 3: "spills"}, 1, (1, "clean")),        # never raised
    ({1: "ok", 2: "spills", 3: "ok"}, 2, (1, "clean")),        # non-monotonic: step below a spill
    ({1: "ok", 2: "spills", 3: "ok"}, 4, (3, "clean")),
    ({1: "ok", 3: "ok"}, 2, (2, "unmeasured")),                # under the limit, not measured: kept
    ({1: "spills", 2: "spills"}, 2, (2, "unclean")),           # spills everywhere: kept, reported
    ({1: "failed"}, 1, (1, "unclean")),
    ({1: "ok", 2: "spills"}, 0, (0, "clean")),                 # 0 = no hint: never changed, judged as 1
    ({1: "spills"}, 0, (0, "unclean")),
    ({2: "ok"}, 0, (0, "unmeasured")),
    ({0: "ok", 2: "spills"}, 0, (0, "clean")),
    ({0: "ok", 2: "spills"}, 2, (0, "clean")),                 # only "no hint" compiles cleanly
])
def test_cap_waves_per_eu(verdicts, asked, expected):
    lim = waves_per_eu_limits(_report({FWD.format(w): v for w, v in verdicts.items()}), "gfx908")
    key = "attn_fwd.gfx908.fp16.d64.M64N32.w4.s1.plv0"
    assert cap_waves_per_eu(lim, key, asked) == expected


def test_cap_without_report_or_entry():
    lim = waves_per_eu_limits(_report({FWD.format(1): "ok"}), "gfx908")
    assert cap_waves_per_eu(None, "x", 3) == (3, "no-report")
    assert cap_waves_per_eu(lim, "attn_fwd.gfx908.bf16.d64.M64N32.w4.s1.plv0", 3) == (3, "unmeasured")


# ---------------------------------------------------------------- apply: the seeded rows --

ROWS = {
    "gpus": ["gfx908_mod0"], "donor_gpu": "gfx90a_mod0", "head_dims": [32, 64], "dtypes": ["bf16", "fp16", "fp32"],
    "waves_per_eu_caps": [{"block_m": 128, "block_n": 64, "max_waves_per_eu": 1, "family": None, "dtype": None,
                           "head_dim": None, "reason": "spills"}],
    "default_max_waves_per_eu": None, "measured": [],
}


def _fake_report() -> CompileReport:
    """Every donor config of the fake tree (tiles 128x64 / 64x64 / 64x32 at wpe 2, w4 s1, plv0):
    64x64 spills at 2 but not at 1, 64x32 spills at both (fp16 d64 only: the rest is unknown),
    128x64 is clean at 1 (the spec caps it there)."""
    v = {}
    for dt in ("fp16", "bf16", "fp32"):
        for hd in (32, 64):
            for fam, plv in (("attn_fwd", ".plv0"), ("bwd_kernel_dk_dv", "")):
                base = f"{fam}.gfx908.{dt}.d{hd}"
                v[f"{base}.M128N64.wpe1.w4.s1{plv}"] = "ok"
                v[f"{base}.M64N64.wpe1.w4.s1{plv}"] = "ok"
                v[f"{base}.M64N64.wpe2.w4.s1{plv}"] = "spills"
    v["attn_fwd.gfx908.fp16.d64.M64N32.wpe1.w4.s1.plv0"] = "spills"
    v["attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"] = "spills"
    return _report(v)


def _build(tree: Path, rows: dict, kernel: str):
    a = detect(tree)
    ls = lambda rel: sorted(x.name for x in (tree / rel).iterdir()) if (tree / rel).is_dir() else []  # noqa: E731
    rows = RowsPlan.from_json(rows, "gfx908")
    targets = {t["path"]: t for t in db_targets(a, rows, None, ls)}
    t = targets[a.shard_path("gfx908", kernel)] if a.tuning_db_layout == "sharded" else targets[a.tuning_db]
    return build_db(t, lambda rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None, rows)


def _configs(content: bytes, table: str, tmp_path: Path) -> dict[tuple, set]:
    _, payload = read_archive(content, "x")
    p = tmp_path / "q.sqlite3"
    p.write_bytes(payload)
    conn = sqlite3.connect(p)
    try:
        out: dict[tuple, set] = {}
        for dt, hd, bm, bn, w in conn.execute(
                f'SELECT "inputs$Q_dtype", "inputs$BLOCK_DMODEL", "tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N", '
                f'"compiler_options$waves_per_eu" FROM "{table}" WHERE gpu = \'gfx908_mod0\''):
            out.setdefault((bm, bn), set()).add(w)
        return out
    finally:
        conn.close()
        p.unlink()


@pytest.mark.parametrize("version", [(0, 12, 0), (0, 11, 0)])
def test_apply_caps_seeded_rows_to_the_report(tmp_path, version):
    tree = make_fake_tree(tmp_path / "t", version)
    rows = dict(ROWS, waves_per_eu_limits=waves_per_eu_limits(_fake_report(), "gfx908", None, None))
    out = _build(tree, rows, "attn_fwd")
    st = out.tables["FLASH$attn_fwd"]
    waves = _configs(out.content, "FLASH$attn_fwd", tmp_path)
    assert waves[(128, 64)] == {1}            # the spec's cap (clean at 1)
    assert waves[(64, 64)] == {1}             # the report's limit: wpe2 spills
    assert waves[(64, 32)] == {2}             # spills at every wpe (or unknown): kept
    d = st.as_dict()
    assert d["compile_unclean"] == ["attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"]
    assert "attn_fwd.gfx908.bf16.d32.M64N32.wpe2.w4.s1.plv0" in d["compile_unmeasured"]
    assert all(".M64N32." in n for n in d["compile_unmeasured"])
    assert d["compile_unmeasured"] == sorted(d["compile_unmeasured"])
    assert d["compile_clean_rows"] == st.rows_written - _count(out.content, "FLASH$attn_fwd", 64, 32, tmp_path)
    # rows lowered by the report = the 64x64 rows (the 128x64 ones the spec had capped already)
    n64 = _count(out.content, "FLASH$attn_fwd", 64, 64, tmp_path)
    assert st.compile_capped == n64 > 0


def _count(content: bytes, table: str, bm: int, bn: int, tmp_path: Path) -> int:
    _, payload = read_archive(content, "x")
    p = tmp_path / "c.sqlite3"
    p.write_bytes(payload)
    conn = sqlite3.connect(p)
    try:
        return conn.execute(f'SELECT COUNT(*) FROM "{table}" WHERE gpu = \'gfx908_mod0\' AND '
                            f'"tuned_kernel$BLOCK_M" = ? AND "tuned_kernel$BLOCK_N" = ?', (bm, bn)).fetchone()[0]
    finally:
        conn.close()
        p.unlink()


def test_measured_rows_are_audited_not_capped(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    rows = dict(ROWS, waves_per_eu_limits=waves_per_eu_limits(_fake_report(), "gfx908", None, None), measured=[{
        "gpu": "gfx908_mod0", "family": "attn_fwd", "dtype": "fp16", "head_dim": 64, "causal": 0, "dropout": 0,
        "bias": 0, "seqlen_q": 128, "seqlen_k": 128, "block_m": 64, "block_n": 64, "waves_per_eu": 2,
        "num_warps": 4, "num_stages": 1, "pre_load_v": "False"}])
    st = _build(tree, rows, "attn_fwd").tables["FLASH$attn_fwd"]
    assert st.measured_overrides == 1
    assert "attn_fwd.gfx908.fp16.d64.M64N64.wpe2.w4.s1.plv0" in st.compile_unclean


def test_without_a_report_rows_and_stats_are_unchanged(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    a = _build(tree, dict(ROWS), "attn_fwd")
    b = _build(tree, dict(ROWS, waves_per_eu_limits=None), "attn_fwd")
    assert a.content == b.content
    assert set(a.tables["FLASH$attn_fwd"].as_dict()) == {
        "donor_rows", "rows_written", "waves_capped", "measured_overrides", "measured_unmatched"}


def test_tables_without_config_columns_are_left_alone(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 11, 0))
    rows = dict(ROWS, waves_per_eu_limits=waves_per_eu_limits(_fake_report(), "gfx908", None, None))
    a = detect(tree)
    ls = lambda rel: []  # noqa: E731
    rows = RowsPlan.from_json(rows, "gfx908")
    op = next(t for t in db_targets(a, rows, None, ls) if t["path"] == a.op_db)
    out = build_db(op, lambda rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None, rows)
    assert all("compile_unclean" not in st.as_dict() for st in out.tables.values())


# -------------------------------------------------------------------------------- render --

def test_render_rows_carry_the_committed_report():
    loaded = load_spec(None)
    ov = render_overlay(loaded)
    lim = load_limits(loaded.spec)
    assert ov.rows.waves_per_eu_limits == lim
    committed = json.loads((REPO / "aotriton_overlay" / "rows" / f"{loaded.spec.arch}.json").read_text())
    assert committed["waves_per_eu_limits"] == lim
    report = REPO / "tuning" / loaded.spec.arch / "compile_report.json"
    if report.is_file():
        rep = json.loads(report.read_text())
        assert lim["triton"] == rep["triton"] and lim["configs"]
        assert list(lim["configs"]) == sorted(lim["configs"])
        verdict = {(c.limit_key, c.waves_per_eu): e["verdict"]
                   for c, e in ((KernelConfig.try_parse(n), e) for n, e in rep["configs"].items()) if c}
        for key, e in lim["configs"].items():
            assert e["max_waves_per_eu"] == (max(e["clean"]) if e["clean"] else None)
            for w in e["clean"]:
                assert verdict[(key, w)] not in ("spills", "failed")
    else:
        assert lim is None


def test_render_rows_default_has_no_limits():
    loaded = load_spec(None)
    assert plan_overlay(loaded, "v3python", OverlayInputs()).rows.to_json()["waves_per_eu_limits"] is None
    assert RowsPlan.build(loaded.spec, [], None).waves_per_eu_limits is None


# ------------------------------------------------- merging reports and pruning the spec --

def _result(config: str, wpe: int = 2, occ: int = 2, vgpr_spills: int = 0, code_bytes: int = 0):
    from codegen.compile.report import KernelResult
    from codegen.compile.resources import Resources

    family, _, dtype, d = config.split(".")[:4]
    fields = {name: 0 for name in Resources.model_fields}
    fields.update(vgprs=64, sgprs=64, mfma=8, vgpr_spills=vgpr_spills, code_bytes=code_bytes)
    return KernelResult(id=f"{config}#{code_bytes}", config=config, family=family, dtype=dtype, head_dim=int(d[1:]),
                        waves_per_eu=wpe, num_warps=4, num_stages=1, status="ok",
                        resources=Resources(**fields), occupancy=occ)


def test_merge_never_turns_a_spilling_config_clean():
    from codegen.compile.prune import compile_report

    name = "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"
    first = compile_report([_result(name, vgpr_spills=9)], arch="gfx908", gpu="gfx908_mod0", release="0.11b",
                           triton="3.5.1")
    merged = compile_report([_result(name, code_bytes=1), _result(FWD.format(1), wpe=1, occ=1)], arch="gfx908",
                            gpu="gfx908_mod0", release="0.11b", triton="3.5.1", previous=first)
    assert merged.configs[name] == first.configs[name]          # the spill evidence stays
    assert merged.configs[FWD.format(1)].verdict == "ok"
    fixed = compile_report([_result(name, vgpr_spills=1)], arch="gfx908", gpu="gfx908_mod0", release="0.11b",
                           triton="3.5.1", previous=compile_report([_result(name)], arch="gfx908", gpu="gfx908_mod0",
                                                                   release="0.11b", triton="3.5.1"))
    assert fixed.configs[name].verdict == "spills"               # a worse new result replaces


def rules_from_report(loaded, report: dict) -> dict[str, list[dict]]:
    """family -> the exclude rules `precompile --prune-to` would write for every config of the
    spec's tuning space that a committed compile report marks failed or spilling."""
    from codegen.models import expand_space
    from codegen.compile.prune import PRUNED, _reason_text, _rule, _where

    configs = report.get("configs", {})
    where = _where(report.get("arch"), report.get("release"))
    rules: dict[str, list[dict]] = {}
    for family, cfgs in expand_space(loaded.spec).items():
        for cfg in sorted(cfgs, key=lambda c: c.name):
            entry = configs.get(cfg.name)
            if not entry or entry.get("verdict") not in PRUNED:
                continue
            reason = _reason_text(entry["verdict"], entry.get("error"), entry.get("vgpr_spills"),
                                  report.get("triton", "?"), where)
            rules.setdefault(family, []).append(_rule(cfg, reason))
    return rules


def test_prune_rules_from_report_cite_the_cross_compile(tmp_path):
    from codegen.models import expand_space
    from codegen.compile.prune import prune_spec

    loaded = load_spec(None)
    space = {c.name: c for cfgs in expand_space(loaded.spec).values() for c in cfgs}
    victim = next(n for n in sorted(space) if n.startswith("bwd_kernel_dq.") and ".wpe1." in n)
    rep = _report({victim: "spills", "attn_fwd.gfx908.fp16.d64.M16N16.wpe9.w4.s1.plv0": "spills"}).model_dump()
    rep["configs"][victim]["vgpr_spills"] = 7
    rules = rules_from_report(loaded, rep)
    assert list(rules) == ["bwd_kernel_dq"] and len(rules["bwd_kernel_dq"]) == 1  # outside the space: ignored
    reason = rules["bwd_kernel_dq"][0]["reason"]
    assert reason == "precompile: spills 7 VGPRs with Triton 3.5.1 (CPU cross-compile for gfx908, AOTriton 0.11b)"
    out = tmp_path / "pruned.yaml"
    assert prune_spec(loaded, rules, out) == 1
    pruned = {c.name for cfgs in expand_space(load_spec(out).spec).values() for c in cfgs}
    assert pruned == set(space) - {victim}


def test_committed_spec_excludes_every_failing_or_spilling_space_config():
    """rules/mi100.yaml already holds an exclude rule for every config of its tuning space that
    the committed compile report marks failed or spilling."""
    report = REPO / "tuning" / "gfx908" / "compile_report.json"
    if not report.is_file():
        pytest.skip("no committed compile report")
    assert rules_from_report(load_spec(None), json.loads(report.read_text())) == {}


# ------------------------------------------------------------------- precompile --descend --

def _kentry(config: str, fid: str = "F0"):
    from codegen.plan.kernel_list import KernelEntry

    p = dataclasses.asdict(KernelConfig.parse(config))
    kid = (f"{p['family']}-Sig-F__{fid}__P__0_2_{p['block_m']}_{p['block_n']}_False__CO__wave{p['waves_per_eu']}"
           f"_warp{p['num_warps']}_stg{p['num_stages']}--Arch_gfx908")
    return KernelEntry(id=kid, config=config, hsaco=f"flash/{kid}.hsaco", source="tritonsrc/flash.py",
                       kernel_name=p["family"], signature="sig", perf=f"0_2_{p['block_m']}_{p['block_n']}_False",
                       functional=fid)


def _kresult(e, vgprs: int = 64, vgpr_spills: int = 0):
    from codegen.compile.report import KernelResult
    from codegen.compile.resources import Resources

    fields = {name: 0 for name in Resources.model_fields}
    fields.update(vgprs=vgprs, sgprs=64, mfma=8, vgpr_spills=vgpr_spills)
    c = e.config
    return KernelResult(id=e.id, config=c.name, family=c.family, dtype=c.dtype, head_dim=c.head_dim,
                        waves_per_eu=c.waves_per_eu, num_warps=c.num_warps, num_stages=c.num_stages, status="ok",
                        resources=Resources(**fields), occupancy=1)


def test_descend_budget_and_renaming():
    from codegen.compile.descend import vgpr_budget

    hw = load_spec(None).spec.hardware
    assert [vgpr_budget(hw, w) for w in (1, 2, 3, 4)] == [256, 128, 84, 64]
    e = _kentry(FWD.format(3)).with_waves(1, SIG)
    assert e.config.waves_per_eu == 1 and e.config.name == FWD.format(1)
    assert "__CO__wave1_warp4_stg1" in e.id and e.hsaco == f"flash/{e.id}.hsaco"
    # 0.13b+ name an image file by the digest of its name: a new waves_per_eu is a new digest
    entry = ";;#F;Q='*fp16:16';BLOCK_DMODEL=64;;#P;BLOCK_M=64;BLOCK_N=32;;#CO;waves_per_eu=3;num_warps=4;num_stages=1;;arch=gfx908"
    name = ENTRY.parse(entry, "attn_fwd")
    old = _kentry(FWD.format(3)).model_copy(update={"id": name.file_stem, "functional": name.functional,
                                                    "perf": name.perf_text})
    new = old.with_waves(1, ENTRY)
    want = "attn_fwd-" + hashlib.sha256(entry.replace("waves_per_eu=3", "waves_per_eu=1").encode()).hexdigest()
    assert new.id == want and new.hsaco == f"flash/{want}.hsaco" and new.config.waves_per_eu == 1
    assert old.model_copy(update={"perf": ""}).with_waves(1, ENTRY).id == old.id   # a name plan could not read


def test_descend_moves_every_kernel_of_a_spilling_config():
    from codegen.compile.descend import plan_round
    from codegen.compile.prune import compile_report

    hw = load_spec(None).spec.hardware
    spill = [_kentry(FWD.format(4), f"F{i}") for i in range(3)]       # one of three kernels spills
    clean = [_kentry(DQ.format(2))]
    entries = spill + clean
    results = [_kresult(spill[0], vgprs=64, vgpr_spills=30)] + [_kresult(e) for e in spill[1:] + clean]
    report = compile_report(results, arch="gfx908", gpu="gfx908_mod0", release="0.11b", triton="3.5.1")
    plan = plan_round(entries, results, hw, report, "gfx908", SIG)
    # 64 + 30 VGPRs need the budget of waves_per_eu 2 (128); every functional of the config moves
    assert plan.moves == {FWD.format(4): FWD.format(2)}
    assert sorted(e.functional for e in plan.entries) == ["F0", "F1", "F2"]
    assert {e.config.name for e in plan.entries} == {FWD.format(2)}
    # a clean lower variant the report already knows is the one apply caps to: measure that one
    known = compile_report([_kresult(_kentry(FWD.format(3), "F9"))], arch="gfx908", gpu="gfx908_mod0",
                           release="0.11b", triton="3.5.1", previous=report)
    assert plan_round(entries, results, hw, known, "gfx908", SIG).moves == {FWD.format(4): FWD.format(3)}
    # next round: the new variant still spills -> lower again; nothing is compiled twice
    results2 = results + [_kresult(e, vgprs=128, vgpr_spills=5 if e.functional == "F1" else 0) for e in plan.entries]
    entries2 = entries + plan.entries
    report2 = compile_report(results2, arch="gfx908", gpu="gfx908_mod0", release="0.11b", triton="3.5.1")
    plan2 = plan_round(entries2, results2, hw, report2, "gfx908", SIG)
    assert plan2.moves[FWD.format(2)] == FWD.format(1)
    assert {e.config.name for e in plan2.entries} == {FWD.format(1)} and len(plan2.entries) == 3
    # at waves_per_eu 1 there is nowhere to go
    last = [_kresult(e, vgpr_spills=1) for e in plan2.entries]
    assert plan_round(entries2 + plan2.entries, results2 + last, hw, None, "gfx908", SIG).entries == []


def test_descend_interrupted_keeps_complete_variants_only(monkeypatch):
    from rich.console import Console

    import codegen.compile.engine as engine
    from codegen.compile.precompile import DescendInterrupted, _descend
    from codegen.compile.report import RunInfo

    spec = load_spec(None).spec
    a = [_kentry(FWD.format(4), f"F{i}") for i in range(2)]                       # -> wpe2 (2 kernels)
    b = [_kentry("bwd_kernel_dq.gfx908.fp16.d64.M64N32.wpe3.w4.s1", "G0")]         # -> wpe2 (1 kernel)
    results = [_kresult(e, vgprs=64, vgpr_spills=20) for e in a] + [_kresult(b[0], vgprs=84, vgpr_spills=10)]

    def fake_compile(tree, entries, spec, *, on_progress, **kw):
        ordered = sorted(entries, key=lambda e: e.config.family != "bwd_kernel_dq")      # dq first, then one fwd
        for e in ordered[:2]:
            on_progress(_kresult(e))
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "compile_entries", fake_compile)
    info = RunInfo(gpu="gfx908_mod0", arch="gfx908", release="0.11b", triton="3.5.1", build="normal", planned=3,
                   sampled=3, sample=0, jobs=1, wall_s=1.0, compiled_now=3, from_cache=0)
    with pytest.raises(DescendInterrupted) as exc:
        _descend(Path("."), spec, a + b, results, info, "3.5.1", None, 1, 60.0, None, Console(quiet=True))
    kept = exc.value.results[len(results):]
    assert [r.config for r in kept] == ["bwd_kernel_dq.gfx908.fp16.d64.M64N32.wpe2.w4.s1"]  # fwd@2 half done: dropped


@pytest.mark.parametrize("version", [(0, 12, 0), (0, 11, 0)])
def test_tile_replacement_then_report_cap(tmp_path, version):
    """A donor tile that spills at every wpe is replaced by the spec's tile, which the report
    then caps like any other row; tables and dtypes not named keep their tiles."""
    tree = make_fake_tree(tmp_path / "t", version)
    rows = dict(ROWS, waves_per_eu_limits=waves_per_eu_limits(_fake_report(), "gfx908", None, None),
                tile_replacements=[{"family": "attn_fwd", "block_m": 64, "block_n": 32, "dtype": "fp16",
                                    "head_dim": 64, "to": [64, 64], "reason": "spills"}])
    out = _build(tree, rows, "attn_fwd")
    st = out.tables["FLASH$attn_fwd"]
    assert st.tiles_replaced > 0 and st.as_dict()["tiles_replaced"] == st.tiles_replaced
    d = st.as_dict()
    assert d["compile_unclean"] == []                      # the spilling fp16 d64 64x32 rows are gone
    waves = _configs(out.content, "FLASH$attn_fwd", tmp_path)
    assert waves[(64, 64)] == {1}                          # replaced rows capped by the report too
    assert (64, 32) in waves                               # other dtypes/head dims keep 64x32
    before = _count(_build(tree, dict(ROWS), "attn_fwd").content, "FLASH$attn_fwd", 64, 32, tmp_path)
    assert _count(out.content, "FLASH$attn_fwd", 64, 32, tmp_path) == before - st.tiles_replaced


def test_default_spec_replaces_the_tiles_that_spill_at_wpe1():
    """Each replacement's donor tile spills at waves_per_eu=1 in the committed compile report
    (fp16 or bf16), and every measured config of its target tile at waves_per_eu=1 is clean."""
    spec = load_spec(None).spec
    reps = spec.rows.tile_replacements
    assert reps
    report = json.loads((Path(__file__).resolve().parents[1] / "tuning/gfx908/compile_report.json").read_text())

    def at_wpe1(r, tile):
        return {name: c["verdict"] for name, c in report["configs"].items()
                if (p := KernelConfig.try_parse(name)) and p.family == r.family and p.head_dim == r.head_dim
                and (p.block_m, p.block_n) == tuple(tile) and p.waves_per_eu == 1 and p.dtype in ("fp16", "bf16")}

    for r in reps:
        source, target = at_wpe1(r, (r.block_m, r.block_n)), at_wpe1(r, r.to)
        assert "spills" in source.values(), (r, source)
        assert target and set(target.values()) == {"ok"}, (r, target)



def _warps(content: bytes, table: str, tmp_path: Path) -> list[int]:
    _, payload = read_archive(content, "x")
    p = tmp_path / "w.sqlite3"
    p.write_bytes(payload)
    conn = sqlite3.connect(p)
    try:
        return [w for (w,) in conn.execute(
            f'SELECT "compiler_options$num_warps" FROM "{table}" WHERE gpu = \'gfx908_mod0\'')]
    finally:
        conn.close()
        p.unlink()


@pytest.mark.parametrize("version", [(0, 12, 0), (0, 11, 0)])
def test_min_num_warps_raises_the_seeded_rows_of_its_families(tmp_path, version):
    """rows.min_num_warps: a family's seeded rows with fewer warps get the floor (counted as
    warps_raised), rows at or above it and families without a floor keep theirs; the compile
    report then judges the raised config (here: one it never measured)."""
    tree = make_fake_tree(tmp_path / "t", version)
    limits = waves_per_eu_limits(_fake_report(), "gfx908", None, None)
    plain = _build(tree, dict(ROWS, waves_per_eu_limits=limits), "attn_fwd")
    donor_warps = _warps(plain.content, "FLASH$attn_fwd", tmp_path)
    assert donor_warps and set(donor_warps) == {4}
    assert "warps_raised" not in plain.tables["FLASH$attn_fwd"].as_dict()

    raised = _build(tree, dict(ROWS, waves_per_eu_limits=limits, min_num_warps={"attn_fwd": 8}), "attn_fwd")
    st = raised.tables["FLASH$attn_fwd"]
    assert _warps(raised.content, "FLASH$attn_fwd", tmp_path) == [8] * len(donor_warps)
    assert st.warps_raised == st.donor_rows > 0 and st.as_dict()["warps_raised"] == st.warps_raised
    assert st.compile_unmeasured and all(".w8." in c for c in st.compile_unmeasured)

    same = _build(tree, dict(ROWS, min_num_warps={"attn_fwd": 4}), "attn_fwd")
    assert same.tables["FLASH$attn_fwd"].warps_raised == 0
    assert _warps(same.content, "FLASH$attn_fwd", tmp_path) == donor_warps
    other = _build(tree, dict(ROWS, min_num_warps={"bwd_kernel_dq": 8}), "attn_fwd")
    assert _warps(other.content, "FLASH$attn_fwd", tmp_path) == donor_warps


def test_min_num_warps_is_in_rows_json_and_the_spec_hash_only_when_set():
    """The committed overlay's rows/<arch>.json and spec hash of specs without the field stay as
    they were (render --check of the default spec); a spec that sets it carries it through."""
    mi100 = load_spec(None).spec
    assert "min_num_warps" not in mi100.model_dump(mode="json")["rows"]
    plan = RowsPlan.build(mi100, [], None)
    assert plan.min_num_warps == {} and "min_num_warps" not in plan.to_json()

    rdna2 = load_spec(Path(__file__).resolve().parents[1] / "rules/rdna2.yaml").spec
    floors = {"attn_fwd": 8, "bwd_kernel_dk_dv": 8, "bwd_kernel_dq": 8, "bwd_kernel_fuse": 8}
    assert rdna2.model_dump(mode="json")["rows"]["min_num_warps"] == floors
    plan = RowsPlan.build(rdna2, [], None)
    assert plan.to_json()["min_num_warps"] == floors
    assert RowsPlan.from_json(plan.to_json(), rdna2.arch) == plan
    assert plan.num_warps_for("bwd_kernel_dq", 2) == 8 and plan.num_warps_for("attn_fwd", 16) == 16


def test_split_backward_and_replacement_warps_only_when_set():
    """rows.split_backward and a tile replacement's min_num_warps: absent from the dumps (and the
    spec hash) of specs without them; carried through rows/<arch>.json by a spec that sets them."""
    mi100 = load_spec(None).spec
    dumped = mi100.model_dump(mode="json")["rows"]
    assert "split_backward" not in dumped
    assert all("min_num_warps" not in t for t in dumped["tile_replacements"])
    assert "split_backward" not in RowsPlan.build(mi100, [], None).to_json()

    rdna2 = load_spec(Path(__file__).resolve().parents[1] / "rules/rdna2.yaml").spec
    plan = RowsPlan.build(rdna2, [], None)
    assert RowsPlan.from_json(plan.to_json(), rdna2.arch) == plan
    assert [(r["dtype"], r["head_dim"]) for r in plan.to_json()["split_backward"]] == [("bf16", 64), ("fp32", 64)]
    assert plan.splits_backward("bf16", 64) and plan.splits_backward("fp32", 64)
    assert not plan.splits_backward("fp16", 64) and not plan.splits_backward("bf16", 32)
    # a replacement without a tile matches every donor tile of its family/dtype/head dim and raises warps
    from codegen.models.rows import RowTile

    rep = plan.replacement_for(RowTile("bwd_kernel_dq", "bf16", 64, 64, 64))
    assert rep is not None and rep.min_num_warps == 16 and tuple(rep.to) == (16, 16)
    assert plan.num_warps_for("bwd_kernel_dq", 4, rep) == 16
    other = plan.replacement_for(RowTile("bwd_kernel_dq", "fp16", 64, 64, 64))
    assert other.min_num_warps is None and plan.num_warps_for("bwd_kernel_dq", 4, other) == 8


@pytest.mark.parametrize("edit, where, words", [
    ({"tile_replacements": [{"family": "bwd_kernel_dq", "dtype": "bf16", "to": [16, 16], "min_num_warps": 2,
                             "reason": "r"}]}, "tile_replacements.0.min_num_warps", "not one of tuning.bwd_kernel_dq"),
    ({"split_backward": [{"dtype": "fp32", "reason": "r"}]}, "split_backward.0.dtype", "not one of the spec's dtypes"),
    ({"split_backward": [{"head_dim": 128, "reason": "r"}]}, "split_backward.0.head_dim", "not one of the spec's head"),
])
def test_new_rows_fields_are_checked_against_the_spec(edit, where, words):
    from codegen.models.checks import check_target

    spec = load_spec(None).spec
    data = spec.model_dump(mode="json")
    data["rows"].update(edit)
    if "split_backward" in edit:
        data["dtypes"] = ["fp16", "bf16"]
    bad = type(spec).model_validate(data)
    errors = [d for d in check_target(bad) if d.severity == "error"]
    assert any(".".join(map(str, d.path)).endswith(where) and words in d.message for d in errors), errors
