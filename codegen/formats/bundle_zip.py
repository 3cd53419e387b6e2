"""The bundle file: one zip per (AOTriton release, arch, HIP major), and the only reader of it.

Members: `manifest.json`, `spec.yaml` (the spec it was built from), `lib/libaotriton_v2.so.X.Y.Z`,
`lib/aotriton.images/amd-<arch>/...`, `include/aotriton/...` (the headers the library was
built with: `bundle check` compiles its dispatch driver against them) and `tuning-rows.json` (the
spec's GPUs' tuning rows, read and validated by rows.py; absent from bundles made before it). The
manifest lists every other member with its sha256 and size.

A bundle is hostile input. `open_bundle` reads only a bounded regular file; every member name
goes through `codegen.core.contain.rel_path` and is at most 32 folders deep; links, directories
posing as files, duplicates, members the manifest does not list (or listed ones that are
missing) and any sha256 or size that differs are refused with one message (exit 2) before
anything is extracted. The manifest is one model (`codegen.models.bundle.BundleManifest`, every
field checked: the arch a processor name, the release one of `codegen.upstream`'s, the HIP major
a known one, every path clean), read through the records' one reader (`codegen.models.records`):
anything else is one located message (`BUNDLE: manifest.json: FIELD: what is wrong`, exit 2).
`extract` then writes each member below one new folder through `codegen.core.contain.inside`.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import stat
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

from codegen.core.contain import Escape, inside, rel_path
from codegen.core.errors import UserError, os_failure, os_reason
from codegen.core.fsutil import move_into_place, read_input, stage_write
from codegen.models.bundle import MANIFEST_FORMAT, MANIFEST_LIMIT, BundleManifest
from codegen.models.records import clip, parse_record, validate_record, write_json
from codegen.upstream.releases import SUPPORTED, version_text

FORMAT = MANIFEST_FORMAT
MANIFEST = "manifest.json"
SPEC = "spec.yaml"
BUNDLE_LIMIT = 2 << 30          # bytes of one bundle file
MEMBER_LIMIT = 1 << 30          # uncompressed bytes of one member
MEMBER_DEPTH = 32               # folders of one member's path: ours go 5 deep (lib/aotriton.images/amd-<arch>/flash/…)
TOTAL_LIMIT = 4 << 30           # uncompressed bytes of all members


class BundleError(UserError):
    """A file that is not a bundle, or a truncated or tampered one (exit 2)."""


def bundle_name(release: str, arch: str, hip: int) -> str:
    """`aotriton-0.11b-gfx908-hip6.mi100-bundle.zip`"""
    return f"aotriton-{release}-{arch}-hip{hip}.mi100-bundle.zip"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_HINT = "the bundle was changed after it was built, or made by something else: download or build it again"


def _context() -> dict:
    """What a manifest's release is checked against: the releases upstream's records know."""
    return {"releases": {r.release: version_text(r.version) for r in SUPPORTED}}


def manifest_of(data: dict, where: str) -> BundleManifest:
    """A manifest the writer made (`bundle build`, `add_rows`) as the model every reader reads:
    what it cannot read back is never written (one located message, exit 2)."""
    return validate_record(BundleManifest, data, where=where, what="bundle manifest", context=_context())


@dataclass(frozen=True)
class Bundle:
    path: Path
    manifest: BundleManifest
    members: dict[str, bytes]     # every member but manifest.json, verified
    size: int = 0                 # bytes of the file as it was read (the bytes verified)
    sha256: str = ""              # their sha256 (what an index lists)

    @property
    def library(self) -> str:
        return self.manifest.library.file


def write_bundle(dest: Path, manifest: BundleManifest, files: dict[str, bytes]) -> None:
    """Write the zip to `dest` atomically (a temporary file beside it, then one rename)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        info = zipfile.ZipInfo(MANIFEST, (2026, 1, 1, 0, 0, 0))
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        z.writestr(info, write_json(manifest), compress_type=zipfile.ZIP_DEFLATED)
        for name in sorted(files):
            info = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | 0o644) << 16
            # kernel packages are xz inside already; the library and headers compress
            kind = zipfile.ZIP_STORED if name.endswith((".aks2", ".zip")) else zipfile.ZIP_DEFLATED
            z.writestr(info, files[name], compress_type=kind)
    move_into_place(stage_write(dest, buf.getvalue()), dest)


def open_bundle(path: Path) -> Bundle:
    """Read and verify a bundle (see the module doc); BundleError on anything wrong."""
    data = read_input(path, what="bundle", limit=BUNDLE_LIMIT)
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise BundleError(f"{path}: not a bundle or a truncated one ({exc})",
                          hint="download or build it again: mi100-codegen bundle build TREE --hip N") from None
    try:
        return replace(_verify(path, z), size=len(data), sha256=sha256(data))
    except (zipfile.BadZipFile, OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, zlib.error,
            lzma.LZMAError, RuntimeError) as exc:   # RuntimeError: an encrypted member, an unknown compression
        raise BundleError(f"{path}: corrupt bundle ({type(exc).__name__}: {exc})",
                          hint="download or build it again") from None


def _verify(path: Path, z: zipfile.ZipFile) -> Bundle:
    infos: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in z.infolist():
        try:
            rel_path(info.filename, (".git",))
        except ValueError as exc:
            raise BundleError(f"{path}: refusing member '{clip(info.filename)}': {exc}") from None
        if info.filename.count("/") > MEMBER_DEPTH:
            raise BundleError(f"{path}: refusing member '{clip(info.filename)}': more than {MEMBER_DEPTH} folders deep")
        kind = stat.S_IFMT(info.external_attr >> 16)   # 0: no Unix mode recorded
        if info.is_dir() or (kind and kind != stat.S_IFREG):
            raise BundleError(f"{path}: member {info.filename} is not a regular file")
        if info.filename in infos:
            raise BundleError(f"{path}: member {info.filename} appears twice")
        if info.file_size > MEMBER_LIMIT:
            raise BundleError(f"{path}: member {info.filename} is larger than {MEMBER_LIMIT:,} bytes")
        total += info.file_size
        infos[info.filename] = info
    if total > TOTAL_LIMIT:
        raise BundleError(f"{path}: members add up to more than {TOTAL_LIMIT:,} bytes")
    if MANIFEST not in infos:
        raise BundleError(f"{path}: no {MANIFEST}: not an mi100-codegen bundle")
    if infos[MANIFEST].file_size > MANIFEST_LIMIT:
        raise BundleError(f"{path}: {MANIFEST} is larger than {MANIFEST_LIMIT:,} bytes", hint=_HINT)
    manifest = parse_record(BundleManifest, z.read(MANIFEST), where=f"{path}: {MANIFEST}", what="bundle manifest",
                            hint=_HINT, context=_context())
    listed = manifest.files
    extra = sorted(set(infos) - set(listed) - {MANIFEST})
    missing = sorted(set(listed) - set(infos))
    if extra or missing:
        raise BundleError(f"{path}: members and manifest differ ("
                          + "; ".join(x for x in (f"not listed: {', '.join(extra[:5])}" if extra else "",
                                                  f"missing: {', '.join(missing[:5])}" if missing else "") if x) + ")",
                          hint=_HINT)
    members: dict[str, bytes] = {}
    for name, rec in sorted(listed.items()):
        blob = z.read(name)
        if len(blob) != rec.size or sha256(blob) != rec.sha256:
            raise BundleError(f"{path}: member {name} does not match the manifest (sha256 {sha256(blob)[:12]}…, "
                              f"manifest {rec.sha256[:12]}…)", hint=_HINT)
        members[name] = blob
    return Bundle(path, manifest, members)   # the library and the spec are listed members (the model)


def extract(bundle: Bundle, dest: Path) -> Path:
    """Write the verified members below `dest` (a new or empty folder); returns it."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for name, blob in sorted(bundle.members.items()):
            try:
                target = inside(dest, name)
            except Escape as exc:
                raise BundleError(f"{bundle.path}: {exc}") from None
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob)
    except OSError as exc:
        raise os_failure(f"{bundle.path}: cannot extract it into {dest} ({os_reason(exc)})", exc) from None
    return dest


__all__ = ["BUNDLE_LIMIT", "Bundle", "BundleError", "FORMAT", "MANIFEST", "SPEC", "bundle_name", "extract",
           "manifest_of", "open_bundle", "sha256", "write_bundle"]
