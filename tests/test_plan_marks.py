"""`plan` marks the configs outside the spec's tuning space (issue 39 item 5, must-hold 4): the
parts of each name outside it, computed from the spec (`codegen.models.space.outside_space`), and
whether the row was seeded from the donor GPU or measured (the spec's winners). On real trees:
tests/test_plan_trees.py."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from codegen.cli.plan import config_table, legend
from codegen.formats.spec import load_spec
from codegen.models.space import KernelConfig, expand_family, expand_space, outside_space
from codegen.plan.summary import summarize

SPEC = load_spec(None).spec


def test_the_space_is_inside_and_each_part_outside_is_named():
    space = expand_space(SPEC)
    assert all(outside_space(SPEC, c) == [] for cfgs in space.values() for c in cfgs)
    cfg = space["attn_fwd"][0]
    fam = SPEC.family_space("attn_fwd")
    wpe = max(fam.waves_per_eu) + 1
    warps = next(w for w in (1, 2, 4, 8, 16) if w not in fam.num_warps)
    assert outside_space(SPEC, cfg.vary(waves_per_eu=wpe, num_warps=warps)) == [f"wpe{wpe}", f"w{warps}"]
    assert outside_space(SPEC, cfg.vary(block_m=16, block_n=16, head_dim=48)) == ["d48", "M16N16"]
    assert outside_space(SPEC, cfg.vary(pre_load_v=not cfg.pre_load_v)) == [f"plv{int(not cfg.pre_load_v)}"]


def test_a_config_only_an_exclude_rule_removes_is_marked_excluded():
    for family in expand_space(SPEC):   # the default spec excludes configs in every family
        fam = SPEC.family_space(family)
        assert fam.exclude
        kept = set(expand_family(SPEC, family, SPEC.dtypes[0], SPEC.head_dims[0]))
        every = expand_family(SPEC, family, SPEC.dtypes[0], SPEC.head_dims[0], fam.model_copy(update={"exclude": []}))
        for cfg in every:
            assert outside_space(SPEC, cfg) == ([] if cfg in kept else ["excluded"]), cfg.name


def _summary(names, measured=frozenset(), spec=SPEC):
    entries = [SimpleNamespace(config=KernelConfig.parse(n)) for n in names]
    return summarize(entries, ["gfx908_mod0"], "0.11b", "normal", spec, measured)


def test_summarize_tells_seeded_from_measured():
    inside = expand_space(SPEC)["attn_fwd"][0]
    seeded = inside.vary(num_warps=2).name
    measured = inside.vary(waves_per_eu=max(SPEC.family_space("attn_fwd").waves_per_eu) + 1).name
    pre = "bwd_preprocess.gfx908.fp16.d64.M128.wpe2.w4.s1"   # not a family of the tuning space
    s = _summary([inside.name, seeded, measured, pre], frozenset({measured, inside.name}))
    assert set(s.outside_space) == {seeded, measured} and s.outside_space[seeded] == ["w2"]
    assert s.measured_outside == [measured] and s.seeded_from == SPEC.rows.donor_gpu
    assert _summary([seeded], spec=None).outside_space == {}    # no spec: nothing to compare with


def _render(summary, limit=-1) -> str:
    con = Console(width=200, record=True, file=open("/dev/null", "w"))
    con.print(config_table(summary, limit))
    for line in legend(summary):
        con.print(line, markup=False)
    return con.export_text()


def test_the_table_marks_and_explains_itself():
    inside = expand_space(SPEC)["attn_fwd"][0]
    seeded, measured = inside.vary(num_warps=2).name, inside.vary(num_stages=4).name
    out = _render(_summary([inside.name, seeded, measured], frozenset({measured})))
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert f"{seeded} *" in rows[seeded] and "w2" in rows[seeded]
    assert f"{measured} †" in rows[measured] and "s4" in rows[measured]
    assert "*" not in rows[inside.name] and "†" not in rows[inside.name]
    assert f"* 1 of 3 configs: from the tuning rows seeded from {SPEC.rows.donor_gpu}" in out
    assert "† 1 configs: measured winners" in out
    plain = _render(_summary([inside.name]))
    assert "outside" not in plain and "*" not in plain and legend(_summary([inside.name])) == []
