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

Streamed: the file and every member are read in CHUNK-sized pieces, so opening, checking and
extracting a bundle holds at most a few of them in memory whatever its size (a member is held
whole only when a caller asks `Bundle.members` for it: the library, the tuning rows). What is
read after `open_bundle` (a member, an extraction) is checked against the manifest's sha256
again, so it is the bytes that were verified, or a BundleError; the file changing while it is
verified (its size, mtime or inode) is one too.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import stat
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from codegen.core.contain import Escape, inside, rel_path
from codegen.core.errors import UserError, os_failure, os_reason
from codegen.core.fsutil import move_into_place, open_input, sha256, stage_write
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
CHUNK = 1 << 20                 # bytes read at a time (the file, a member)


class BundleError(UserError):
    """A file that is not a bundle, or a truncated or tampered one (exit 2)."""


def bundle_name(release: str, arch: str, hip: int) -> str:
    """`aotriton-0.11b-gfx908-hip6.mi100-bundle.zip`"""
    return f"aotriton-{release}-{arch}-hip{hip}.mi100-bundle.zip"


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
    members: Mapping[str, bytes]  # every member but manifest.json, verified; read when asked for (`Members`)
    size: int = 0                 # bytes of the file as it was read (the bytes verified)
    sha256: str = ""              # their sha256 (what an index lists)

    @property
    def library(self) -> str:
        return self.manifest.library.file


class Members(Mapping):
    """A verified bundle's members by name: each read from the file when asked for, and checked
    against the manifest again (BundleError if the file changed since it was verified)."""

    def __init__(self, path: Path, manifest: BundleManifest):
        self._path, self._files = path, manifest.files

    def __getitem__(self, name: str) -> bytes:
        rec = self._files[name]
        with _reading(self._path) as z:
            try:
                data = z.read(name) if z.getinfo(name).file_size == rec.size else b""
            except _ZIP_ERRORS as exc:
                raise _corrupt(self._path, exc) from None
        if len(data) != rec.size or sha256(data) != rec.sha256:
            raise BundleError(f"{self._path}: member {name} changed since the bundle was verified", hint=_HINT)
        return data

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._files))

    def __len__(self) -> int:
        return len(self._files)


_ZIP_ERRORS = (zipfile.BadZipFile, OSError, ValueError, KeyError, EOFError, UnicodeDecodeError, zlib.error,
               lzma.LZMAError, RuntimeError)   # RuntimeError: an encrypted member, an unknown compression


def _corrupt(path: Path, exc: Exception) -> BundleError:
    return BundleError(f"{path}: corrupt bundle ({type(exc).__name__}: {exc})", hint="download or build it again")


@contextmanager
def _reading(path: Path):
    """The bundle file as a zip, read in place (bounded, a regular file: `open_input`)."""
    with open_input(path, what="bundle", limit=BUNDLE_LIMIT) as fh:
        try:
            z = zipfile.ZipFile(fh)
        except _ZIP_ERRORS as exc:
            raise _corrupt(path, exc) from None
        with z:
            yield z


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
    """Read and verify a bundle (see the module doc), streamed; BundleError on anything wrong."""
    with open_input(path, what="bundle", limit=BUNDLE_LIMIT) as fh:
        before = os.fstat(fh.fileno())
        h, size = hashlib.sha256(), 0
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
        fh.seek(0)
        try:
            z = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise BundleError(f"{path}: not a bundle or a truncated one ({exc})",
                              hint="download or build it again: mi100-codegen bundle build TREE --hip N") from None
        try:
            manifest = _verify(path, z)
        except _ZIP_ERRORS as exc:
            raise _corrupt(path, exc) from None
        after = os.fstat(fh.fileno())
    if (before.st_size, before.st_mtime_ns, before.st_ino) != (after.st_size, after.st_mtime_ns, after.st_ino) \
            or size > BUNDLE_LIMIT:
        raise BundleError(f"{path}: the file changed while it was read", hint="read it again when nothing writes it")
    return Bundle(path, manifest, Members(path, manifest), size, h.hexdigest())


def _digest(path: Path, z: zipfile.ZipFile, name: str, out=None) -> tuple[str, int]:
    """The sha256 and size of one member, read in CHUNK-sized pieces (each written to `out`,
    when given: its errors are the caller's); a member that cannot be read is BundleError."""
    h, n = hashlib.sha256(), 0
    try:
        f = z.open(name)
    except _ZIP_ERRORS as exc:
        raise _corrupt(path, exc) from None
    with f:
        while True:
            try:
                chunk = f.read(CHUNK)
            except _ZIP_ERRORS as exc:
                raise _corrupt(path, exc) from None
            if not chunk:
                return h.hexdigest(), n
            h.update(chunk)
            n += len(chunk)
            if out is not None:
                out.write(chunk)


def _verify(path: Path, z: zipfile.ZipFile) -> BundleManifest:
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
    for name, rec in sorted(listed.items()):
        got, n = _digest(path, z, name)
        if n != rec.size or got != rec.sha256:
            raise BundleError(f"{path}: member {name} does not match the manifest (sha256 {got[:12]}…, "
                              f"manifest {rec.sha256[:12]}…)", hint=_HINT)
    return manifest   # the library and the spec are listed members (the model)


def extract(bundle: Bundle, dest: Path) -> Path:
    """Write the verified members below `dest` (a new or empty folder), streamed, each checked
    against the manifest again as it is written; returns `dest`."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        with _reading(bundle.path) as z:
            for name, rec in sorted(bundle.manifest.files.items()):
                try:
                    target = inside(dest, name)
                except Escape as exc:
                    raise BundleError(f"{bundle.path}: {exc}") from None
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    got, n = _digest(bundle.path, z, name, out)
                if n != rec.size or got != rec.sha256:
                    raise BundleError(f"{bundle.path}: member {name} changed since the bundle was verified", hint=_HINT)
    except OSError as exc:
        raise os_failure(f"{bundle.path}: cannot extract it into {dest} ({os_reason(exc)})", exc) from None
    return dest
