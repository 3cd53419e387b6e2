"""Checks an installed AOTriton build: the versioned library, its exported entry points, and the
packed kernel images against every kernel the generated dispatch tables can select."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from codegen.core.errors import UpstreamError
from codegen.formats.elf import read_dynamic  # the one ELF reader
from codegen.models.image_name import SIG, Spelling
from codegen.upstream.releases import IMAGES_DIR
from codegen.formats.aks2 import (ImageError, PackedEntry, read_aks2_directory, read_zip_clusters, referenced_kernels,
                     referenced_zip_kernels)

# Itanium-mangled prefixes of what PyTorch calls: check_gpu always; the v2 attention entry points
# up to 0.12.1b (adapter.exports_v2_attn), the v3 ones from 0.11b (adapter.exports_v3_api).
REQUIRED_SYMBOLS = {
    "aotriton::v2::flash::check_gpu": "_ZN8aotriton2v25flash9check_gpuE",
}
V2_ATTN_SYMBOLS = {
    "aotriton::v2::flash::attn_fwd": "_ZN8aotriton2v25flash8attn_fwdE",
    "aotriton::v2::flash::attn_bwd": "_ZN8aotriton2v25flash8attn_bwdE",
}
V3_SYMBOLS = {
    "aotriton::v3::flash::attn_fwd": "_ZN8aotriton2v35flash8attn_fwdE",
    "aotriton::v3::flash::attn_bwd": "_ZN8aotriton2v35flash8attn_bwdE",
}
LIST_LIMIT = 20


class VerifyError(UpstreamError):
    """The install is incomplete."""


@dataclass
class Verification:
    library: str
    symbols: dict[str, bool] = field(default_factory=dict)
    images_dir: str | None = None
    packages: int = 0
    kernels_referenced: int = 0
    kernels_packed: int = 0
    missing: list[str] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    by_kernel: dict[str, int] = field(default_factory=dict)
    left_out: int = 0  # referenced kernels of the packages the build left out (codegen.imagebuild.reach)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        return {
            "ok": self.ok, "library": self.library, "symbols": dict(sorted(self.symbols.items())),
            "images_dir": self.images_dir, "packages": self.packages,
            "kernels_referenced": self.kernels_referenced, "kernels_packed": self.kernels_packed,
            "kernels_by_family": dict(sorted(self.by_kernel.items())), "kernels_left_out": self.left_out,
            "missing": self.missing[:LIST_LIMIT], "missing_count": len(self.missing),
            "empty": self.empty[:LIST_LIMIT], "empty_count": len(self.empty), "problems": self.problems,
        }


def defined_symbols(lib: Path) -> set[str]:
    """Defined dynamic symbols (mangled), read from the library's ELF dynamic section."""
    return set(read_dynamic(lib).defined)


def verify_install(prefix: Path, build_dir: Path, *, version: tuple[int, int, int], arch: str,
                   images: bool, v3_api: bool = True, v2_attn: bool = True,
                   image_format: str = "aks2", names: Spelling = SIG, reach=None) -> Verification:
    """`reach`: what the build left out (codegen.plan.reach.Reach, None: nothing); the kernels of
    those packages are counted apart, not as missing. `image_format` and `names`: how the release
    packs and names its images (its record's)."""
    libdir = prefix / "lib"
    lib = libdir / f"libaotriton_v2.so.{version[0]}.{version[1]}.{version[2]}"
    v = Verification(library=str(lib))
    if not lib.is_file():
        found = sorted(p.name for p in libdir.glob("libaotriton*.so*")) if libdir.is_dir() else []
        v.problems.append(f"{lib} is missing" + (f" (found: {', '.join(found)})" if found else ""))
    else:
        syms = defined_symbols(lib)
        wanted = dict(REQUIRED_SYMBOLS)
        if v2_attn:
            wanted.update(V2_ATTN_SYMBOLS)
        if v3_api:
            wanted.update(V3_SYMBOLS)
        for name, prefix_ in wanted.items():
            v.symbols[name] = any(s.startswith(prefix_) for s in syms)
        absent = [n for n, ok in v.symbols.items() if not ok]
        if absent:
            v.problems.append(f"{lib.name} does not export {', '.join(absent)} (a name suffix or another release?)")
    if not images:
        return v
    img = libdir / IMAGES_DIR / f"amd-{arch}"
    v.images_dir = str(img)
    if not img.is_dir():
        v.problems.append(f"{img} is missing")
    if image_format == "zip":
        _verify_zips(v, libdir, build_dir, reach.left_out_members() if reach else set(), names)
        return v
    refs = referenced_kernels(build_dir, names)
    v.kernels_referenced = len(refs)
    if not refs:
        v.problems.append(f"no dispatch tables with kernels under {build_dir}/v3src (was the build configured?)")
    gone = reach.left_out_packages() if reach else set()
    v.left_out = sum(1 for r in refs if r.package in gone)
    refs = [r for r in refs if r.package not in gone]
    dirs: dict[str, dict | None] = {}
    for ref in refs:
        v.by_kernel[ref.kernel] = v.by_kernel.get(ref.kernel, 0) + 1
        if ref.package not in dirs:
            pkg = libdir / IMAGES_DIR / f"{ref.package}.aks2"
            try:
                dirs[ref.package] = {e.name: e for e in read_aks2_directory(pkg)} if pkg.is_file() else None
            except ImageError as exc:
                v.problems.append(str(exc))
                dirs[ref.package] = None
        entries = dirs[ref.package]
        _count(v, entries.get(ref.stem) if entries is not None else None, f"{ref.package}.aks2: {ref.stem}")
    v.packages = sum(1 for d in dirs.values() if d is not None)
    _report_unpacked(v, "the installed images")
    return v


def _count(v: Verification, entry: PackedEntry | None, label: str) -> None:
    """One referenced kernel: missing, packed empty, or packed."""
    if entry is None:
        v.missing.append(label)
    elif entry.image_size == 0:
        v.empty.append(label)
    else:
        v.kernels_packed += 1


def _report_unpacked(v: Verification, where: str) -> None:
    if v.missing:
        v.problems.append(f"{len(v.missing)} referenced kernels are not in {where}")
    if v.empty:
        v.problems.append(f"{len(v.empty)} kernels are packed empty (their compilation failed or timed out)")


def _verify_zips(v: Verification, libdir: Path, build_dir: Path, gone: set[tuple[str, str]], names: Spelling) -> None:
    """0.13b's `<arch>/<family>/<kernel>.zip` images, as the runtime reads them: every zip a
    dispatch table names is installed and valid, holds the table's functional (FUNC_NAME) as a
    member, and that member's .aks2 directory holds every kernel the table lists, non-empty."""
    refs = referenced_zip_kernels(build_dir, names)
    v.kernels_referenced = len(refs)
    if not refs:
        v.problems.append(f"no dispatch tables naming image zips under {build_dir}/v3src (was the build configured?)")
    v.left_out = sum(1 for r in refs if (r.zip, r.member) in gone)
    refs = [r for r in refs if (r.zip, r.member) not in gone]
    by_zip: dict[str, list] = {}
    for ref in refs:
        by_zip.setdefault(ref.zip, []).append(ref)
        v.by_kernel[ref.kernel] = v.by_kernel.get(ref.kernel, 0) + 1
    for rel, zrefs in by_zip.items():
        path = libdir / IMAGES_DIR / rel
        if not path.is_file():
            v.missing.extend(f"{rel}: {r.member} {r.entry}" for r in zrefs)
            continue
        try:
            clusters = read_zip_clusters(path, {r.member for r in zrefs})
        except ImageError as exc:
            v.problems.append(str(exc))
            continue
        v.packages += 1
        for r in zrefs:
            entries = clusters.get(r.member)
            _count(v, entries.get(r.entry) if entries is not None else None, f"{rel}: {r.member} {r.entry}")
    _report_unpacked(v, "the installed image zips")
