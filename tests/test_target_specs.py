"""Every target spec under rules/ loads with the current loader and passes the cross-field checks
(warnings allowed, no errors), and the set of shipped targets is the one the docs describe."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.models.checks import check_target
from codegen.formats.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "rules"

# The targets the repository ships a spec for: arch, warp size, AOTriton GPU name.
EXPECTED = {
    "mi100.yaml": ("gfx908", 64, "gfx908_mod0"),
    "mi50.yaml": ("gfx906", 64, "gfx906_mod0"),
    "rdna2.yaml": ("gfx1030", 32, "gfx1030_mod0"),
    "examples/smoke.yaml": ("gfx908", 64, "gfx908_mod0"),
    "examples/smoke-mi50.yaml": ("gfx906", 64, "gfx906_mod0"),
    "examples/smoke-rdna2.yaml": ("gfx1030", 32, "gfx1030_mod0"),
}


def _specs() -> list[str]:
    return sorted(str(p.relative_to(RULES)) for p in RULES.rglob("*.yaml"))


def test_the_expected_specs_exist():
    found = _specs()
    assert len(found) >= 3
    assert sorted(EXPECTED) == found


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_spec_loads_without_errors(rel):
    loaded = load_spec(RULES / rel)
    spec = loaded.spec
    arch, warp, gpu = EXPECTED[rel]
    assert (spec.arch, spec.warp_size, spec.primary_gpu) == (arch, warp, gpu)
    errors = [d for d in check_target(spec) if d.severity == "error"]
    assert errors == []


@pytest.mark.parametrize("rel", ["mi50.yaml", "rdna2.yaml"])
def test_targets_without_matrix_cores(rel):
    spec = load_spec(RULES / rel).spec
    hw = spec.hardware
    # neither gfx906 nor gfx1030 has MFMA/WMMA or an AGPR file
    assert hw.matrix_core_dtypes == []
    assert hw.agprs_per_lane == 0
    assert not hw.unified_register_file
    assert spec.head_dims == [32, 64]
    assert spec.dtypes == ["fp16", "bf16", "fp32"]
    # every tile of the space stays at or below 32x32: measured spill-free region without matrix cores
    for family in ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse"):
        for m, n in spec.family_space(family).block_sizes:
            assert m * n <= 32 * 32, (family, m, n)
    # the donor must be an arch whose tuned rows ship in every supported release
    assert spec.rows.donor_gpu in ("gfx90a_mod0", "gfx1100_mod0")


@pytest.mark.parametrize("smoke, full", [("examples/smoke-mi50.yaml", "mi50.yaml"),
                                         ("examples/smoke-rdna2.yaml", "rdna2.yaml")])
def test_smoke_specs_keep_their_targets_traits(smoke, full):
    """A smoke spec is its target cut down: the same arch, hardware, toolchain, donor and warp floors,
    and only tiles and warps of the full spec's space."""
    s, f = load_spec(RULES / smoke).spec, load_spec(RULES / full).spec
    assert (s.arch, s.gpus, s.warp_size, s.production_line) == (f.arch, f.gpus, f.warp_size, f.production_line)
    assert s.hardware == f.hardware
    assert s.toolchain == f.toolchain
    assert (s.rows.donor_gpu, s.rows.min_num_warps, s.registration) == (f.rows.donor_gpu, f.rows.min_num_warps,
                                                                         f.registration)
    for family in ("attn_fwd", "bwd_kernel_dk_dv", "bwd_kernel_dq", "bwd_kernel_fuse"):
        small, big = s.family_space(family), f.family_space(family)
        assert set(map(tuple, small.block_sizes)) <= set(map(tuple, big.block_sizes)), family
        assert set(small.num_warps) <= set(big.num_warps), family
