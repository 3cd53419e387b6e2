"""What a bundle's library is, proven from the file itself: the one set of checks `bundle check`
makes and `torch install --bundle` makes again on the owner's machine (a bundle travels: its
manifest only claims, the ELF file shows).

`link_identity`: it needs the HIP runtime of its major, `libamdhip64.so.<N>`, and no other (an
unversioned `libamdhip64.so`, or `.so.6` and `.so.7` together, fail); no RPATH or RUNPATH but
`$ORIGIN` (a folder there is searched on the user's machine); every HIP symbol it imports bound to
a version node the runtime of that major defines (`hip_nodes`: read from the private sysroot's
runtime by `bundle check`, from the runtime a torch wheel ships by install; None where there is
none to read, and the loader checks the nodes when it loads); with HIP >= 6
`hipGetDevicePropertiesR0600`, not the pre-6.0 `hipGetDeviceProperties` (whose struct layout
differs); the GLIBC/GLIBCXX versions it needs equal what the manifest states.

`library_identity` adds what the manifest claims of the library: its release (the SONAME and the
file name are that release's library, `codegen.upstream`), its HIP major (the DT_NEEDED one: the
link identity above is made against the manifest's major), and every ELF fact it lists
(SONAME, DT_NEEDED, RPATH, RUNPATH, HIP imports) equal to the file's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from codegen.formats.elf import DynamicInfo
from codegen.models.bundle import BundleManifest
from codegen.upstream.releases import by_release

HIP_RE_PREFIX = "libamdhip64"


@dataclass
class Claim:
    name: str
    ok: bool
    detail: str
    where: str = "CPU: ELF read with codegen.formats.elf"
    observed: dict | None = None   # what the verdict was made from, as fields (the forced-backend probe)

    def as_json(self) -> dict:
        out = {"claim": self.name, "ok": self.ok, "detail": self.detail, "verified": self.where}
        return out if self.observed is None else {**out, "observed": self.observed}


def link_identity(dyn: DynamicInfo, hip: int, hip_nodes: set[str] | None, stated: dict | None = None) -> list[Claim]:
    out = []
    hips = [n for n in dyn.needed if n.startswith(HIP_RE_PREFIX)]
    want = f"libamdhip64.so.{hip}"
    out.append(Claim("DT_NEEDED names the HIP runtime of its major", hips == [want],
                     f"needs {', '.join(hips) or 'no HIP runtime'}; a HIP {hip} torch wheel loads {want} "
                     f"(its torch/lib/libamdhip64.so carries that SONAME)"))
    paths = list(dyn.rpath) + list(dyn.runpath)
    out.append(Claim("no RPATH/RUNPATH outside the library's folder", all(p == "$ORIGIN" for p in paths),
                     f"RPATH {list(dyn.rpath) or 'none'}, RUNPATH {list(dyn.runpath) or 'none'}"))
    imports = {s: v for s, v in dyn.import_versions if s.startswith("hip")}
    if hip_nodes is not None:
        foreign = sorted(f"{s}@{v}" for s, v in imports.items() if v not in hip_nodes)
        out.append(Claim(f"HIP symbols bound to nodes HIP {hip} defines", not foreign and bool(imports),
                         f"{len(imports)} versioned HIP imports ({', '.join(sorted(set(imports.values())))})"
                         + (f"; not defined by HIP {hip}: {', '.join(foreign)}" if foreign else "")))
    unversioned = sorted(s for s in dyn.undefined if s.startswith("hip") and s not in imports)
    if hip >= 6:
        old = "hipGetDeviceProperties" in imports or "hipGetDeviceProperties" in unversioned
        out.append(Claim("hipDeviceProp_t of HIP >= 6 (hipGetDevicePropertiesR0600)",
                         "hipGetDevicePropertiesR0600" in imports and not old,
                         "imports " + ", ".join(x for x in ("hipGetDevicePropertiesR0600", "hipGetDeviceProperties")
                                                if x in imports or x in unversioned)))
    glibc, glibcxx = dyn.highest("GLIBC"), dyn.highest("GLIBCXX")
    if stated is not None:
        ok = stated.get("glibc") == glibc and stated.get("glibcxx") == glibcxx
        out.append(Claim("GLIBC/GLIBCXX needs as the manifest states", ok,
                         f"needs {glibc}, {glibcxx or 'no GLIBCXX'}; manifest {stated.get('glibc')}, "
                         f"{stated.get('glibcxx') or 'no GLIBCXX'}"))
    return out


def _facts(dyn: DynamicInfo) -> dict:
    """The library's ELF facts, spelt as a bundle manifest's `library` record spells them."""
    return {"soname": dyn.soname, "needed": list(dyn.needed), "rpath": list(dyn.rpath),
            "runpath": list(dyn.runpath), "hip_runtime": [n for n in dyn.needed if n.startswith(HIP_RE_PREFIX)],
            "hip_imports": dict(x for x in dyn.import_versions if x[0].startswith("hip"))}


def library_identity(dyn: DynamicInfo, manifest: BundleManifest, hip_nodes: set[str] | None) -> list[Claim]:
    """Every check of the bundle's library (module doc): link identity against the manifest's HIP
    major, its release, the ELF facts the manifest lists."""
    needs = manifest.library.needs
    out = link_identity(dyn, manifest.hip_major, hip_nodes, needs.model_dump() if needs is not None else None)
    lib = by_release(manifest.release).library
    name = PurePosixPath(manifest.library.file)
    out.append(Claim(f"the library is AOTriton {manifest.release}'s, as the manifest states",
                     dyn.soname == lib and name == PurePosixPath("lib", lib),
                     f"SONAME {dyn.soname or 'none'}, file {manifest.library.file}; release {manifest.release} "
                     f"installs lib/{lib}"))
    facts, stated = _facts(dyn), manifest.library.model_dump()
    differ = sorted(k for k in manifest.library.model_fields_set & set(facts) if stated[k] != facts[k])
    out.append(Claim("the ELF facts the manifest lists are the library's", not differ,
                     "; ".join(f"{k}: manifest {stated[k]!r}, file {facts[k]!r}" for k in differ)[:2000]
                     or f"{', '.join(sorted(manifest.library.model_fields_set & set(facts))) or 'none listed'}"))
    return out
