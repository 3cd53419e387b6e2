"""Device memory for the emulator: one bounded block backed by a file, so that another process
(the Machine's child, the C++ dispatch driver) maps the same bytes.

Kernels see the block at `device_base`; a process that maps the file elsewhere translates
(`address - device_base` is the offset in the file). The first `LAUNCH_BYTES` belong to the Machine
(the dispatch packet, the queue and the kernarg segment of the launch it runs); `alloc` hands out
what follows, and so must any other allocator of the same file (`heap_base`). Nothing a kernel
does reaches outside the block: every global access is checked against it (codegen.emulate.guard).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from codegen.core.errors import UserError

DEFAULT_DEVICE_BASE = 0x2000_0000_0000   # 32 TiB: free in a Linux process's address space, 2 MiB aligned
CODE_BASE = 0x1000_0000_0000             # where kernels see their code object's image (no arena may overlap it)
SCRATCH_APERTURE = 0x7000_0000_0000      # the private segment buffer's base: [this, +2**40) is the wave's scratch
LAUNCH_BYTES = 128 << 10                 # the Machine's launch area at the start of the block
MAX_BYTES = 64 << 30                     # the file is sparse: only what is written takes disk
PAGE = mmap.PAGESIZE


class ArenaFull(UserError):
    """`alloc` asked for more than the arena has left."""


class Arena:
    """A file of `size` bytes mapped shared; kernels see it at `device_base`. Use `create` (a new
    file) or `open` (one another process made), then `read`/`write`/`alloc`; `close` unmaps."""

    def __init__(self, path: Path, fd: int, size: int, device_base: int):
        self.path, self.fd, self.size, self.device_base = path, fd, size, device_base
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.heap_base = device_base + LAUNCH_BYTES
        self._next = self.heap_base

    @classmethod
    def create(cls, path: str | Path, size: int, *, device_base: int = DEFAULT_DEVICE_BASE) -> "Arena":
        """A new file at `path` (refused if it exists), `size` bytes rounded up to a page."""
        size = -(-size // PAGE) * PAGE
        if not LAUNCH_BYTES < size <= MAX_BYTES:
            raise UserError(f"arena size {size}: must be above {LAUNCH_BYTES} and at most {MAX_BYTES} bytes")
        if device_base % PAGE or device_base <= 0 or device_base + size >= 1 << 47:
            raise UserError(f"arena device base {device_base:#x}: must be page-aligned, below 2**47 with its size")
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise UserError(f"{path}: cannot create the arena file ({exc.strerror or exc})") from None
        try:
            os.ftruncate(fd, size)
            return cls(path, fd, size, device_base)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise

    @classmethod
    def open(cls, path: str | Path, *, device_base: int = DEFAULT_DEVICE_BASE) -> "Arena":
        """An arena file another process made (its size is the file's)."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise UserError(f"{path}: cannot open the arena file ({exc.strerror or exc})") from None
        if not LAUNCH_BYTES < size <= MAX_BYTES or size % PAGE:
            os.close(fd)
            raise UserError(f"{path}: {size} bytes is no arena (page-sized, above {LAUNCH_BYTES})")
        return cls(path, fd, size, device_base)

    def offset(self, addr: int, n: int) -> int:
        """The file offset of device bytes [addr, addr+n); ValueError when any lies outside."""
        off = addr - self.device_base
        if n < 0 or off < 0 or off + n > self.size:
            raise ValueError(f"device bytes [{addr:#x}, +{n}) lie outside the arena "
                             f"[{self.device_base:#x}, +{self.size:#x})")
        return off

    def read(self, addr: int, n: int) -> bytes:
        off = self.offset(addr, n)
        return self.map[off:off + n]

    def write(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        off = self.offset(addr, len(data))
        self.map[off:off + len(data)] = bytes(data)

    def alloc(self, n: int, align: int = 256) -> int:
        """A device address of `n` fresh bytes (bump allocation after the launch area; never freed)."""
        if n < 0 or align <= 0 or align & (align - 1):
            raise ValueError(f"alloc({n}, align={align}): n >= 0 and align a power of two")
        addr = -(-self._next // align) * align
        if addr + n > self.device_base + self.size:
            raise ArenaFull(f"the arena ({self.size >> 20} MiB) cannot hold {n} more bytes",
                            hint="make a larger arena")
        self._next = addr + n
        return addr

    def close(self) -> None:
        if self.fd >= 0:
            self.map.close()
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Arena":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
