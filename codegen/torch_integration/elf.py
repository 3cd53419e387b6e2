"""A small ELF reader: what the dynamic linker sees of a shared library.

Only what `torch install` needs: DT_NEEDED / DT_SONAME / DT_RPATH / DT_RUNPATH of the dynamic
section, and the defined and undefined symbols of the dynamic symbol table. ELF32/ELF64, little
and big endian. Section headers are used when present; without them (stripped with sstrip) the
dynamic section is found through the PT_DYNAMIC program header (symbols then need DT_HASH or
DT_GNU_HASH to be counted, and are read the same way).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError

# e_ident
_ELFMAG = b"\x7fELF"
_ELFCLASS32, _ELFCLASS64 = 1, 2
_ELFDATA2LSB, _ELFDATA2MSB = 1, 2

# section types
_SHT_DYNSYM = 11
_SHT_DYNAMIC = 6

# program header types
_PT_LOAD = 1
_PT_DYNAMIC = 2

# dynamic tags
DT_NULL = 0
DT_NEEDED = 1
DT_HASH = 4
DT_STRTAB = 5
DT_SYMTAB = 6
DT_STRSZ = 10
DT_SYMENT = 11
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29
DT_GNU_HASH = 0x6FFFFEF5

_SHN_UNDEF = 0
_STB_LOCAL = 0
_STT_SECTION = 3
_STT_FILE = 4


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


class _Reader:
    def __init__(self, data: bytes, path: str):
        self.data = data
        self.path = path
        if len(data) < 16 or data[:4] != _ELFMAG:
            raise ElfError(f"{path}: not an ELF file")
        cls, enc = data[4], data[5]
        if cls not in (_ELFCLASS32, _ELFCLASS64) or enc not in (_ELFDATA2LSB, _ELFDATA2MSB):
            raise ElfError(f"{path}: unsupported ELF class/encoding ({cls}/{enc})")
        self.is64 = cls == _ELFCLASS64
        self.end = "<" if enc == _ELFDATA2LSB else ">"

    def unpack(self, fmt: str, off: int) -> tuple:
        size = struct.calcsize(self.end + fmt)
        if off < 0 or off + size > len(self.data):
            raise ElfError(f"{self.path}: truncated ELF file (read at {off:#x} past the end)")
        return struct.unpack_from(self.end + fmt, self.data, off)

    def cstr(self, off: int) -> str:
        if off < 0 or off >= len(self.data):
            raise ElfError(f"{self.path}: string offset {off:#x} outside the file")
        end = self.data.find(b"\0", off)
        if end < 0:
            raise ElfError(f"{self.path}: unterminated string at {off:#x}")
        return self.data[off:end].decode("utf-8", errors="surrogateescape")

    # --- headers ---------------------------------------------------------------------------
    def header(self) -> dict:
        if self.is64:
            (_type, _mach, _ver, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
             shentsize, shnum, shstrndx) = self.unpack("HHIQQQIHHHHHH", 16)
        else:
            (_type, _mach, _ver, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
             shentsize, shnum, shstrndx) = self.unpack("HHIIIIIHHHHHH", 16)
        return dict(phoff=phoff, shoff=shoff, phentsize=phentsize, phnum=phnum,
                    shentsize=shentsize, shnum=shnum, shstrndx=shstrndx)

    def sections(self, h: dict) -> list[dict]:
        out = []
        if not h["shoff"]:
            return out
        shnum = h["shnum"]
        if shnum == 0:  # extended numbering: the count lives in section 0's sh_size
            shnum = self._section(h, 0)["size"]
        for i in range(shnum):
            out.append(self._section(h, i))
        return out

    def _section(self, h: dict, i: int) -> dict:
        off = h["shoff"] + i * h["shentsize"]
        if self.is64:
            name, typ, _flags, addr, offset, size, link, _info, _align, entsize = self.unpack(
                "IIQQQQIIQQ", off)
        else:
            name, typ, _flags, addr, offset, size, link, _info, _align, entsize = self.unpack(
                "IIIIIIIIII", off)
        return dict(name=name, type=typ, addr=addr, offset=offset, size=size, link=link,
                    entsize=entsize)

    def segments(self, h: dict) -> list[dict]:
        out = []
        for i in range(h["phnum"]):
            off = h["phoff"] + i * h["phentsize"]
            if self.is64:
                typ, _flags, offset, vaddr, _paddr, filesz, _memsz, _align = self.unpack(
                    "IIQQQQQQ", off)
            else:
                typ, offset, vaddr, _paddr, filesz, _memsz, _flags, _align = self.unpack(
                    "IIIIIIII", off)
            out.append(dict(type=typ, offset=offset, vaddr=vaddr, filesz=filesz))
        return out

    # --- dynamic section and symbols --------------------------------------------------------
    def dyn_entries(self, offset: int, size: int) -> list[tuple[int, int]]:
        entsize = 16 if self.is64 else 8
        fmt = "qQ" if self.is64 else "iI"
        out = []
        for i in range(size // entsize):
            tag, val = self.unpack(fmt, offset + i * entsize)
            if tag == DT_NULL:
                break
            out.append((tag, val))
        return out

    def symbols(self, offset: int, count: int, strtab_off: int) -> tuple[set[str], set[str]]:
        defined: set[str] = set()
        undefined: set[str] = set()
        entsize = 24 if self.is64 else 16
        for i in range(1, count):  # entry 0 is the null symbol
            off = offset + i * entsize
            if self.is64:
                name, info, _other, shndx, _value, _size = self.unpack("IBBHQQ", off)
            else:
                name, _value, _size, info, _other, shndx = self.unpack("IIIBBH", off)
            bind, typ = info >> 4, info & 0xF
            if not name or typ in (_STT_SECTION, _STT_FILE):
                continue
            sym = self.cstr(strtab_off + name)
            if shndx == _SHN_UNDEF:
                undefined.add(sym)
            elif bind != _STB_LOCAL:
                defined.add(sym)
        return defined, undefined


def _vaddr_to_offset(segments: list[dict], vaddr: int, path: str) -> int:
    for seg in segments:
        if seg["type"] == _PT_LOAD and seg["vaddr"] <= vaddr < seg["vaddr"] + seg["filesz"]:
            return seg["offset"] + (vaddr - seg["vaddr"])
    raise ElfError(f"{path}: address {vaddr:#x} is in no loaded segment")


def _count_from_hash(r: _Reader, segments: list[dict], tags: dict[int, int]) -> int:
    if DT_HASH in tags:
        off = _vaddr_to_offset(segments, tags[DT_HASH], r.path)
        _nbucket, nchain = r.unpack("II", off)
        return nchain
    if DT_GNU_HASH in tags:
        off = _vaddr_to_offset(segments, tags[DT_GNU_HASH], r.path)
        nbuckets, symoffset, bloom_size, _shift = r.unpack("IIII", off)
        words = off + 16 + bloom_size * (8 if r.is64 else 4)
        buckets = [r.unpack("I", words + 4 * i)[0] for i in range(nbuckets)]
        last = max(buckets, default=0)
        if last < symoffset:
            return symoffset
        chain = words + 4 * nbuckets
        while True:
            (h,) = r.unpack("I", chain + 4 * (last - symoffset))
            last += 1
            if h & 1:
                return last
    return 0


def read_dynamic(path: Path | str) -> DynamicInfo:
    """DT_NEEDED, SONAME, RPATH/RUNPATH and dynamic symbols of an ELF file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ElfError(f"{p}: cannot read ({exc.strerror})") from None
    r = _Reader(data, str(p))
    h = r.header()
    sections = r.sections(h)
    segments = r.segments(h)

    dyn = next((s for s in sections if s["type"] == _SHT_DYNAMIC), None)
    if dyn is not None:
        entries = r.dyn_entries(dyn["offset"], dyn["size"])
        dynstr_off = sections[dyn["link"]]["offset"] if dyn["link"] < len(sections) else None
    else:
        pdyn = next((s for s in segments if s["type"] == _PT_DYNAMIC), None)
        if pdyn is None:
            raise ElfError(f"{p}: no dynamic section (a static executable or object file?)")
        entries = r.dyn_entries(pdyn["offset"], pdyn["filesz"])
        dynstr_off = None
    tags = {t: v for t, v in entries if t not in (DT_NEEDED, DT_RPATH, DT_RUNPATH)}
    if dynstr_off is None:
        if DT_STRTAB not in tags:
            raise ElfError(f"{p}: dynamic section without DT_STRTAB")
        dynstr_off = _vaddr_to_offset(segments, tags[DT_STRTAB], str(p))

    needed = tuple(r.cstr(dynstr_off + v) for t, v in entries if t == DT_NEEDED)
    soname = next((r.cstr(dynstr_off + v) for t, v in entries if t == DT_SONAME), None)
    rpath = tuple(x for t, v in entries if t == DT_RPATH for x in r.cstr(dynstr_off + v).split(":") if x)
    runpath = tuple(x for t, v in entries if t == DT_RUNPATH for x in r.cstr(dynstr_off + v).split(":") if x)

    defined: set[str] = set()
    undefined: set[str] = set()
    dynsym = next((s for s in sections if s["type"] == _SHT_DYNSYM), None)
    if dynsym is not None:
        entsize = dynsym["entsize"] or (24 if r.is64 else 16)
        strtab = sections[dynsym["link"]]["offset"]
        defined, undefined = r.symbols(dynsym["offset"], dynsym["size"] // entsize, strtab)
    elif DT_SYMTAB in tags:
        count = _count_from_hash(r, segments, tags)
        symoff = _vaddr_to_offset(segments, tags[DT_SYMTAB], str(p))
        defined, undefined = r.symbols(symoff, count, dynstr_off)
    return DynamicInfo(
        path=str(p),
        needed=needed,
        soname=soname,
        rpath=rpath,
        runpath=runpath,
        defined=frozenset(defined),
        undefined=frozenset(undefined),
    )
