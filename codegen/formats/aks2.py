"""What the generated dispatch tables reference, and what the packed kernel images hold.

Dispatch tables: every `autotune.<kernel>/*.cc` that upstream's generator writes into the build
directory names its image package (`PACKAGE_PATH`, an `.aks2` file below `aotriton.images/`),
its functional (`FUNC_NAME`) and one line per kernel:

    { 0xHHHHHHHHu, 0xLLLLLLLLu, psel, copt }, // <b2sum> = b2sum -l 64 <<< <package><the kernel's name from __P__ on>

The runtime looks a kernel up in the package by its name (`codegen.models.image_name`: the
release's spelling parses the comment and prints the name). The comment is trusted only after
its BLAKE2b-64 matches the two numbers the runtime itself uses.

AKS2 (AOTriton kernel storage v2): magic `AKS2`, u32 total uncompressed size, u32 number of
kernels, u32 directory size, then one xz stream holding the directory (per kernel: u32 shared
memory, u32 block threads, u32 offset, u32 image size, u32 name length incl. NUL, name) followed
by the images (each at its offset after the directory). `read_aks2_directory` decompresses only
the directory, `read_aks2_images` the whole package (bounded by the size its header claims).

Image zips (0.13b+, `<arch pack>/<family>/<kernel>.zip` below the images folder): members stored,
each member one .aks2 cluster named by its functional. `read_zip_clusters` reads the directories
of some members, `read_zip_images` every member's images, `zip_without` rewrites a zip without one
member. Every failure to read either format is one ImageError naming the file (and member).

A whole images folder: `packed_kernels` lists every kernel packed below it by the reference its
dispatch table would give it (`KernelRef`, `ZipRef`), `package_images` reads one package's code
objects by reference.

A built library: its compiled dispatch tables keep each PACKAGE_PATH (0.13b: FLATZIP_PATH and
FUNC_NAME) as a NUL-ended string; `library_references` reads them back from the library's bytes,
so what a bundle's library will look for can be compared with what the bundle packs.
"""

from __future__ import annotations

import contextlib
import hashlib
import lzma
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from codegen.core.errors import UpstreamError
from codegen.core.fsutil import move_into_place
from codegen.models.image_name import Spelling

AKS2_MAGIC = b"AKS2"
_HEADER = struct.Struct("<4sIII")
_ENTRY = struct.Struct("<IIIII")
MAX_PACKAGE_BYTES = 1 << 30   # the most a package (or zip member) may hold uncompressed

_PACKAGE_RE = re.compile(r'PACKAGE_PATH.*?(?<!L)R"xyzw\((?P<path>[^)]*)\)xyzw"', re.S)
_FLATZIP_RE = re.compile(r'FLATZIP_PATH.*?(?<!L)R"xyzw\((?P<path>[^)]*)\)xyzw"', re.S)
_FUNC_RE = re.compile(r'FUNC_NAME\s*\{\s*R"xyzw\((?P<func>[^)]*)\)xyzw"')
_META_RE = re.compile(
    r"\{\s*0x(?P<hi>[0-9a-fA-F]+)u,\s*0x(?P<lo>[0-9a-fA-F]+)u,\s*-?\d+,\s*-?\d+\s*\},\s*"
    r"//\s*[0-9a-f]+\s*=\s*b2sum -l 64 <<< (?P<raw>\S+)"
)


class ImageError(UpstreamError):
    """A dispatch table or kernel package we cannot read."""


@dataclass(frozen=True)
class KernelRef:
    """One kernel a dispatch table can select."""

    package: str  # relative to aotriton.images/, without .aks2
    stem: str  # name inside the package

    @property
    def kernel(self) -> str:
        return container_kernel(self.file)

    @property
    def file(self) -> str:
        """The package file below aotriton.images/."""
        return f"{self.package}.aks2"

    @property
    def name(self) -> str:
        """The kernel's name in its package."""
        return self.stem


@dataclass(frozen=True)
class PackedEntry:
    name: str
    image_size: int
    block_threads: int
    shared_memory: int


def blake2b_64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _table_names(path: Path, text: str, container: str, functional: str, names: Spelling) -> list[str]:
    """The names, in their container, of the kernels a table's comments give: each comment is
    trusted only once its BLAKE2b-64 matches the id the runtime uses, then split by the release's
    spelling."""
    out = []
    for m in _META_RE.finditer(text):
        raw = m.group("raw")
        if blake2b_64(raw) != (int(m.group("hi"), 16) << 32) | int(m.group("lo"), 16):
            raise ImageError(f"{path}: kernel comment {raw!r} does not match its BLAKE2b id (unknown generator output)")
        kernel = container_kernel(container_name(container, functional) if container.endswith(".zip")
                                  else f"{container}.aks2")
        name = names.parse_table(raw[len(container):], kernel, functional) if raw.startswith(container) else None
        if name is None:
            raise ImageError(f"{path}: kernel {raw!r} is not a kernel of {container!r} spelt as {names.label}")
        out.append(str(name))
    return out


def parse_dispatch_table(path: Path, names: Spelling) -> list[KernelRef]:
    """Kernels referenced by one generated autotune table (empty when it references none); `names`:
    how the release names its images."""
    text = path.read_text(encoding="utf-8", errors="strict")
    if _META_RE.search(text) is None:
        return []
    pkg, func = _PACKAGE_RE.search(text), _FUNC_RE.search(text)
    if pkg is None or func is None:
        raise ImageError(f"{path}: dispatch table without PACKAGE_PATH/FUNC_NAME (unknown generator output)")
    package = pkg.group("path")
    if package.count("/") < 3:
        raise ImageError(f"{path}: unexpected package path {package!r}")
    return [KernelRef(package, stem) for stem in _table_names(path, text, package, func.group("func"), names)]


def dispatch_tables(build_dir: Path) -> list[Path]:
    """The generated autotune tables the configured build compiles, sorted. Tables an earlier
    configuration left in the same build directory (another spec, head dims or dtypes) stay on
    disk but are not in `build.ninja`, so they are skipped (without a build.ninja: every table)."""
    tables = sorted(p for p in build_dir.glob("v3src/*/autotune.*/*.cc") if p.is_file())
    try:
        ninja = (build_dir / "build.ninja").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return tables
    return [p for p in tables if str(p.resolve()) in ninja]


@dataclass(frozen=True)
class ZipRef:
    """One kernel a 0.13b dispatch table can select: the runtime opens `zip` (below
    aotriton.images/), takes its member `member` (the table's FUNC_NAME: an .aks2 cluster) and
    in it the kernel named `entry` (the kernel's descriptor after the zip path)."""

    zip: str
    member: str
    entry: str

    @property
    def kernel(self) -> str:
        return container_kernel(container_name(self.zip, self.member))

    @property
    def file(self) -> str:
        """The image zip below aotriton.images/."""
        return self.zip

    @property
    def name(self) -> str:
        """The kernel's name in its member."""
        return self.entry


def parse_zip_table(path: Path, names: Spelling) -> list[ZipRef]:
    """Kernels referenced by one 0.13b dispatch table (empty when it names no image zip)."""
    text = path.read_text(encoding="utf-8", errors="strict")
    flat = _FLATZIP_RE.search(text)
    if flat is None:
        return []
    func = _FUNC_RE.search(text)
    if func is None:
        raise ImageError(f"{path}: dispatch table without FUNC_NAME (unknown generator output)")
    zip_path, member = flat.group("path"), func.group("func")
    return [ZipRef(zip_path, member, entry) for entry in _table_names(path, text, zip_path, member, names)]


def referenced_zip_kernels(build_dir: Path, names: Spelling) -> list[ZipRef]:
    refs: set[ZipRef] = set()
    for table in dispatch_tables(build_dir):
        refs.update(parse_zip_table(table, names))
    return sorted(refs, key=lambda r: (r.zip, r.member, r.entry))


@contextlib.contextmanager
def _open_zip(path: Path) -> Iterator[zipfile.ZipFile]:
    """An image zip opened for reading; ImageError when it is not a readable zip."""
    try:
        with zipfile.ZipFile(path) as z:
            yield z
    except (OSError, zipfile.BadZipFile) as exc:
        raise ImageError(f"{path}: not a readable image zip ({exc})") from None


def read_zip_clusters(path: Path, members: set[str]) -> dict[str, dict[str, PackedEntry]]:
    """One installed image zip, opened once: checked valid (every member's CRC), then, for each of
    `members` it holds, that .aks2 cluster's directory as {kernel name: entry}. Members it lacks are
    left out; ImageError when it is not a valid zip."""
    with _open_zip(path) as z:
        bad = z.testzip()
        if bad is not None:
            raise ImageError(f"{path}: member {bad} fails its CRC")
        out: dict[str, dict[str, PackedEntry]] = {}
        for member in sorted(members & set(z.namelist())):
            with z.open(member) as f:
                out[member] = {e.name: e for e in read_aks2_directory(Path(f"{path}:{member}"), f)}
        return out


def container_name(rel: str, member: str | None = None) -> str:
    """How a container of images is named below an images folder: an `.aks2` package by its path
    (`amd-gfx908/flash/attn_fwd/<package>.aks2`), a member of an image zip as `<zip path>:<member>`."""
    return rel if member is None else f"{rel}:{member}"


def split_container(container: str) -> tuple[str, str | None]:
    """`container_name`'s parser: (the file below the images folder, the zip member or None)."""
    rel, sep, member = container.partition(":")
    return (rel, member) if sep else (container, None)


def container_kernel(container: str) -> str:
    """The kernel a container holds the images of, its folder: `<pack>/<dir>/<kernel>/<package>.aks2`
    or `<pack>/<dir>/<kernel>.zip:<member>`; the container itself when it is spelt neither way."""
    rel, member = split_container(container)
    if member is not None:
        return rel.rsplit("/", 1)[-1].removesuffix(".zip")
    parts = rel.split("/")
    return parts[2] if len(parts) > 3 else container


def packed_containers(images: Path) -> set[str]:
    """What an images folder packs, by name only (nothing decompressed): every `.aks2` package and
    every member of an image zip, as `container_name` spells them. ImageError when a zip cannot be
    read."""
    out: set[str] = set()
    for pkg in sorted(images.rglob("*.aks2")):
        out.add(container_name(pkg.relative_to(images).as_posix()))
    for zp in sorted(images.rglob("*.zip")):
        rel = zp.relative_to(images).as_posix()
        with _open_zip(zp) as z:
            out.update(container_name(rel, i.filename) for i in z.infolist() if not i.is_dir())
    return out


def read_zip_images(path: Path) -> dict[str, dict[str, bytes]]:
    """Every image of an image zip: {member: {stem: image}}. Members that are not AKS2 packages
    (or claim more than MAX_PACKAGE_BYTES) are skipped."""
    with _open_zip(path) as z:
        out = {}
        for info in z.infolist():
            if info.is_dir() or info.file_size > MAX_PACKAGE_BYTES:
                continue
            data = z.read(info)
            if data[:len(AKS2_MAGIC)] == AKS2_MAGIC:
                out[info.filename] = read_aks2_images(Path(f"{path}:{info.filename}"), data)
        return out


def zip_without(path: Path, member: str) -> None:
    """Rewrite an image zip without `member` (members stored, as the build stores them), in
    one step (a temporary sibling, then a rename)."""
    with _open_zip(path) as z:
        keep = [(i, z.read(i)) for i in z.infolist() if i.filename != member]
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for info, data in keep:
            z.writestr(info, data)
    move_into_place(tmp, path)


def referenced_kernels(build_dir: Path, names: Spelling) -> list[KernelRef]:
    refs: set[KernelRef] = set()
    for table in dispatch_tables(build_dir):
        refs.update(parse_dispatch_table(table, names))
    return sorted(refs, key=lambda r: (r.package, r.stem))


def _header(head: bytes, path: Path) -> tuple[int, int, int]:
    """(total uncompressed size, number of kernels, directory size) of a package's header."""
    if len(head) < _HEADER.size:
        raise ImageError(f"{path}: truncated kernel package")
    magic, total, count, dir_size = _HEADER.unpack_from(head)
    if magic != AKS2_MAGIC:
        raise ImageError(f"{path}: not an AKS2 kernel package (magic {magic!r})")
    return total, count, dir_size


def _entries(directory: bytes, count: int, path: Path) -> list[tuple[PackedEntry, int]]:
    """The directory's entries, each with its image's offset after the directory."""
    entries, pos = [], 0
    for _ in range(count):
        if pos + _ENTRY.size > len(directory):
            raise ImageError(f"{path}: corrupt kernel package directory")
        shared, threads, offset, size, name_len = _ENTRY.unpack_from(directory, pos)
        pos += _ENTRY.size
        name = directory[pos:pos + name_len].rstrip(b"\0").decode("utf-8", errors="replace")
        pos += name_len
        entries.append((PackedEntry(name=name, image_size=size, block_threads=threads, shared_memory=shared), offset))
    return entries


def read_aks2_directory(path: Path, stream: BinaryIO | None = None) -> list[PackedEntry]:
    """The directory of one .aks2 package (names and sizes of its kernels): the file at `path`, or
    `stream` (a member of an image zip), `path` then only naming it in messages. Only the
    directory is decompressed."""
    with (open(path, "rb") if stream is None else contextlib.nullcontext(stream)) as f:
        _total, count, dir_size = _header(f.read(_HEADER.size), path)
        dec = lzma.LZMADecompressor()
        out = b""
        try:
            while len(out) < dir_size:
                chunk = f.read(1 << 16)
                if not chunk:
                    break
                out += dec.decompress(chunk, max_length=dir_size - len(out))
                while len(out) < dir_size and not dec.needs_input and not dec.eof:
                    out += dec.decompress(b"", max_length=dir_size - len(out))
        except lzma.LZMAError as exc:
            raise ImageError(f"{path}: corrupt kernel package ({exc})") from None
    if len(out) < dir_size:
        raise ImageError(f"{path}: truncated kernel package directory")
    return [e for e, _ in _entries(out, count, path)]


def read_aks2_images(path: Path, data: bytes | None = None) -> dict[str, bytes]:
    """Every kernel image of one .aks2 package by its stem: the file at `path`, or `data` (a member
    of an image zip; `path` then only names it in messages). The decompressed size is bounded by
    the header's, itself at most MAX_PACKAGE_BYTES."""
    data = Path(path).read_bytes() if data is None else data
    total, count, dir_size = _header(data, path)
    if total > MAX_PACKAGE_BYTES:
        raise ImageError(f"{path}: kernel package claims {total} bytes")
    try:
        blob = lzma.LZMADecompressor().decompress(data[_HEADER.size:], max_length=total)
    except lzma.LZMAError as exc:
        raise ImageError(f"{path}: corrupt kernel package ({exc})") from None
    if len(blob) < dir_size:
        raise ImageError(f"{path}: truncated kernel package directory")
    return {e.name: blob[dir_size + off:dir_size + off + e.image_size] for e, off in _entries(blob[:dir_size], count, path)}


def verify_package(path: Path, stream: BinaryIO | None = None) -> int:
    """One .aks2 package (the file at `path`, or `stream`: a member of an image zip, `path` then
    only naming it) decompressed whole and kept nowhere (memory: one chunk): its xz stream ends
    and holds exactly the bytes its header gives (at most MAX_PACKAGE_BYTES), every kernel of its
    directory inside them. The number of kernels; ImageError otherwise."""
    step = 1 << 20
    with (open(path, "rb") if stream is None else contextlib.nullcontext(stream)) as f:
        total, count, dir_size = _header(f.read(_HEADER.size), path)
        if total > MAX_PACKAGE_BYTES or dir_size > total:
            raise ImageError(f"{path}: kernel package claims {total} bytes, its directory {dir_size}")
        dec, head, n = lzma.LZMADecompressor(), bytearray(), 0
        try:
            while not dec.eof:
                data = f.read(step)
                if not data and dec.needs_input:
                    break
                out = dec.decompress(data, max_length=step)
                while True:
                    n += len(out)
                    if n > total:
                        raise ImageError(f"{path}: kernel package holds more than the {total} bytes its header gives")
                    head += out[:max(0, dir_size - len(head))]
                    if dec.eof or dec.needs_input:
                        break
                    out = dec.decompress(b"", max_length=step)
        except lzma.LZMAError as exc:
            raise ImageError(f"{path}: corrupt kernel package ({exc})") from None
    if not dec.eof or n != total:
        why = "its xz stream does not end" if n == total else f"{n} of the {total} bytes its header gives"
        raise ImageError(f"{path}: truncated kernel package ({why})")
    entries = _entries(bytes(head), count, path)
    for e, off in entries:
        if off + e.image_size > total - dir_size:
            raise ImageError(f"{path}: kernel {e.name[:200]!r} lies outside the package")
    return len(entries)


def verify_images(images: Path) -> int:
    """Every kernel package below an images folder decompressed whole (`verify_package`): each
    `.aks2` file, and each AKS2 member of an image zip once the zip's CRCs hold. The kernels they
    hold; ImageError on the first that does not."""
    kernels = 0
    for path in sorted(p for p in Path(images).rglob("*") if p.is_file() and not p.is_symlink()):
        if path.name.endswith(".aks2"):
            kernels += verify_package(path)
        elif path.name.endswith(".zip"):
            with _open_zip(path) as z:
                bad = z.testzip()
                if bad is not None:
                    raise ImageError(f"{path}: member {bad} fails its CRC")
                for info in z.infolist():
                    if info.is_dir():
                        continue
                    with z.open(info) as f:
                        if f.read(len(AKS2_MAGIC)) != AKS2_MAGIC:
                            continue   # not a kernel package (read_zip_images skips it too)
                    with z.open(info) as f:
                        kernels += verify_package(Path(f"{path}:{info.filename}"), f)
    return kernels


def packed_kernels(images: Path) -> dict[KernelRef | ZipRef, PackedEntry]:
    """Every kernel packed below an images folder (an install's or an unpacked bundle's
    aotriton.images/), by the reference a dispatch table would give it: the `.aks2` packages'
    directories and the image zips' clusters' directories (only directories are decompressed)."""
    out: dict[KernelRef | ZipRef, PackedEntry] = {}
    for path in sorted(p for p in Path(images).rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(images).as_posix()
        if rel.endswith(".aks2"):
            out.update((KernelRef(rel.removesuffix(".aks2"), e.name), e) for e in read_aks2_directory(path))
        elif rel.endswith(".zip"):
            with _open_zip(path) as z:
                members = set(z.namelist())
            for member, entries in read_zip_clusters(path, members).items():
                out.update((ZipRef(rel, member, name), e) for name, e in entries.items())
    return out


def package_images(images: Path, file: str) -> dict[KernelRef | ZipRef, bytes]:
    """Every code object of one package below an images folder (`file`: a reference's `.file`, an
    `.aks2` package or an image zip), by reference."""
    path = Path(images) / file
    if file.endswith(".zip"):
        return {ZipRef(file, member, name): image
                for member, found in read_zip_images(path).items() for name, image in found.items()}
    return {KernelRef(file.removesuffix(".aks2"), name): image for name, image in read_aks2_images(path).items()}


_LIB_PATH_RE = re.compile(rb"(?<![^\x00])amd-[A-Za-z0-9_]{1,32}/[^\x00\s]{1,400}(?=\x00)")
_LIB_MEMBER_RE = re.compile(rb"(?<![^\x00])[A-Z][A-Za-z_]{0,31}='\*[^\x00\s]{1,400}(?=\x00)")


@dataclass(frozen=True)
class LibraryRefs:
    """What a library's dispatch tables name, below aotriton.images/: `.aks2` packages (0.11b-0.12.1b,
    with the suffix), image zips (0.13b+) and the zip members (0.13b+: functionals, `Q='*fp16:16';…`)."""

    packages: frozenset[str]
    zips: frozenset[str]
    members: frozenset[str]


def library_references(data: bytes, pack: str) -> LibraryRefs:
    """The image packages a built AOTriton library names for the images folder `pack` (e.g.
    `amd-gfx908`), read from its bytes (see the module doc). A string that is not text is skipped."""
    def texts(rx: re.Pattern) -> set[str]:
        out = set()
        for m in rx.finditer(data):
            with contextlib.suppress(UnicodeDecodeError):
                out.add(m.group().decode("utf-8"))
        return out

    paths, members = texts(_LIB_PATH_RE), texts(_LIB_MEMBER_RE)
    mine = {p for p in paths if p.startswith(pack + "/")}
    return LibraryRefs(packages=frozenset(p + ".aks2" for p in mine if p.count("/") == 3 and not p.endswith(".zip")),
                       zips=frozenset(p for p in mine if p.endswith(".zip")), members=frozenset(members))
