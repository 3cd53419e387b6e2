"""bundle check's coverage (codegen.ship.coverage, issue 30 item 5), without a compiler: the cases
made from the spec's axes, the package names read from a library's bytes, and the two claims
over a dispatch report (the packages named are a claim of the bundle's verdict: codegen.ship.verdict). On a stand-in library through the stub runtime:
tests/test_bundle_dispatch.py; on a real bundle: tests/test_bundle_real.py (slow)."""

from __future__ import annotations

from itertools import product
from pathlib import Path

from codegen.formats.aks2 import container_kernel, container_name, library_references, split_container
from codegen.formats.spec import load_spec
from codegen.models.functional import Functional
from codegen.models.reach import LeftOut
from codegen.ship.coverage import coverage, cover_packages, declared
from codegen.ship.dispatch import CaseResult, DispatchReport, check_cases, coverage_cases, dispatch_cases, padded_head

REPO = Path(__file__).resolve().parents[1]
SMOKE = load_spec(REPO / "rules" / "examples" / "smoke.yaml").spec
DEFAULT = load_spec(REPO / "rules" / "mi100.yaml").spec
PACK = "amd-gfx908"


def _functionals(spec, dtypes) -> set[tuple]:
    out = set()
    for dtype, hd, (causal, bias, dropout), padded in product(dtypes, spec.head_dims, [(False, False, False), (False, False, True),
                                                               (False, True, False), (False, True, True),
                                                               (True, False, False), (True, False, True)], (False, True)):
        out.add((Functional(dtype, hd, causal, dropout, bias, 0, 0), padded))
    return out


def test_the_cases_dispatch_every_functional_the_spec_makes():
    """Every (dtype, head dim, causal, bias, dropout, padded head) at least once: bf16 too for the
    fp16-only smoke spec (upstream builds it whatever the spec says), fp32 only where declared;
    validate's matrix is kept as it was (the tuning-row check reads it by name)."""
    for spec, dtypes in ((SMOKE, ("fp16", "bf16")), (DEFAULT, ("fp16", "bf16", "fp32"))):
        cases = check_cases(spec)
        assert {c.package for c in cases} == _functionals(spec, dtypes)
        assert cases[:len(dispatch_cases(spec))] == dispatch_cases(spec)
        assert len({c.name for c in cases}) == len(cases)
        assert not {c.package for c in coverage_cases(spec)} & {c.package for c in dispatch_cases(spec)}
    padded = [c for c in check_cases(SMOKE) if c.pads_to]
    assert padded and {(c.head_dim, c.pads_to) for c in padded} == {(56, 64)}
    assert {c.dtype for c in check_cases(SMOKE)} == {"fp16", "bf16"}
    assert ("dtype", "bf16") in declared(SMOKE) and ("variant", "padded head") in declared(SMOKE)


def test_a_padded_head_dim_lies_between_the_declared_ones():
    assert padded_head(64, [32, 64]) == 56 and padded_head(32, [32, 64]) == 24
    assert padded_head(64, [60, 64]) is None and padded_head(8, [8]) is None


def _lib(*strings: str) -> bytes:
    """A library's bytes as its .rodata keeps string literals: NUL-ended, among other bytes."""
    return b"\x7fELF junk\0" + b"".join(s.encode() + b"\0" for s in strings) + b"tail"


FWD_BF16 = f"{PACK}/flash/attn_fwd/FONLY__＊bf16@16_F_F_0_0___gfx908"
FWD_FP16 = f"{PACK}/flash/attn_fwd/FONLY__＊fp16@16_F_F_0_0___gfx908"
FUSED = f"{PACK}/flash/bwd_kernel_fuse/FONLY__＊fp16@16_0_F_T_0___gfx908"


def test_the_packages_a_library_names_are_read_from_its_bytes():
    refs = library_references(_lib(FWD_BF16, f"{PACK}/flash/attn_fwd.zip", "Q='*bf16:16';PADDED_HEAD=False",
                                   "Out='*fp16:16';PADDED_HEAD=True", "amd-gfx90a/flash/attn_fwd/X",
                                   "amd-gfx908", "gfx908") + b"xx" + FWD_FP16.encode() + b"\0", PACK)
    assert refs.packages == {FWD_BF16 + ".aks2"}           # another arch's, a bare name, a string's tail: not
    assert refs.zips == {f"{PACK}/flash/attn_fwd.zip"}
    assert refs.members == {"Q='*bf16:16';PADDED_HEAD=False", "Out='*fp16:16';PADDED_HEAD=True"}


def test_a_package_the_library_names_and_the_bundle_lacks_is_named():
    lib = _lib(FWD_BF16, FWD_FP16, FUSED)
    packed = {FWD_FP16 + ".aks2"}
    fused_out = LeftOut(image=FUSED + ".aks2", member=None, kernels=2)
    pc = cover_packages(lib, PACK, packed, packed, [fused_out])
    assert pc.missing == [FWD_BF16 + ".aks2"] and pc.left_out == [FUSED + ".aks2"] and not pc.wrong_claims
    # the manifest saying the bf16 forward package was left out does not make it so
    claimed = LeftOut(image=FWD_BF16 + ".aks2", member=None, kernels=1)
    pc = cover_packages(lib, PACK, packed, packed, [fused_out, claimed])
    assert pc.missing == [FWD_BF16 + ".aks2"] and pc.wrong_claims == [FWD_BF16 + ".aks2"]
    # 0.13b: zip members, a left-out fused member, a missing forward member
    zlib = _lib(f"{PACK}/flash/attn_fwd.zip", f"{PACK}/flash/bwd_kernel_fuse.zip", "Q='*fp16:16';A=1", "Q='*bf16:16';A=1",
                "Q='*fp16:16';B=1")
    zpacked = {f"{PACK}/flash/attn_fwd.zip:Q='*fp16:16';A=1", f"{PACK}/flash/bwd_kernel_fuse.zip:Q='*fp16:16';A=1"}
    gone = LeftOut(image=f"{PACK}/flash/bwd_kernel_fuse.zip", member="Q='*fp16:16';B=1", kernels=1)
    pc = cover_packages(zlib, PACK, zpacked, zpacked, [gone])
    assert pc.missing == ["Q='*bf16:16';A=1"] and pc.left_out == ["Q='*fp16:16';B=1"]


def _report(results: dict[str, bool], containers: dict[str, str], packed: set[str]) -> DispatchReport:
    cases = []
    for name, ok in results.items():
        r = CaseResult(name, fwd=0 if ok else 400, bwd=0)
        r.launches = {"fwd": 1, "bwd": 1}
        cases.append(r)
    return DispatchReport("gfx908", 6, 0, cases, loads=len(cases), containers=containers, packed=packed)


def test_the_two_claims_over_a_dispatch_report():
    cases = check_cases(SMOKE)
    fwd16, fwd_bf, fused, varlen, dq = (FWD_FP16 + ".aks2", FWD_BF16 + ".aks2", FUSED + ".aks2",
                                        f"{PACK}/flash/bwd_preprocess_varlen/FONLY__x.aks2",
                                        f"{PACK}/flash/bwd_kernel_dq/FONLY__y.aks2")
    lib = _lib(*(p.removesuffix(".aks2") for p in (fwd16, fwd_bf, fused, varlen, dq)))
    packed = {fwd16, fwd_bf, fused, varlen, dq}
    loaded = {"k1": fwd16, "k2": fwd_bf, "k3": dq}
    cov = coverage(SMOKE, cases, _report({c.name: True for c in cases}, loaded, packed), lib, "gfx908", [])
    assert cov.ok, [c.detail for c in cov.claims]
    assert {a.value for a in cov.axes} == {"fp16", "bf16", "64", "causal", "bias", "dropout", "padded head"}
    assert all(a.cases and not a.failed for a in cov.axes)
    assert "3 of 5 loaded by a case" in cov.claims[1].detail and "backward backend" in cov.claims[1].detail

    # the bf16 forward package gone, its cases failing: the axes claim fails naming the cases
    failing = {c.name: c.dtype != "bf16" for c in cases}
    cov = coverage(SMOKE, cases, _report(failing, {"k1": fwd16, "k3": dq}, packed - {fwd_bf}), lib, "gfx908", [])
    axes, loaded_claim = cov.claims
    assert not axes.ok and "dtype bf16: 12 of 12 cases fail" in axes.detail
    assert loaded_claim.ok and not cov.ok
    assert cov.as_json()["packages"]["missing"] == [fwd_bf]

    # a packed forward package no case loads: a functional the cases miss
    extra = f"{PACK}/flash/attn_fwd/FONLY__＊fp16@16_T_T_9_9___gfx908.aks2"
    cov = coverage(SMOKE, cases, _report({c.name: True for c in cases}, loaded, packed | {extra}), lib, "gfx908", [])
    assert not cov.claims[1].ok and extra in cov.claims[1].detail and cov.claims[0].ok


def test_a_container_is_spelt_and_read_by_one_owner():
    """codegen.formats.aks2 names image containers, and reads the name back, for the dispatch's
    image index, the missing-image control, install's package claim and coverage alike."""
    package = "amd-gfx908/flash/bwd_kernel_fuse/FONLY__＊fp16@16_64_F_0_F_F___gfx908.aks2"
    member = "bwd_kernel_fuse/FONLY__＊fp16@16.aks2"
    for rel, inner, kernel in ((package, None, "bwd_kernel_fuse"),
                               ("amd-gfx908/flash/attn_fwd.zip", member, "attn_fwd"),
                               ("odd.aks2", None, "odd.aks2")):
        name = container_name(rel, inner)
        assert split_container(name) == (rel, inner) and container_kernel(name) == kernel
    assert container_name("amd-gfx908/flash/attn_fwd.zip", "m.aks2") == "amd-gfx908/flash/attn_fwd.zip:m.aks2"
