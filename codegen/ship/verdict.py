"""One verdict for a bundle: whether it is accepted, decided from its extracted files alone by
`bundle_verdict`, the one function `bundle check` (first: its emulated dispatch, coverage and
controls run only when every claim holds), `torch install --bundle` (a file, or `auto`: a bundle
failing a claim is refused, exit 2, before torch is touched) and `bundle index` (a bundle failing
a claim is not listed) call. No bundle passes one of them and fails another on these grounds.

1. **Identity** (codegen.ship.identity): the library is what the manifest says, linked as a
   torch wheel loads it, against the version nodes of a HIP runtime: the private sysroot's
   (check), the one torch ships (install), none (index; the loader checks them).
2. **One library**: lib/ holds one AOTriton library, the manifest's. With a second, which one
   PyTorch loads depends on the install.
3. **Packages named** (codegen.ship.coverage.cover_packages, over the names the images folder
   packs): every image package the library names for the manifest's arch (`amd-<arch>`) is
   packed, or left out by the build as an unreachable fused backward package; and it names at
   least one. A claim over nothing holds for any bundle: a gfx908 library relabelled gfx90a names
   no package of amd-gfx90a.
4. **Packages decompress** (codegen.formats.aks2.verify_images): every kernel package's xz stream
   decodes whole to the size its header gives, and each image zip's CRCs hold. A corrupt package
   re-signed into the manifest passes the member checks; the runtime would fail to load it.

What needs the emulated dispatch (every case dispatched, the tuning rows, the negative controls)
is `bundle check`'s alone (codegen.ship.check); `torch install --bundle auto` runs it where it can."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from codegen.formats.aks2 import ImageError, packed_containers, verify_images
from codegen.formats.elf import read_dynamic
from codegen.formats.op_table import FUSED_FAMILY
from codegen.models.bundle import BundleManifest
from codegen.ship.coverage import cover_packages, some
from codegen.ship.identity import Claim, library_identity
from codegen.ship.layout import IMAGES_DIR, AotLib

WHERE = "CPU: the bundle's files (codegen.ship.verdict)"
ONE_LIBRARY = "one AOTriton library, the one the manifest names"
PACKAGES = "every image package the library names is in the bundle"
DECOMPRESS = "every kernel package decompresses whole"


def _one_library(root: Path, manifest: BundleManifest) -> Claim:
    lib_dir = root / "lib"
    found = sorted(p.name for p in lib_dir.iterdir() if AotLib.parse(p.name)) if lib_dir.is_dir() else []
    want = PurePosixPath(manifest.library.file)
    ok = found == [want.name] and want.parent == PurePosixPath("lib")
    return Claim(ONE_LIBRARY, ok, f"lib/ holds {', '.join(found) or 'none'}; the manifest names "
                 f"{manifest.library.file}", WHERE)


def _packages(root: Path, manifest: BundleManifest, lib: bytes) -> Claim:
    pack = f"amd-{manifest.arch}"
    try:
        packed = packed_containers(root / "lib" / IMAGES_DIR)
    except ImageError as exc:
        return Claim(PACKAGES, False, str(exc), WHERE)
    reach = manifest.built_with.reach if manifest.built_with else None
    pc = cover_packages(lib, pack, packed, set(), list(reach.left_out) if reach else [])
    line = (f"{pc.named} named for {pack}, {pc.packed} packed"
            + (f", {len(pc.left_out)} left out by the build as unreachable (fused backward, manifest "
               "built_with.reach)" if pc.left_out else ""))
    if not pc.named:
        line += f": the library names no image package of {pack}, so it would load no kernel for {manifest.arch}"
    if pc.missing:
        line += f"; missing: {some(pc.missing)}"
    if pc.wrong_claims:
        line += (f"; the manifest lists as left out {some(pc.wrong_claims)}, but only fused backward "
                 f"packages ({FUSED_FAMILY}) are ever left out")
    return Claim(PACKAGES, bool(pc.named) and not pc.missing and not pc.wrong_claims, line, WHERE)


def _decompress(root: Path) -> Claim:
    try:
        kernels = verify_images(root / "lib" / IMAGES_DIR)
    except ImageError as exc:
        return Claim(DECOMPRESS, False, str(exc).replace(f"{root}/", "", 1), WHERE)
    return Claim(DECOMPRESS, True, f"{kernels} kernels", WHERE)


def bundle_verdict(root: Path, manifest: BundleManifest, hip_nodes: set[str] | None) -> list[Claim]:
    """The claims (module doc) over the bundle extracted at `root`; it is accepted when every one
    holds. `hip_nodes`: the version nodes of the HIP runtime it will load (None: none to read)."""
    lib = root / manifest.library.file
    claims = library_identity(read_dynamic(lib), manifest, hip_nodes)
    claims += [_one_library(root, manifest), _packages(root, manifest, lib.read_bytes()), _decompress(root)]
    return claims


def refused(claims: list[Claim]) -> str | None:
    """The failed claims as one line (None: the bundle is accepted)."""
    failed = [c for c in claims if not c.ok]
    return "; ".join(f"{c.name} ({c.detail})" for c in failed) or None
