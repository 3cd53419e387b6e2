"""tune's planning (CPU): the grid upstream's database is keyed by, restricted to the spec and
the filters; candidate configs by name; configs the NVIDIA proxy cannot tell apart."""

from __future__ import annotations

import dataclasses

import pytest

from codegen.models import FAMILIES, expand_family
from codegen.formats.spec import load_spec
from codegen.gpu.tune.grid import (
    SEQLEN_BINS,
    GridEntry,
    GridFilter,
    aot_default_config,
    build_grid,
    group_effective,
    plan_tuning,
    validate_filter,
)


@pytest.fixture(scope="module")
def spec():
    return load_spec(None).spec


def test_full_grid_matches_upstream_keys(spec):
    grid = build_grid(spec)
    # per family, dtype, head dim: causal x dropout x bias minus causal+bias = 6 combos, 10x10 bins
    assert len(grid) == len(FAMILIES) * len(spec.dtypes) * len(spec.head_dims) * 6 * 100
    assert grid == sorted(grid) and len({e.name for e in grid}) == len(grid)
    assert not [e for e in grid if e.causal and e.bias]
    assert {e.seqlen_q for e in grid} == set(SEQLEN_BINS)


def test_filters_restrict_the_grid(spec):
    flt = GridFilter(families=("attn_fwd",), dtypes=("fp16",), head_dims=(64,),
                     seqlens=(4096, 1024), square_only=True, causal=True, dropout=False)
    grid = build_grid(spec, flt)
    assert [e.name for e in grid] == [
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024",
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq4096.sk4096",
    ]


def test_plan_measures_every_entry_and_lists_spec_candidates(spec):
    flt = GridFilter(families=("bwd_kernel_dq",), dtypes=("bf16",), head_dims=(32,), seqlens=(128,))
    plan = plan_tuning(spec, flt)
    # dropout and bias entries are measured too: no causal+bias rows upstream, so 6 combinations
    assert {(e.causal, e.dropout, e.bias) for e in plan.entries} == {
        (False, False, False), (False, False, True), (False, True, False), (False, True, True),
        (True, False, False), (True, True, False)}
    assert plan.configs_for(plan.entries[0]) == expand_family(spec, "bwd_kernel_dq", "bf16", 32)
    doc = plan.to_json()
    assert doc["counts"] == {"entries": 6, "measurements": 6 * len(plan.configs_for(plan.entries[0]))}
    assert doc["entries"][0]["candidates"][0].startswith("bwd_kernel_dq.gfx908.bf16.d32.M")


def test_the_whole_default_grid_is_measurable(spec):
    plan = plan_tuning(spec)
    assert len(plan.entries) == 14_400
    assert plan.total_measurements == sum(len(plan.configs_for(e)) for e in build_grid(spec))


def test_validate_filter_reports_values_outside_the_spec(spec):
    errs = validate_filter(spec, GridFilter(families=("attn_bwd",), head_dims=(128,), seqlens=(100,)))
    assert len(errs) == 3
    assert "family attn_bwd" in errs[0] and "head dim 128" in errs[1] and "seqlen 100" in errs[2]
    assert validate_filter(spec, GridFilter(dtypes=("fp16",), seqlens=(16, 8192))) == []


def test_effective_configs_drop_waves_per_eu_on_nvidia(spec):
    cfgs = expand_family(spec, "attn_fwd", "fp16", 64)
    cuda = group_effective(cfgs, "cuda")
    hip = group_effective(cfgs, "hip")
    assert sum(len(g) for g in cuda) == len(cfgs) == len(hip)
    assert all(len(g) == 1 for g in hip)
    assert len(cuda) < len(cfgs)
    for g in cuda:  # representative = lowest waves_per_eu (spill-safe on gfx908)
        assert g[0].waves_per_eu == min(c.waves_per_eu for c in g)
        assert len({(c.block_m, c.block_n, c.num_warps, c.num_stages) for c in g}) == 1


def test_entry_json_and_default_config(spec):
    e = GridEntry("attn_fwd", "gfx908", "fp16", 64, True, False, False, 1024, 2048)
    assert e.to_json() == {"name": "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk2048", "family": "attn_fwd",
                           "arch": "gfx908", "dtype": "fp16", "head_dim": 64, "causal": True, "dropout": False,
                           "bias": False, "seqlen_q": 1024, "seqlen_k": 2048}
    assert list(e.to_json())[1:] == [f.name for f in dataclasses.fields(GridEntry)]   # the key after family, arch
    assert aot_default_config(spec, "attn_fwd", "fp16", 64).name == "attn_fwd.gfx908.fp16.d64.M16N16.wpe2.w4.s1.plv0"
    assert aot_default_config(spec, "bwd_kernel_dq", "fp16", 64).name == "bwd_kernel_dq.gfx908.fp16.d64.M16N16.wpe2.w4.s1"
