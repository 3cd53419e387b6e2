"""What `bundle check`'s emulated dispatch covered (issue 30 item 5), as two claims:

1. **the spec's axes**: every dtype the build serves (the spec's and those upstream builds anyway,
   `codegen.models.dtypes.served_dtypes`), every head dim, and each variant its features make
   (causal, bias, dropout) and a padded head (a head dim 8 below a declared one) dispatched by at
   least one case, every such case passing: the cases are made from those axes
   (`codegen.ship.dispatch.check_cases`), so a package missing for any functional fails its case;
2. **the packed packages the cases loaded**: a packed package that no case loaded is a failure,
   unless PyTorch's calls may not reach it with the cases' inputs, said per package: a backward
   backend the backward op table did not pick for them, a kernel for variable-length inputs (the
   cases are dense), a debugging kernel.

The packages the library names (`cover_packages`: each image package its compiled dispatch tables
name, `codegen.formats.aks2.library_references`, is packed, or was left out by the build as
unreachable: only a fused backward package ever is, `codegen.plan.reach`, and the manifest's
`built_with.reach` names those) are a claim of the bundle's verdict (codegen.ship.verdict), made
before the dispatch, by install too.

What the bundle alone cannot show: that the op table never picks a left-out fused package for
inputs the cases did not use. `bundle build` proved it from the generator's output
(`codegen.imagebuild.reach`); from a bundle, only a rebuild can (`bundle verify`, docs/trust.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.formats.aks2 import container_kernel, container_name, library_references, split_container
from codegen.formats.op_table import FUSED_FAMILY
from codegen.models import TargetSpec
from codegen.models.dtypes import served_dtypes
from codegen.models.reach import LeftOut
from codegen.ship.dispatch import DispatchCase, DispatchReport, padded_head
from codegen.ship.identity import Claim

SHOWN = 3   # names per list in a claim's line (all of them in --json)


@dataclass
class AxisCover:
    """One declared axis value (a dtype, a head dim, a variant) and the cases that dispatched it."""

    axis: str
    value: str
    cases: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        return {"axis": self.axis, "value": self.value, "cases": len(self.cases), "failed": self.failed}


@dataclass
class PackageCover:
    """The image packages (ImageIndex containers: an `.aks2` path, or `<zip>:<member>`) named, packed and loaded."""

    named: int = 0
    packed: int = 0
    left_out: list[str] = field(default_factory=list)     # named, not packed: left out by the build
    missing: list[str] = field(default_factory=list)      # named, not packed, not left out
    wrong_claims: list[str] = field(default_factory=list)  # left-out entries of a family never left out
    loaded: int = 0
    not_loaded: dict[str, list[str]] = field(default_factory=dict)   # why -> packages

    def as_json(self) -> dict:
        return {"named": self.named, "packed": self.packed, "left_out": self.left_out, "missing": self.missing,
                "wrong_left_out_claims": self.wrong_claims, "loaded": self.loaded, "not_loaded": self.not_loaded}


@dataclass
class Coverage:
    axes: list[AxisCover]
    packages: PackageCover
    claims: list[Claim]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.claims)

    def as_json(self) -> dict:
        return {"claims": [c.as_json() for c in self.claims], "axes": [a.as_json() for a in self.axes],
                "packages": self.packages.as_json()}


def declared(spec: TargetSpec) -> list[tuple[str, str]]:
    """The axis values a bundle of `spec` must dispatch: (axis, value)."""
    out = [("dtype", d) for d in served_dtypes(spec.dtypes)] + [("head dim", str(h)) for h in sorted(spec.head_dims)]
    f = spec.features
    out += [("variant", v) for v, on in (("causal", f.causal), ("bias", f.bias), ("dropout", f.dropout)) if on]
    if any(padded_head(h, spec.head_dims) for h in spec.head_dims):
        out.append(("variant", "padded head"))
    return out


def axes_of(case: DispatchCase) -> set[tuple[str, str]]:
    f, padded = case.package
    flags = (("causal", f.causal), ("bias", f.bias), ("dropout", f.dropout), ("padded head", padded))
    return {("dtype", f.dtype), ("head dim", str(f.head_dim))} | {("variant", v) for v, on in flags if on}


def cover_axes(spec: TargetSpec, cases: list[DispatchCase], report: DispatchReport) -> list[AxisCover]:
    ok = {c.case: c.ok for c in report.cases}
    out = []
    for axis, value in declared(spec):
        a = AxisCover(axis, value)
        for c in cases:
            if (axis, value) in axes_of(c):
                a.cases.append(c.name)
                if not ok.get(c.name, False):
                    a.failed.append(c.name)
        out.append(a)
    return out


def why_not_loaded(fam: str) -> str | None:
    """Why PyTorch's calls may not reach a package of this family with the cases' inputs (None: they do)."""
    if fam.endswith("_varlen"):
        return "variable-length (nested) inputs; the cases are dense"
    if fam.startswith("debug_"):
        return "a debugging kernel; PyTorch's calls do not launch it"
    if fam.startswith("bwd_"):
        return "a backward backend the backward op table did not pick for the cases' inputs"
    return None


def _left_out_name(p: LeftOut) -> str:
    return container_name(p.image, p.member)


def cover_packages(lib: bytes, pack: str, packed: set[str], loaded: set[str], left_out: list[LeftOut]) -> PackageCover:
    """`lib`: the library's bytes; `pack`: its images folder (`amd-<arch>`); `packed`, `loaded`:
    containers; `left_out`: what the manifest says the build left out."""
    refs = library_references(lib, pack)
    parts = [split_container(c) for c in packed]
    aks2 = {rel for rel, member in parts if member is None}
    zips = {rel for rel, member in parts if member is not None}
    members = {member for _rel, member in parts if member is not None}
    named = sorted(refs.packages - aks2) + sorted(refs.zips - zips) + sorted(refs.members - members)
    claims = {_left_out_name(p): p for p in left_out}
    members_claimed = {p.member: p for p in left_out if p.member is not None}
    cover = PackageCover(named=len(refs.packages) + len(refs.zips) + len(refs.members),
                         packed=len(packed), loaded=len(packed & loaded))
    cover.wrong_claims = sorted(n for n in claims if container_kernel(n) != FUSED_FAMILY)
    for name in named:
        claim = claims.get(name) or members_claimed.get(name)
        fine = claim is not None and _left_out_name(claim) not in cover.wrong_claims
        (cover.left_out if fine else cover.missing).append(name)
    for c in sorted(packed - loaded):
        cover.not_loaded.setdefault(why_not_loaded(container_kernel(c)) or "", []).append(c)
    return cover


def some(names: list[str]) -> str:
    """At most SHOWN names of a list, and how many more, for a claim's line."""
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def coverage(spec: TargetSpec, cases: list[DispatchCase], report: DispatchReport, lib: bytes, arch: str,
             left_out: list[LeftOut]) -> Coverage:
    """The two claims (module doc) of one emulated dispatch of `cases`."""
    axes = cover_axes(spec, cases, report)
    loaded = {c for c in report.containers.values()}
    pc = cover_packages(lib, f"amd-{arch}", report.packed, loaded, left_out)
    bad = [a for a in axes if not a.cases or a.failed]
    line = (f"{len(axes) - len(bad)} of {len(axes)} dispatched, every case passing: "
            + ", ".join(f"{a.value} ({len(a.cases)})" for a in axes))
    if bad:
        line += "; " + "; ".join(f"{a.axis} {a.value}: " + (f"{len(a.failed)} of {len(a.cases)} cases fail "
                                                             f"({some(a.failed)})" if a.cases else "no case")
                                 for a in bad)
    claims = [Claim("every dtype, head dim and variant the spec declares is dispatched", not bad, line,
                    "CPU: emulated dispatch")]
    unexplained = pc.not_loaded.get("", [])
    line = f"{pc.loaded} of {pc.packed} loaded by a case"
    for why, names in pc.not_loaded.items():
        line += f"; {len(names)} not: " + (why or "no case dispatches their functional") + (f" ({some(names)})"
                                                                                              if not why else "")
    claims.append(Claim("every packed image package is loaded by some case", not unexplained, line,
                        "CPU: emulated dispatch"))
    return Coverage(axes, pc, claims)
