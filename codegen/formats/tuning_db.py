"""Upstream's tuning database: its archive (the one reader and writer), its tables (the one reader:
`read_tables`, `table_names`, `table_columns`), table and column names, the functional key a row
is spelled as (`functional_inputs`: the key is codegen.models.functional's) and upstream's LUT
lookup (`Table.lookup`), and how a measured winner becomes a row.

The archive (`<name>.sqlite3.tar.xz` in a tree: codegen.upstream.releases names them) is one
sqlite file in a tar in xz. `read_archive` takes its one member out (one copy, never a stream),
`write_archive` packs one deterministically (see `tar_bytes` and codegen.formats.xzstore),
`extract_archive` puts the member into a folder as upstream's CMake does at configure time,
`open_archive` opens the database in memory. An archive that cannot be read is one ArchiveError.

Tables are `FLASH$<family>`; columns are `gpu`, `inputs$…` (the functional: the LUT key),
`tuned_kernel$…` and `compiler_options$…` (the config). attn_fwd spells its seqlen columns
`inputs$Max_seqlen_q`, the others `inputs$max_seqlen_q`: column lookups are case-insensitive.
Same in every supported release (0.10b .. main). The LUT: per GPU and functional, a grid of
seqlen bins (`SEQLEN_BINS`), looked up by `BinningLessOrEqual` (`bin_of`).
"""

from __future__ import annotations

import io
import lzma
import sqlite3
import tarfile
from dataclasses import dataclass
from pathlib import Path

from codegen.core.contain import inside
from codegen.core.errors import UserError
from codegen.core.fsutil import atomic_write, read_input
from codegen.formats.xzstore import xz_stored
from codegen.models.dtypes import DTYPE_INFO
from codegen.models.functional import Functional
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
TUNED_PREFIX = "tuned_kernel$"
CAUSAL, DROPOUT, PADDED_HEAD, BIAS = "inputs$CAUSAL_TYPE", "inputs$ENABLE_DROPOUT", "inputs$PADDED_HEAD", "inputs$BIAS_TYPE"
# winner field -> column: the functional flags a winner is matched on (as booleans) ...
FLAG_COLUMNS = {"causal": CAUSAL, "dropout": DROPOUT, "bias": BIAS}
# ... and the config a winner sets
CONFIG_COLUMNS = {"block_m": "tuned_kernel$BLOCK_M", "block_n": "tuned_kernel$BLOCK_N",
                  "waves_per_eu": "compiler_options$waves_per_eu", "num_warps": "compiler_options$num_warps",
                  "num_stages": "compiler_options$num_stages", "pre_load_v": "tuned_kernel$PRE_LOAD_V"}
CO_COLUMNS = tuple(CONFIG_COLUMNS[k] for k in ("waves_per_eu", "num_warps", "num_stages"))
# Causal rows are stored as CAUSAL_TYPE 3 (windowed, top-left), the others as 0.
CAUSAL_TYPE_CAUSAL = 3
# The seqlen bins of upstream's LUT: rows exist for each pair of them, per functional.
SEQLEN_BINS: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

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


def quote(name: str) -> str:
    """A table or column name as SQL spells it (quoted: `$` and `"` in names)."""
    return '"' + name.replace('"', '""') + '"'


def table_names(conn: sqlite3.Connection, schema: str = "main") -> list[str]:
    """The tables of a database (of an attached one: `schema`), sorted."""
    return [r[0] for r in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def table_columns(conn: sqlite3.Connection, table: str, schema: str = "main") -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({quote(table)})")]


def functional_inputs(f: Functional, head_dim: int | None = None) -> dict[str, object]:
    """The `inputs$` values of the rows of a functional key (codegen.models.functional) but the
    seqlens (`head_dim`: the table's bucket of its head dim). Every other `inputs$` column of a
    table is a feature the key leaves off (0, or NULL where a table keeps it unset). PADDED_HEAD
    is looked up as False, a padded head too: upstream's rules list it among the
    PARTIALLY_TUNED_FUNCTIONALS."""
    return {DTYPE: DTYPE_INFO[f.dtype].db_value, HEAD_DIM: f.head_dim if head_dim is None else head_dim,
            CAUSAL: CAUSAL_TYPE_CAUSAL if f.causal else 0, DROPOUT: int(f.dropout), PADDED_HEAD: 0,
            BIAS: int(f.bias)}


def bin_of(bins, n: int) -> int:
    """upstream's BinningLessOrEqual: the smallest bin at least `n`, else the largest."""
    ok = [b for b in bins if b >= n]
    return min(ok) if ok else max(bins)


@dataclass
class Table:
    """One `FLASH$<family>` table: its columns, rows, and head-dim buckets (the BLOCK_DMODEL
    values of every GPU's rows: kept apart so a table carried with one GPU's rows buckets alike)."""

    columns: list[str]
    rows: list[tuple]
    head_dims: tuple[int, ...] = ()

    def with_head_dims(self) -> "Table":
        if HEAD_DIM in self.columns:
            hi = self.columns.index(HEAD_DIM)
            self.head_dims = tuple(sorted({r[hi] for r in self.rows if type(r[hi]) is int}))
        return self

    def lookup(self, gpu: str, f: Functional) -> tuple | None:
        """The row upstream's LUT gives `gpu` for `f` (None: none): the rows of its key (its head
        dim's bucket: the table's smallest BLOCK_DMODEL at least it; the features it leaves off),
        then the seqlen bins (`bin_of`); of duplicate keys the last row, as upstream's LUT keeps."""
        cols = self.columns
        sq, sk = column(cols, SEQLEN_Q), column(cols, SEQLEN_K)
        if sq is None or sk is None or GPU not in cols:
            return None
        dims = [d for d in self.head_dims if d >= f.head_dim]
        inputs = functional_inputs(f, dims[0] if dims else f.head_dim)
        key = [(cols.index(c), v) for c, v in inputs.items() if c in cols]
        off = [i for i, c in enumerate(cols) if c.startswith(INPUT_PREFIX) and c not in inputs and c not in (sq, sk)]
        gi, qi, ki = cols.index(GPU), cols.index(sq), cols.index(sk)
        cands = [r for r in self.rows if r[gi] == gpu and all(r[i] == v for i, v in key)
                 and all(r[i] in (0, None) for i in off)]
        if not cands:
            return None
        bq = bin_of({r[qi] for r in cands}, f.seqlen_q)
        bk = bin_of({r[ki] for r in cands if r[qi] == bq}, f.seqlen_k)
        hits = [r for r in cands if r[qi] == bq and r[ki] == bk]
        return hits[-1] if hits else None


def read_tables(conns: list[sqlite3.Connection]) -> dict[str, Table]:
    """Every `FLASH$` table of the databases, by name, sorted: a table split over shards is one
    (a shard's own column order taken to the first's; a schema-only central database beside its
    shards adds no rows). UserError when shards disagree on a table's columns."""
    tables: dict[str, Table] = {}
    for c in conns:
        for name in table_names(c):
            if not name.startswith(TABLE_PREFIX):
                continue
            cols = table_columns(c, name)
            rows = c.execute(f"SELECT * FROM {quote(name)}").fetchall()
            have = tables.get(name)
            if have and have.columns == cols:
                have.rows.extend(rows)
            elif have and sorted(have.columns) == sorted(cols):   # a shard's own column order
                order = [cols.index(x) for x in have.columns]
                have.rows.extend(tuple(r[i] for i in order) for r in rows)
            elif not have or not have.rows:     # a schema-only central DB beside its shards
                tables[name] = Table(cols, list(rows))
            else:
                raise UserError(f"{name}: the tuning database's shards disagree on its columns")
    return {n: t.with_head_dims() for n, t in sorted(tables.items())}


def family_of(table: str) -> str:
    return table.split("$", 1)[1] if "$" in table else table


def table_of(family: str) -> str:
    return f"{TABLE_PREFIX}{family}"


def column(cols: list[str], name: str) -> str | None:
    """Case-insensitive column lookup."""
    return next((c for c in cols if c.lower() == name.lower()), None)


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
    seq = ("inputs$Max_seqlen_q", "inputs$Max_seqlen_k") if fwd else (SEQLEN_Q, SEQLEN_K)
    cols: dict = {GPU: w.gpu, seq[0]: w.seqlen_q, seq[1]: w.seqlen_k, **functional_inputs(w.functional)}
    extra = ("inputs$USE_ALIBI", "inputs$INT8", "inputs$INT8_KV", "inputs$USE_P_SCALE")
    if fwd:
        cols.update({c: 0 for c in extra})
        cols.update({"tuned_kernel$PERSISTENT_TYPE": 2 if w.causal else 0, "tuned_kernel$GRID_CU_MULTIP": 2})
    elif w.family == "bwd_kernel_fuse":
        # stored as NULL in every FLASH$bwd_kernel_fuse row of 0.11b (and SQLite's UNIQUE treats
        # NULLs as distinct), so an ON CONFLICT upsert never fires: delete with `IS`, then insert.
        cols.update({c: None for c in extra})
    cfg = winner_config(w.model_copy(update={"pre_load_v": bool(w.pre_load_v)} if fwd else {"pre_load_v": None}))
    cols.update({k: cfg[k] for k in ("tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N")})
    if fwd:
        cols["tuned_kernel$PRE_LOAD_V"] = cfg["tuned_kernel$PRE_LOAD_V"]
    cols.update({k: cfg[k] for k in CO_COLUMNS})
    return table_of(w.family), cols
