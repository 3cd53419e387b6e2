"""Upstream's tuning database: its archive (the one reader and writer), table and column names,
and how a measured winner becomes a row.

The archive (`<name>.sqlite3.tar.xz` in a tree: codegen.upstream.releases names them) is one
sqlite file in a tar in xz. `read_archive` takes its one member out (one copy, never a stream),
`write_archive` packs one deterministically (see `tar_bytes` and codegen.formats.xzstore),
`extract_archive` puts the member into a folder as upstream's CMake does at configure time,
`open_archive` opens the database in memory. An archive that cannot be read is one ArchiveError.

Tables are `FLASH$<family>`; columns are `gpu`, `inputs$…` (the functional: the LUT key),
`tuned_kernel$…` and `compiler_options$…` (the config). attn_fwd spells its seqlen columns
`inputs$Max_seqlen_q`, the others `inputs$max_seqlen_q`: column lookups are case-insensitive.
Same in every supported release (0.10b .. 0.12b).
"""

from __future__ import annotations

import io
import lzma
import sqlite3
import tarfile
from pathlib import Path

from codegen.core.contain import inside
from codegen.core.errors import UserError
from codegen.core.fsutil import atomic_write, read_input
from codegen.formats.xzstore import xz_stored
from codegen.models.dtypes import DTYPE_INFO
from codegen.models.rows import Winner

ARCHIVE_FORMAT = "tar (GNU, one member) in xz of stored LZMA2 chunks, CRC32"  # what write_archive makes
MAX_ARCHIVE_BYTES = 1 << 31   # an archive read from a tree (upstream's largest database: ~49 MB)

TABLE_PREFIX = "FLASH$"
GPU = "gpu"
DTYPE = "inputs$Q_dtype"
HEAD_DIM = "inputs$BLOCK_DMODEL"
SEQLEN_Q = "inputs$max_seqlen_q"
SEQLEN_K = "inputs$max_seqlen_k"
INPUT_PREFIX = "inputs$"
# winner field -> column: the functional flags a winner is matched on (as booleans) ...
FLAG_COLUMNS = {"causal": "inputs$CAUSAL_TYPE", "dropout": "inputs$ENABLE_DROPOUT", "bias": "inputs$BIAS_TYPE"}
# ... and the config a winner sets
CONFIG_COLUMNS = {"block_m": "tuned_kernel$BLOCK_M", "block_n": "tuned_kernel$BLOCK_N",
                  "waves_per_eu": "compiler_options$waves_per_eu", "num_warps": "compiler_options$num_warps",
                  "num_stages": "compiler_options$num_stages", "pre_load_v": "tuned_kernel$PRE_LOAD_V"}
# Causal rows are stored as CAUSAL_TYPE 3 (windowed, top-left), the others as 0.
CAUSAL_TYPE_CAUSAL = 3

# The op database (0.11b and later; 0.10b has none) picks a backend per backward pass: `op$backend`
# is the backend's index in upstream's list, the same in 0.11b..0.13b (0.11b..0.12.1b: the order
# of `OpAttnBwd([...])` in v3python/rules/flash/__init__.py; 0.13b: `@ati.backend(n, ...)` in
# modules/flash/aot/__init__.py; tests/test_targets_real.py reads both). A GPU without rows
# gets the first backend, the split one.
OP_ATTN_BWD_TABLE = TABLE_PREFIX + "op_attn_bwd"
OP_BACKEND = "op$backend"
BWD_BACKEND_SPLIT = 0   # 'triton_split': bwd_kernel_dk_dv + bwd_kernel_dq (and bwd_preprocess)
BWD_BACKEND_FUSED = 1   # 'bwd_kernel_fuse'


class ArchiveError(UserError):
    """A tuning-database archive that is not one readable sqlite file in a tar in xz."""


def read_archive(data: bytes, what: str) -> tuple[str, bytes]:
    """(member name, sqlite bytes) of an archive's bytes; `what` names it in messages."""
    try:
        raw = lzma.decompress(data, format=lzma.FORMAT_XZ)  # every stream of a multi-stream file
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as t:
            members = [m for m in t.getmembers() if m.isfile()]
            if len(members) != 1:
                raise ArchiveError(f"{what}: expected one sqlite file in the tarball, found {len(members)}")
            m = members[0]
            if m.sparse or m.offset_data + m.size > len(raw):
                raise ArchiveError(f"{what}: the sqlite file in the tarball is sparse or truncated")
            return m.name, raw[m.offset_data:m.offset_data + m.size]  # one copy, not a stream
    except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
        raise ArchiveError(f"{what}: not a readable .tar.xz ({exc})") from None


def read_archive_file(path: Path) -> tuple[str, bytes]:
    """`read_archive` of a file (a bounded regular file: codegen.core.fsutil.read_input)."""
    return read_archive(read_input(path, what="tuning-database archive", limit=MAX_ARCHIVE_BYTES), str(path))


def member_name(archive: str) -> str:
    """The member an archive holds, by its file name: 'attn_fwd.sqlite3.tar.xz' -> 'attn_fwd.sqlite3'."""
    return Path(archive).name.removesuffix(".tar.xz")


def tar_bytes(member: str, payload: bytes) -> bytes:
    """A one-member tar of `payload`, byte for byte what `tarfile` writes in GNU format for it
    (header with normalised metadata, data padded to 512, two zero blocks, padded to the 10240-byte
    record), built in one copy instead of tarfile's 16 KiB writes."""
    ti = tarfile.TarInfo(member)
    ti.size = len(payload)
    ti.mtime = 0
    ti.mode = 0o644
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.type = tarfile.REGTYPE
    head = ti.tobuf(tarfile.GNU_FORMAT, tarfile.ENCODING, "surrogateescape")
    size = len(head) + len(payload)
    size += -size % tarfile.BLOCKSIZE
    end = size + 2 * tarfile.BLOCKSIZE
    end += -end % tarfile.RECORDSIZE
    return b"".join((head, payload, bytes(end - len(head) - len(payload))))


def write_archive(member: str, payload: bytes) -> bytes:
    """The archive of one sqlite file (ARCHIVE_FORMAT): the same bytes for the same input."""
    return xz_stored(tar_bytes(member, payload))


def extract_archive(archive: Path, dest: Path) -> Path:
    """Put an archive's sqlite file into `dest` (inside it: codegen.core.contain), as upstream's
    CMake untars it at configure time; returns its path."""
    member, payload = read_archive_file(archive)
    path = inside(Path(dest), member)
    atomic_write(path, payload)
    return path


def open_archive(path: Path) -> sqlite3.Connection:
    """The database an archive holds, opened in memory."""
    _member, payload = read_archive_file(path)
    conn = sqlite3.connect(":memory:")
    try:
        conn.deserialize(payload)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise ArchiveError(f"{path}: not a sqlite database ({exc})") from None
    return conn


def family_of(table: str) -> str:
    return table.split("$", 1)[1] if "$" in table else table


def table_of(family: str) -> str:
    return f"{TABLE_PREFIX}{family}"


def column(cols: list[str], name: str) -> str | None:
    """Case-insensitive column lookup."""
    for c in cols:
        if c.lower() == name.lower():
            return c
    return None


def winner_config(w: Winner) -> dict[str, int]:
    """The config columns a winner sets (only the fields it has), in the database's values."""
    out = {}
    for field, col in CONFIG_COLUMNS.items():
        v = getattr(w, field)
        if v is not None:
            out[col] = int(v)
    return out


def winner_row(w: Winner) -> tuple[str, dict]:
    """A winner -> (table, {column: value}) of a complete row in upstream's schema. The row's key
    is gpu + every `inputs$` column: replacing a seeded row means deleting the rows whose key
    matches (compare with `IS`, NULLs occur) and inserting this one."""
    fwd = w.family == "attn_fwd"
    causal = bool(w.causal)
    seq = ("inputs$Max_seqlen_q", "inputs$Max_seqlen_k") if fwd else (SEQLEN_Q, SEQLEN_K)
    cols: dict = {GPU: w.gpu, DTYPE: DTYPE_INFO[w.dtype].db_value, seq[0]: w.seqlen_q, seq[1]: w.seqlen_k,
                  "inputs$CAUSAL_TYPE": CAUSAL_TYPE_CAUSAL if causal else 0, HEAD_DIM: w.head_dim,
                  "inputs$ENABLE_DROPOUT": int(w.dropout or 0), "inputs$PADDED_HEAD": 0,
                  "inputs$BIAS_TYPE": int(w.bias or 0)}
    extra = ("inputs$USE_ALIBI", "inputs$INT8", "inputs$INT8_KV", "inputs$USE_P_SCALE")
    if fwd:
        cols.update({c: 0 for c in extra})
        cols.update({"tuned_kernel$PERSISTENT_TYPE": 2 if causal else 0, "tuned_kernel$GRID_CU_MULTIP": 2})
    elif w.family == "bwd_kernel_fuse":
        # stored as NULL in every FLASH$bwd_kernel_fuse row of 0.11b (and SQLite's UNIQUE treats
        # NULLs as distinct), so an ON CONFLICT upsert never fires: delete with `IS`, then insert.
        cols.update({c: None for c in extra})
    cfg = winner_config(w.model_copy(update={"pre_load_v": bool(w.pre_load_v)} if fwd else {"pre_load_v": None}))
    cols.update({k: cfg[k] for k in ("tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N")})
    if fwd:
        cols["tuned_kernel$PRE_LOAD_V"] = cfg["tuned_kernel$PRE_LOAD_V"]
    cols.update({k: cfg[k] for k in ("compiler_options$waves_per_eu", "compiler_options$num_warps",
                                     "compiler_options$num_stages")})
    return table_of(w.family), cols


__all__ = ["ARCHIVE_FORMAT", "ArchiveError", "BWD_BACKEND_FUSED", "BWD_BACKEND_SPLIT", "CAUSAL_TYPE_CAUSAL",
           "CONFIG_COLUMNS", "DTYPE", "FLAG_COLUMNS", "GPU", "HEAD_DIM", "OP_ATTN_BWD_TABLE", "OP_BACKEND", "SEQLEN_K",
           "SEQLEN_Q", "column", "extract_archive", "family_of", "member_name", "open_archive", "read_archive",
           "read_archive_file", "table_of", "tar_bytes", "winner_config", "winner_row", "write_archive"]
