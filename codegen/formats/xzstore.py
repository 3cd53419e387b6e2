"""A valid .xz file that stores its data instead of compressing it.

The tuning-database archives apply writes have one reader, upstream's CMake, which extracts them
at configure time (`cmake -E tar xf` on 0.10b/0.11b, `file(ARCHIVE_EXTRACT)` later; both
libarchive over liblzma). Compressing a 49 MB database costs seconds of CPU on every apply even at
xz preset 0, and buys nothing the reader needs. LZMA2 has stored ("uncompressed") chunks, which
every xz decoder reads; no library writes them on request, so this module frames them itself,
following the .xz file format specification 1.1.0 (tukaani.org/xz/xz-file-format.txt): one
stream, one block, one LZMA2 filter, CRC32 check. The output depends only on the input bytes.
"""

from __future__ import annotations

import struct
import zlib

MAGIC = b"\xfd7zXZ\x00"
FOOTER_MAGIC = b"YZ"
CHECK_CRC32 = 0x01
FILTER_LZMA2 = 0x21
DICT_64K = 8              # LZMA2 dictionary-size byte: 2**(8 // 2 + 12) = 64 KiB, one stored chunk
CHUNK = 1 << 16           # the largest stored LZMA2 chunk
STORED_RESET = 0x01       # stored chunk that resets the dictionary (the first one)
STORED = 0x02             # stored chunk, dictionary kept
END = 0x00


def _crc32(data) -> bytes:
    return struct.pack("<I", zlib.crc32(data))


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pad4(n: int) -> bytes:
    return bytes(-n % 4)


def xz_stored(data: bytes) -> bytes:
    """`data` in a single-block .xz stream of stored LZMA2 chunks (size: data + ~0.005 % + 60 B)."""
    flags = bytes((0x00, CHECK_CRC32))
    header = MAGIC + flags + _crc32(flags)

    filters = bytes((0x00, FILTER_LZMA2, 0x01, DICT_64K))  # block flags: 1 filter, no sizes
    size = 1 + len(filters) + 4    # size byte, flags and filter, CRC32; a multiple of 4
    size += -size % 4
    body = bytes((size // 4 - 1,)) + filters
    block_header = body + bytes(size - 4 - len(body))
    block_header += _crc32(block_header)

    view = memoryview(data)
    parts: list = []
    for i in range(0, len(data), CHUNK):
        piece = view[i:i + CHUNK]
        parts.append(struct.pack(">BH", STORED_RESET if i == 0 else STORED, len(piece) - 1))
        parts.append(piece)
    parts.append(bytes((END,)))
    packed = b"".join(parts)
    check = _crc32(data)
    unpadded = len(block_header) + len(packed) + len(check)
    block = b"".join((block_header, packed, _pad4(len(packed)), check))

    index = bytes((0x00,)) + _varint(1) + _varint(unpadded) + _varint(len(data))
    index += _pad4(len(index))
    index += _crc32(index)

    tail = struct.pack("<I", len(index) // 4 - 1) + flags
    footer = _crc32(tail) + tail + FOOTER_MAGIC
    return b"".join((header, block, index, footer))
