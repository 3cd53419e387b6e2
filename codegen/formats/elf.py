"""The one ELF reader (pyelftools): what the dynamic linker sees of a shared library, and what a
GPU runtime reads of an AMDGPU code object.

Host libraries (`read_dynamic`): DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH, the defined and
undefined symbols of the dynamic symbol table, and the GNU symbol versions: the version nodes a
library requires from each file it needs (`.gnu.version_r`), the nodes it defines
(`.gnu.version_d`) and the node each imported symbol is bound to (`.gnu.version`). Without
section headers (stripped with sstrip) the dynamic segment still gives the tags and the symbols
(pyelftools counts them through DT_HASH / DT_GNU_HASH); symbol versions then read as none.

AMDGPU code objects (`read_code_object`): the target from `e_flags` (the EF_AMDGPU_MACH value and
the xnack/sramecc feature bits of code object v4+), the kernel symbols, and the metadata note
(NT_AMDGPU_METADATA, msgpack: `amdhsa.target`, `amdhsa.kernels[]` with `.kernarg_segment_size`,
`.max_flat_workgroup_size`, `.wavefront_size`, ...), what a GPU loads of it (`loaded_sections`)
and its sha256 (`loaded_digest`), and how far it reaches from its first byte (`elf_extent`).

Every file that is not ELF is one ElfError "not an ELF file"; every one pyelftools cannot read
is one ElfError "truncated or corrupt ELF file (<why>)".
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
from elftools.common.exceptions import ELFError as _PyElfError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.dynamic import DynamicSection, DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection, GNUVerSymSection

from codegen.core.errors import UserError
from codegen.core.fsutil import open_input

EM_AMDGPU = 224
NT_AMDGPU_METADATA = 32
# e_flags of AMDGPU code objects (LLVM's ELF.h)
EF_AMDGPU_MACH = 0x0FF
EF_AMDGPU_FEATURE_XNACK_V4 = 0x300
EF_AMDGPU_FEATURE_SRAMECC_V4 = 0xC00
_FEATURE_V4 = {0x000: None, 0x100: "any", 0x200: "off", 0x300: "on"}  # unsupported/any/off/on, xnack
# EF_AMDGPU_MACH values of the GPUs mi100-codegen targets and their donors (LLVM's ELF.h)
AMDGPU_MACH = {
    "gfx900": 0x2C, "gfx906": 0x2F, "gfx908": 0x30, "gfx90a": 0x3F, "gfx90c": 0x32,
    "gfx940": 0x40, "gfx941": 0x4B, "gfx942": 0x4C, "gfx950": 0x4F,
    "gfx1010": 0x33, "gfx1030": 0x36, "gfx1031": 0x37, "gfx1032": 0x38, "gfx1034": 0x3E,
    "gfx1035": 0x3D, "gfx1036": 0x45, "gfx1100": 0x41, "gfx1101": 0x46, "gfx1102": 0x47,
    "gfx1200": 0x48, "gfx1201": 0x4E,
}
_MACH_NAME = {v: k for k, v in AMDGPU_MACH.items()}
SHT_NOBITS = 8
ELF_LIMIT = 1 << 40   # bytes of a file read_dynamic opens: read in pieces, never whole
# what pyelftools (and msgpack, for the metadata note) raise on a truncated or corrupt file
_READ_ERRORS = (_PyElfError, ValueError, OSError, KeyError, TypeError, AttributeError, IndexError,
                struct.error, msgpack.UnpackException)
_VERSION_RE = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC)_(\d+(?:\.\d+)*)$")


class ElfError(UserError):
    """Not an ELF file, or one we cannot read."""


@dataclass(frozen=True)
class DynamicInfo:
    """What the dynamic linker reads of one ELF file."""

    path: str
    needed: tuple[str, ...]
    soname: str | None
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    defined: frozenset[str] = field(repr=False)
    undefined: frozenset[str] = field(repr=False)
    # file -> version nodes required from it (.gnu.version_r), in file order
    version_needs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the version nodes this file defines (.gnu.version_d), its own name excluded
    version_defs: tuple[str, ...] = ()
    # imported symbol -> the version node it is bound to (versioned imports only)
    import_versions: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # defined symbol -> its version node (versioned exports only)
    export_versions: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def highest(self, family: str) -> str | None:
        """The highest `FAMILY_x.y` version node required (GLIBC, GLIBCXX, CXXABI, GCC), or None."""
        best: tuple[int, ...] | None = None
        for _f, vs in self.version_needs:
            for v in vs:
                m = _VERSION_RE.match(v)
                if m and m[1] == family:
                    key = tuple(int(x) for x in m[2].split("."))
                    best = key if best is None or key > best else best
        return None if best is None else f"{family}_{'.'.join(map(str, best))}"


def version_key(node: str) -> tuple[int, ...]:
    """`GLIBC_2.34` -> (2, 34); a node without a dotted number sorts first."""
    m = _VERSION_RE.match(node)
    return tuple(int(x) for x in m[2].split(".")) if m else ()


@contextlib.contextmanager
def _reading(what: str):
    """One message for a file pyelftools cannot read."""
    try:
        yield
    except _READ_ERRORS as exc:
        raise ElfError(f"{what}: truncated or corrupt ELF file ({type(exc).__name__}: {exc})") from None


def _open(data: bytes | BinaryIO, path: str) -> ELFFile:
    stream = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    stream.seek(0)
    if stream.read(4) != b"\x7fELF" or len(stream.read(12)) < 12:
        raise ElfError(f"{path}: not an ELF file")
    with _reading(path):
        return ELFFile(stream)


def _split(s: str) -> tuple[str, ...]:
    return tuple(x for x in s.split(":") if x)


def parse_dynamic(data: bytes | BinaryIO, path: str = "<bytes>") -> DynamicInfo:
    """`read_dynamic` of bytes already read (or of a seekable binary stream)."""
    elf = _open(data, path)
    with _reading(path):
        return _dynamic(elf, path)


def _dynamic(elf: ELFFile, path: str) -> DynamicInfo:
    dyn = _dynamic_table(elf, path)
    needed, soname, rpath, runpath = _dynamic_tags(dyn)
    versym, verneed, verdef, dynsym = _version_sections(elf)
    symbols = list(dynsym.iter_symbols()) if dynsym is not None else list(
        dyn.iter_symbols() if isinstance(dyn, DynamicSegment) else ())
    names, needs, defs = _version_nodes(verneed, verdef)
    defined, undefined, imports, exports = _dynamic_symbols(symbols, versym, names)
    return DynamicInfo(
        path=path,
        needed=tuple(needed),
        soname=soname,
        rpath=rpath,
        runpath=runpath,
        defined=frozenset(defined),
        undefined=frozenset(undefined),
        version_needs=tuple(needs),
        version_defs=tuple(defs),
        import_versions=tuple(sorted(imports.items())),
        export_versions=tuple(sorted(exports.items())),
    )


def _dynamic_table(elf: ELFFile, path: str) -> DynamicSection | DynamicSegment:
    """The dynamic section, or the dynamic segment of a file without section headers."""
    dyn: DynamicSection | DynamicSegment | None = None
    if elf.num_sections():
        dyn = next((s for s in elf.iter_sections() if isinstance(s, DynamicSection)), None)
    if dyn is None:
        dyn = next((s for s in elf.iter_segments() if isinstance(s, DynamicSegment)), None)
    if dyn is None:
        raise ElfError(f"{path}: no dynamic section (a static executable or object file?)")
    return dyn


def _dynamic_tags(dyn: DynamicSection | DynamicSegment
                  ) -> tuple[list[str], str | None, tuple[str, ...], tuple[str, ...]]:
    """DT_NEEDED (in order), DT_SONAME, DT_RPATH and DT_RUNPATH."""
    needed: list[str] = []
    soname = None
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    for tag in dyn.iter_tags():
        t = tag.entry.d_tag
        if t == "DT_NEEDED":
            needed.append(tag.needed)
        elif t == "DT_SONAME":
            soname = tag.soname
        elif t == "DT_RPATH":
            rpath += _split(tag.rpath)
        elif t == "DT_RUNPATH":
            runpath += _split(tag.runpath)
    return needed, soname, rpath, runpath


def _version_sections(elf: ELFFile) -> tuple[Any, Any, Any, Any]:
    """The `.gnu.version`, `.gnu.version_r`, `.gnu.version_d` and `.dynsym` sections (None where
    absent, all None without section headers)."""
    versym = verneed = verdef = None
    dynsym = None
    for sec in elf.iter_sections() if elf.num_sections() else ():
        if isinstance(sec, GNUVerSymSection):
            versym = sec
        elif isinstance(sec, GNUVerNeedSection):
            verneed = sec
        elif isinstance(sec, GNUVerDefSection):
            verdef = sec
        elif sec.header.sh_type == "SHT_DYNSYM":
            dynsym = sec
    return versym, verneed, verdef, dynsym


def _version_nodes(verneed: GNUVerNeedSection | None, verdef: GNUVerDefSection | None
                   ) -> tuple[dict[int, str], list[tuple[str, tuple[str, ...]]], list[str]]:
    """Version index -> node name, the nodes required from each needed file, the nodes defined
    (the file's own name excluded)."""
    names: dict[int, str] = {}
    needs: list[tuple[str, tuple[str, ...]]] = []
    defs: list[str] = []
    if verneed is not None:
        for vn, auxs in verneed.iter_versions():
            vs = []
            for aux in auxs:
                names[aux.entry.vna_other & 0x7FFF] = aux.name
                vs.append(aux.name)
            needs.append((vn.name, tuple(vs)))
    if verdef is not None:
        for vd, auxs in verdef.iter_versions():
            aux = next(iter(auxs), None)
            if aux is None:
                continue
            names[vd.entry.vd_ndx] = aux.name
            if not vd.entry.vd_flags & 0x1:  # VER_FLG_BASE: the file's own name
                defs.append(aux.name)
    return names, needs, defs


def _dynamic_symbols(symbols: list, versym: GNUVerSymSection | None, names: dict[int, str]
                     ) -> tuple[set[str], set[str], dict[str, str], dict[str, str]]:
    """The defined and undefined dynamic symbols, and the version node of each versioned import
    and export."""
    defined: set[str] = set()
    undefined: set[str] = set()
    imports: dict[str, str] = {}
    exports: dict[str, str] = {}
    for i, sym in enumerate(symbols):
        if i == 0 or not sym.name or sym["st_info"]["type"] in ("STT_SECTION", "STT_FILE"):
            continue
        und = sym["st_shndx"] == "SHN_UNDEF"
        if not und and sym["st_info"]["bind"] == "STB_LOCAL":
            continue
        node = None
        if versym is not None and i < versym.num_symbols():
            ndx = versym.get_symbol(i).entry["ndx"]
            ndx = ndx if isinstance(ndx, int) else 0  # VER_NDX_LOCAL / VER_NDX_GLOBAL come as names
            node = names.get(ndx & 0x7FFF) if (ndx & 0x7FFF) > 1 else None
        if node == sym.name and sym["st_shndx"] == "SHN_ABS":
            continue  # the absolute symbol the linker emits for each version node it defines
        (undefined if und else defined).add(sym.name)
        if node is not None:
            (imports if und else exports)[sym.name] = node
    return defined, undefined, imports, exports


def read_dynamic(path: Path | str) -> DynamicInfo:
    """DT_NEEDED, SONAME, RPATH/RUNPATH, dynamic symbols and symbol versions of an ELF file."""
    p = Path(path)
    try:   # streamed: torch's libraries are up to a few GB; a FIFO, device or folder is one ElfError
        stream = open_input(p, what="ELF file", limit=ELF_LIMIT)
    except UserError as exc:
        raise ElfError(str(exc)) from None
    with stream:
        return parse_dynamic(stream, str(p))


# --- AMDGPU code objects -------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeObject:
    """What a GPU runtime checks of an AMDGPU code object before it launches from it."""

    arch: str | None                 # from EF_AMDGPU_MACH (None: a mach value we do not name)
    mach: int
    xnack: str | None                # "on" / "off" / "any" / None (unsupported by the target)
    sramecc: str | None
    target: str | None               # the metadata's amdhsa.target, e.g. amdgcn-amd-amdhsa--gfx908:sramecc+:xnack-
    kernels: dict[str, dict[str, Any]] = field(repr=False)   # kernel name -> its amdhsa.kernels entry
    symbols: frozenset[str] = field(repr=False)              # every defined symbol of .symtab/.dynsym
    text_bytes: int = 0                                      # size of the `.text` section

    def features(self) -> dict[str, str]:
        """The features the code object fixes (`on`/`off`), by name: what `target_id` spells."""
        return {k: v for k, v in (("sramecc", self.sramecc), ("xnack", self.xnack)) if v in ("on", "off")}

    def target_id(self) -> str:
        """The target the way ROCm spells it: `gfx908:sramecc+:xnack-` (features the target has)."""
        out = self.arch or f"mach{self.mach:#x}"
        for name, v in (("sramecc", self.sramecc), ("xnack", self.xnack)):
            if v in ("on", "off"):
                out += f":{name}{'+' if v == 'on' else '-'}"
        return out


AMDHSA_TRIPLE = "amdgcn-amd-amdhsa--"  # the prefix of the metadata note's `amdhsa.target`


def parse_target_id(text: str) -> tuple[str, dict[str, str]]:
    """A target as ROCm spells it (`gfx908`, `gfx908:sramecc+:xnack-`, with or without the
    metadata note's `amdgcn-amd-amdhsa--` prefix) -> (processor, {feature: "on"/"off"}); a
    feature left out is "any". ValueError for a feature spelt otherwise or named twice."""
    parts = text.removeprefix(AMDHSA_TRIPLE).split(":")
    feats: dict[str, str] = {}
    for f in parts[1:]:
        if len(f) < 2 or f[-1] not in "+-" or f[:-1] in feats:
            raise ValueError(f"{text!r}: {f!r} is not a target feature spelt NAME+ or NAME-, once")
        feats[f[:-1]] = "on" if f[-1] == "+" else "off"
    return parts[0], feats


def _note_metadata(sec, meta: dict) -> None:
    """The AMDGPU metadata notes of one note section, merged into `meta`."""
    for note in sec.iter_notes():
        if note["n_name"] == "AMDGPU" and note["n_type"] in (NT_AMDGPU_METADATA, "NT_AMDGPU_METADATA"):
            m = msgpack.unpackb(bytes(note["n_descdata"]), raw=False, strict_map_key=False)
            if isinstance(m, dict):
                meta.update(m)


def _metadata(elf: ELFFile) -> dict:
    meta: dict = {}
    for sec in elf.iter_sections():
        if sec.header.sh_type == "SHT_NOTE":
            _note_metadata(sec, meta)
    return meta


def amdgpu_metadata(image: bytes, what: str = "code object") -> dict:
    """The AMDGPU metadata note of a code object (the msgpack map; {} when it has none), without
    checking the machine (`read_code_object` does)."""
    elf = _open(image, what)
    with _reading(what):
        return _metadata(elf)


def text_size(image: bytes) -> int:
    """Size of the `.text` section of a code object (0 when unreadable or absent)."""
    try:
        elf = _open(image, "code object")
        with _reading("code object"):
            sec = elf.get_section_by_name(".text")
    except ElfError:
        return 0
    return int(sec.header.sh_size) if sec is not None else 0


def read_code_object(image: bytes, what: str = "code object") -> CodeObject:
    """Parse an AMDGPU code object; ElfError when it is not one (another machine, no metadata)."""
    elf = _open(image, what)
    with _reading(what):
        if elf["e_machine"] != "EM_AMDGPU" and elf.header.e_machine != EM_AMDGPU:
            raise ElfError(f"{what}: not an AMDGPU code object (e_machine {elf['e_machine']})")
        flags = int(elf.header.e_flags)
        mach = flags & EF_AMDGPU_MACH
        xnack = _FEATURE_V4[flags & EF_AMDGPU_FEATURE_XNACK_V4]
        sramecc = _FEATURE_V4[(flags & EF_AMDGPU_FEATURE_SRAMECC_V4) >> 2]
        meta: dict = {}
        symbols: set[str] = set()
        text_bytes = 0
        for sec in elf.iter_sections():  # one pass: the kernel cache reads every entry it serves
            kind = sec.header.sh_type
            if kind == "SHT_NOTE":
                _note_metadata(sec, meta)
            elif kind in ("SHT_SYMTAB", "SHT_DYNSYM"):
                for sym in sec.iter_symbols():
                    if sym.name and sym["st_shndx"] != "SHN_UNDEF":
                        symbols.add(sym.name)
            if sec.name == ".text" and not text_bytes:
                text_bytes = int(sec.header.sh_size)
    kernels = {k.get(".name"): k for k in meta.get("amdhsa.kernels", []) if isinstance(k, dict)}
    target = meta.get("amdhsa.target")
    return CodeObject(arch=_MACH_NAME.get(mach), mach=mach, xnack=xnack, sramecc=sramecc,
                      target=target if isinstance(target, str) else None,
                      kernels=kernels, symbols=frozenset(symbols), text_bytes=text_bytes)


def loaded_sections(image: bytes, what: str = "code object") -> dict[str, bytes]:
    """What a GPU loader uses of a code object, by name: `header` (the OS ABI and its version,
    e_machine and e_flags: the target and its features), then every section it maps (SHF_ALLOC: `.text`,
    `.rodata`, `.dynsym`, `.dynamic`, …) as its bytes, a note section as its AMDGPU notes only
    (the metadata note the runtime reads; it ignores other owners' notes) and a NOBITS one as its
    size. Not the DWARF and symbol tables, which name the folders the kernel and Triton were
    compiled from: equal for the same kernel compiled from two trees."""
    elf = _open(image, what)
    out: dict[str, bytes] = {}
    with _reading(what):
        # EI_OSABI, EI_ABIVERSION (the code object version), e_machine (as the file spells them), e_flags
        out["header"] = bytes(image[7:9]) + bytes(image[0x12:0x14]) + int(elf.header.e_flags).to_bytes(4, "little")
        for sec in elf.iter_sections():
            if not sec["sh_flags"] & SH_FLAGS.SHF_ALLOC:
                continue
            if sec["sh_type"] == "SHT_NOBITS":
                data = int(sec["sh_size"]).to_bytes(8, "little")
            elif sec["sh_type"] == "SHT_NOTE":
                data = b"".join(str(n["n_type"]).encode() + b"\0" + bytes(n["n_descdata"])
                                for n in sec.iter_notes() if n["n_name"] == "AMDGPU")
            else:
                data = sec.data()
            name = sec.name if sec.name not in out else f"{sec.name}#{len(out)}"
            out[name] = data
    return out


def loaded_digest(image: bytes, what: str = "code object") -> str:
    """sha256 over `loaded_sections`: the same for the same kernel compiled from two trees."""
    h = hashlib.sha256()
    for name, data in loaded_sections(image, what).items():
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def elf_extent(image: bytes) -> int:
    """How far an ELF64 image reaches, computed as the stub computes it from the pointer it is
    given (the header tables and every section with file contents): the bytes it hashes. The
    stub's arithmetic (ship/stub/hip_stub.c) over the raw headers, not pyelftools: it must reach
    the same bytes for a malformed image too (0 for one that is not ELF)."""
    if len(image) < 64 or image[:4] != b"\x7fELF":
        return 0
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
    for i in range(shnum):
        off = shoff + i * shentsize
        if off + 0x28 > len(image):
            break
        typ = struct.unpack_from("<I", image, off + 4)[0]
        s_off, s_size = struct.unpack_from("<QQ", image, off + 0x18)
        if typ != SHT_NOBITS and s_off + s_size > end and s_off + s_size < (1 << 30):
            end = s_off + s_size
    return end


# --- what a loader places in device memory (the emulator's loader, codegen.emulate) --------------
IMAGE_LIMIT = 256 << 20   # bytes: the loaded extent of one code object (AOTriton's largest is ~2 MB)
KD_SIZE = 64              # an AMDHSA kernel descriptor (llvm/Support/AMDHSAKernelDescriptor.h)


@dataclass(frozen=True)
class KernelDescriptor:
    """The fields of an AMDHSA kernel descriptor (`<kernel>.kd`) a dispatch reads, and where the
    kernel lies in the loaded image (virtual addresses: the image's first byte is 0)."""

    name: str
    entry: int                       # the first instruction
    text: tuple[int, int]            # [start, end) of the executable segment holding `entry`
    group_segment_fixed_size: int    # static LDS bytes
    private_segment_fixed_size: int  # scratch bytes per work-item
    kernarg_size: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    properties: int                  # kernel_code_properties (which user SGPRs are set up)


def loaded_image(image: bytes, what: str = "code object") -> bytes:
    """The code object as a loader lays it out: every PT_LOAD segment's file bytes at its virtual
    address, zeros elsewhere (the extent bounded by IMAGE_LIMIT)."""
    elf = _open(image, what)
    with _reading(what):
        segs = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        end = max((int(s["p_vaddr"]) + int(s["p_memsz"]) for s in segs), default=0)
        if not segs or end > IMAGE_LIMIT or any(s["p_filesz"] > s["p_memsz"] for s in segs):
            raise ElfError(f"{what}: no loadable segments, or they reach past {IMAGE_LIMIT >> 20} MiB")
        out = bytearray(end)
        for s in segs:
            data = s.data()
            if len(data) != s["p_filesz"]:
                raise ElfError(f"{what}: truncated or corrupt ELF file (a segment ends past the file)")
            out[int(s["p_vaddr"]):int(s["p_vaddr"]) + len(data)] = data
    return bytes(out)


def kernel_descriptor(image: bytes, loaded: bytes, name: str, what: str = "code object") -> KernelDescriptor:
    """Kernel `name`'s descriptor, read from `loaded` (`loaded_image(image)`) where the symbol
    `<name>.kd` points; ElfError when it is missing, or when the entry it names is not inside an
    executable segment."""
    elf = _open(image, what)
    with _reading(what):
        sym = None
        for sec in elf.iter_sections():
            if sec.header.sh_type in ("SHT_SYMTAB", "SHT_DYNSYM"):
                sym = next((s for s in sec.iter_symbols() if s.name == f"{name}.kd"), sym)
        execs = [(int(s["p_vaddr"]), int(s["p_vaddr"]) + int(s["p_filesz"])) for s in elf.iter_segments()
                 if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1]
    if sym is None:
        raise ElfError(f"{what}: no kernel descriptor {name}.kd")
    kd = int(sym["st_value"])
    if kd < 0 or kd + KD_SIZE > len(loaded):
        raise ElfError(f"{what}: {name}.kd lies outside the loaded image")
    (group, private, kernarg, _pad, entry_off) = struct.unpack_from("<IIIIq", loaded, kd)
    rsrc3, rsrc1, rsrc2, props = struct.unpack_from("<IIIH", loaded, kd + 44)
    entry = kd + entry_off
    text = next(((lo, hi) for lo, hi in execs if lo <= entry < hi), None)
    if text is None or entry % 4:
        raise ElfError(f"{what}: {name}'s entry {entry:#x} is not an instruction of an executable segment")
    return KernelDescriptor(name=name, entry=entry, text=text, group_segment_fixed_size=group,
                            private_segment_fixed_size=private, kernarg_size=kernarg, rsrc1=rsrc1,
                            rsrc2=rsrc2, rsrc3=rsrc3, properties=props)

