"""The target's own tuning-database rows, written into the tree's sqlite tarballs.

Rows are derived, for every target GPU of the spec, from the donor GPU's rows
(`spec.rows.donor_gpu`) restricted to the spec's head dims and dtypes, renamed to the target
GPU, donor tiles replaced (`rows.tile_replacements`), `num_warps` raised to the family's floor
(`rows.min_num_warps`), with `waves_per_eu` capped (`rows.waves_per_eu_caps`, then `rows.default_max_waves_per_eu`,
then the compile report's `waves_per_eu_limits`: the largest waves_per_eu that compiled without
spills for the row's config) and finally overridden by measured rows (`overlay.rows['measured']`).
Every final row's config is checked against the compile report: configs that spill or fail
at every measured waves_per_eu are kept but listed (`compile_unclean`), as are configs the
report does not know (`compile_unmeasured`). They give the target a
complete LUT for every functional (upstream aborts with MissingLutEntry on a hole): the donor's
grid is checked for completeness before anything is written. The tuning-DB reuse map is never
used.

Writing is an upsert on upstream's UNIQUE key, NULL-safe (SQLite's UNIQUE does not fire when a
key column is NULL, as in bwd_kernel_fuse and op_attn_bwd, so an `ON CONFLICT` clause alone
would let duplicates in): an existing row with the same key is replaced, every other row is
kept. Duplicate donor keys collapse to the donor's last row, which is also the row upstream's
LUT builder keeps. Both databases live in memory (`Connection.deserialize`, no temporary files);
the result is the serialized database (deterministic for the same inputs and sqlite version, which
the input key records), packed deterministically: one tar member with normalised metadata
(mtime 0, uid/gid 0, no owner names, mode 0644, GNU format), in a valid .xz file of stored LZMA2
chunks (no compression, CRC32): `codegen.formats.tuning_db.write_archive`, the archive's one
reader and writer.
The archive's one reader, upstream's CMake (`cmake -E tar xf` on 0.10b/0.11b,
`file(ARCHIVE_EXTRACT)` later, both libarchive over liblzma), decompresses it at configure time;
compressing bought it nothing and cost the first apply most of its time (docs/measurements.md).
The price is size: the archive in the tree is as large as the database until `revert`.

Layouts (from the adapter): 'central' (0.10b, 0.11b) upserts into the central kernel tuning
database archive (`adapter.tuning_db`, + the op database's for 0.11b); 'sharded' (0.11.1b and
later) writes new per-arch shards (`v3python/database/amd/<arch>/<family>/<kernel>` archives) with
the donor shard's schema, and upserts into the (unsharded) op DB.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Callable

from codegen.core.errors import UserError
from codegen.core.fsutil import sha256
from codegen.models import FAMILIES
from codegen.models.dtypes import DTYPE_INFO, by_torch
from codegen.models.limits import cap_waves_per_eu, variant_status
from codegen.models.lock import TableRows
from codegen.models.rows import TRUE_SPELLINGS, RowsPlan, RowTile, Winner
from codegen.models.space import KernelConfig
from codegen.models.target import gpu_arch
from codegen.upstream import Adapter
from codegen.upstream.releases import DB_ARCHIVE_SUFFIX
from codegen.formats import tuning_db as db
from codegen.formats.tuning_db import ARCHIVE_FORMAT, member_name, read_archive, write_archive
from codegen.formats.tuning_db import quote as q
ROWS_CODE_VERSION = 5  # bump when the derivation changes: invalidates cached DB outputs

Reader = Callable[[str], "bytes | None"]  # tree-relative path -> pristine bytes (None: absent)


class DonorError(UserError):
    """The donor GPU's rows cannot give the target a complete LUT."""


@dataclass
class TableStats:
    """What the derivation did to one table, counted as it goes (codegen.models.lock.TableRows
    names each field)."""

    donor_rows: int = 0
    rows_written: int = 0
    waves_capped: int = 0
    tiles_replaced: int = 0
    warps_raised: int = 0
    split_routed: int = 0
    measured_overrides: int = 0
    measured_unmatched: int = 0
    compile_checked: bool = False   # the overlay had a compile report (waves_per_eu_limits)
    compile_capped: int = 0
    compile_clean_rows: int = 0
    compile_unclean: list[str] = field(default_factory=list)
    compile_unmeasured: list[str] = field(default_factory=list)

    def counts(self) -> TableRows:
        """The statistics as apply's result and lock record them."""
        return TableRows(**self.as_dict())

    def as_dict(self) -> dict:
        """The counts of later features only when set, the compile report's only when there was one."""
        later = ("tiles_replaced", "warps_raised", "split_routed")
        return {k: v for k, v in asdict(self).items() if k != "compile_checked" and (v or k not in later)
                and (self.compile_checked or not k.startswith("compile_"))}


@dataclass
class DbOutput:
    path: str
    content: bytes
    tables: dict[str, TableStats] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ sqlite --


def _tuple_of(idx: list[int]) -> Callable[[list | tuple], tuple]:
    """row -> the tuple of its values at `idx` (itemgetter, always a tuple)."""
    if not idx:
        return lambda row: ()
    get = itemgetter(*idx)
    return get if len(idx) > 1 else (lambda row: (get(row),))


def _unique_key(conn: sqlite3.Connection, table: str, schema: str) -> list[str]:
    for _, iname, uniq, origin, *_ in conn.execute(f"PRAGMA {schema}.index_list({q(table)})"):
        if uniq and origin == "u":
            return [r[2] for r in conn.execute(f"PRAGMA {schema}.index_info({q(iname)})")]
    raise DonorError(f"table {table}: no UNIQUE key (not an AOTriton tuning table?)")


# ----------------------------------------------------------------------------- derivation --


@dataclass(frozen=True)
class _Cols:
    """The columns of one table that the derivation reads or writes (None: the table lacks it)."""

    ix: dict[str, int]
    dt: str
    hd: str
    sq: str
    sk: str
    bm: str | None
    bn: str | None
    w: str | None
    nw: str | None
    ns: str | None
    plv: str | None
    flags: dict[str, str | None]

    @classmethod
    def of(cls, cols: list[str], label: str, table: str) -> "_Cols":
        find = lambda name: db.column(cols, name)  # noqa: E731
        dt, hd, sq, sk = find(db.DTYPE), find(db.HEAD_DIM), find(db.SEQLEN_Q), find(db.SEQLEN_K)
        if not all((dt, hd, sq, sk)) or db.GPU not in cols:
            raise DonorError(f"{label}: table {table} lacks gpu/dtype/head-dim/seqlen columns")
        cfg = {k: find(v) for k, v in db.CONFIG_COLUMNS.items()}
        return cls({c: i for i, c in enumerate(cols)}, dt, hd, sq, sk, cfg["block_m"], cfg["block_n"],
                   cfg["waves_per_eu"], cfg["num_warps"], cfg["num_stages"], cfg["pre_load_v"],
                   {k: find(v) for k, v in db.FLAG_COLUMNS.items()})

    def get(self, row: list, col: str | None):
        return None if col is None else row[self.ix[col]]

    def dtype(self, row: list) -> str:
        info = by_torch(str(row[self.ix[self.dt]]))
        return info.short if info else ""

    def tile(self, family: str, row: list) -> RowTile | None:
        if self.bm is None or self.bn is None:
            return None
        return RowTile(family, self.dtype(row), row[self.ix[self.hd]], row[self.ix[self.bm]], row[self.ix[self.bn]])

    @property
    def has_config(self) -> bool:
        return all((self.bm, self.bn, self.w, self.nw, self.ns))


def _config_of(c: _Cols, family: str, arch: str, row: list) -> KernelConfig | None:
    """The kernel config a target row selects (None: not a tuning family, or a NULL config column)."""
    if family not in FAMILIES or not c.has_config or any(c.get(row, k) is None for k in (c.bm, c.bn, c.w, c.nw, c.ns)):
        return None
    plv = None
    if family == "attn_fwd":
        plv = str(c.get(row, c.plv)).strip().lower() in TRUE_SPELLINGS if c.get(row, c.plv) is not None else False
    return KernelConfig(family, arch, c.dtype(row), row[c.ix[c.hd]], c.get(row, c.bm),
                        c.get(row, c.bn), int(c.get(row, c.w)), c.get(row, c.nw), c.get(row, c.ns), plv)


def _donor_rows(conn: sqlite3.Connection, src: str, table: str, cols: list[str], c: _Cols,
                plan: RowsPlan) -> list[list]:
    dts = [DTYPE_INFO[d].db_value for d in plan.dtypes]
    hds = list(plan.head_dims)
    sql = (f"SELECT {', '.join(q(x) for x in cols)} FROM {src}.{q(table)} WHERE gpu = ? "
           f"AND {q(c.dt)} IN ({', '.join('?' * len(dts))}) AND {q(c.hd)} IN ({', '.join('?' * len(hds))}) "
           f"ORDER BY rowid")
    return [list(r) for r in conn.execute(sql, (plan.donor_gpu, *dts, *hds))]


def _check_complete(rows: list[list], cols: list[str], c: _Cols, plan: RowsPlan, label: str, table: str) -> None:
    """Every (dtype, head dim) present, each functional a full seqlen grid: else the target would
    get an incomplete LUT (upstream aborts with MissingLutEntry)."""
    dts = [DTYPE_INFO[d].db_value for d in plan.dtypes]
    have = {(r[c.ix[c.dt]], r[c.ix[c.hd]]) for r in rows}
    holes = [f"{d} hd{h}" for d in dts for h in plan.head_dims if (d, h) not in have]
    if holes:
        raise DonorError(
            f"{label}: donor {plan.donor_gpu} has no {table} rows for {', '.join(holes)}: the target would get "
            f"an incomplete LUT (MissingLutEntry)",
            hint="pick another rows.donor_gpu, or drop those head dims/dtypes from the spec",
        )
    fcols = [x for x in cols if x.startswith(db.INPUT_PREFIX) and x not in (c.sq, c.sk)]
    grids: dict[tuple, set] = {}
    fkey, sqk = _tuple_of([c.ix[x] for x in fcols]), itemgetter(c.ix[c.sq], c.ix[c.sk])
    for r in rows:
        grids.setdefault(fkey(r), set()).add(sqk(r))
    for fkey, pairs in grids.items():
        qs, ks = {p[0] for p in pairs}, {p[1] for p in pairs}
        if len(pairs) != len(qs) * len(ks):
            raise DonorError(f"{label}: donor {plan.donor_gpu} {table} functional {fkey} has an incomplete "
                             f"seqlen grid ({len(pairs)} of {len(qs) * len(ks)} bins)")


def _cfg_key(c: _Cols) -> Callable[[list], tuple]:
    """A row's values at the columns the rules read (dtype, head dim, tile, waves, warps, stages,
    pre_load_v; None where the table lacks one): every rule's verdict is a function of them."""
    idx = [c.ix[k] for k in (c.dt, c.hd, c.bm, c.bn, c.w, c.nw, c.ns, c.plv) if k is not None]
    pos = [k is not None for k in (c.dt, c.hd, c.bm, c.bn, c.w, c.nw, c.ns, c.plv)]
    if all(pos):
        get = itemgetter(*idx)
        return lambda row: get(row)
    return lambda row: tuple(row[c.ix[k]] if k is not None else None
                             for k in (c.dt, c.hd, c.bm, c.bn, c.w, c.nw, c.ns, c.plv))


def _seed_rule(row: list, c: _Cols, family: str, plan: RowsPlan, checkable: bool) -> tuple:
    """What seeding does to a row of this config: (block_m, block_n, num_warps, waves_per_eu,
    replaced, raised, capped, compile_capped). The tile is replaced, num_warps raised to the
    family's floor, then waves_per_eu capped (the spec's caps, then the compile report's largest
    spill-free waves_per_eu for the row's final config)."""
    row = list(row)
    replaced = raised = capped = compile_capped = False
    tile = c.tile(family, row)
    rep = plan.replacement_for(tile) if tile and tile.block_m is not None else None
    if rep is not None and tuple(rep.to) != (tile.block_m, tile.block_n):
        row[c.ix[c.bm]], row[c.ix[c.bn]] = rep.to
        replaced = True
        tile = c.tile(family, row)
    if c.nw and row[c.ix[c.nw]] is not None:
        nw = plan.num_warps_for(family, row[c.ix[c.nw]], rep)
        if nw != row[c.ix[c.nw]]:
            row[c.ix[c.nw]] = nw
            raised = True
    if tile is not None and c.w and row[c.ix[c.w]] is not None:
        cap = plan.cap_for(tile)
        if cap is not None and row[c.ix[c.w]] > cap:
            row[c.ix[c.w]] = cap
            capped = True
    if checkable:
        w = _compile_cap(c, family, plan, row)
        if w is not None and w != row[c.ix[c.w]]:
            row[c.ix[c.w]] = w
            compile_capped = True
    return (c.get(row, c.bm), c.get(row, c.bn), c.get(row, c.nw), c.get(row, c.w), replaced, raised, capped,
            compile_capped)


def _seed_all(donor: list[list], c: _Cols, family: str, plan: RowsPlan, checkable: bool,
              st: TableStats) -> list[list]:
    """Every donor row renamed to each target GPU and seeded (`_seed_rule`, once per config)."""
    key = _cfg_key(c)
    rules: dict[tuple, tuple] = {}
    gi = c.ix[db.GPU]
    bm, bn, nw, w = (c.ix[k] if k is not None else None for k in (c.bm, c.bn, c.nw, c.w))
    seeded = []
    for r in donor:
        k = key(r)
        rule = rules.get(k)
        if rule is None:
            rule = rules[k] = _seed_rule(r, c, family, plan, checkable)
        seeded.append((r, rule))
    out = []
    for gpu in plan.gpus:
        for r, (m, n, warps, wv, replaced, raised, capped, ccapped) in seeded:
            row = list(r)
            row[gi] = gpu
            if replaced:
                row[bm], row[bn] = m, n
                st.tiles_replaced += 1
            if raised:
                row[nw] = warps
                st.warps_raised += 1
            if capped or ccapped:
                row[w] = wv
                st.waves_capped += capped
                st.compile_capped += ccapped
            out.append(row)
    return out


def _compile_cap(c: _Cols, family: str, plan: RowsPlan, row: list) -> int | None:
    """The largest spill-free waves_per_eu the compile report has for the row's config."""
    cfg = _config_of(c, family, plan.arch, row)
    if cfg is None:
        return None
    return cap_waves_per_eu(plan.waves_per_eu_limits, cfg.limit_key, cfg.waves_per_eu)[0]


def _winner_hits(row: list, c: _Cols, w: Winner) -> bool:
    if (row[c.ix[db.GPU]] != w.gpu or row[c.ix[c.dt]] != DTYPE_INFO[w.dtype].db_value
            or row[c.ix[c.hd]] != w.head_dim or row[c.ix[c.sq]] != w.seqlen_q or row[c.ix[c.sk]] != w.seqlen_k):
        return False
    return not any(col and bool(row[c.ix[col]]) != getattr(w, k) for k, col in c.flags.items())


def _apply_measured(rows: list[list], c: _Cols, winners: list[Winner], st: TableStats) -> None:
    """Measured winners override the seeded config of their grid entry."""
    for w in winners:
        sets = {c.ix[col]: v for col, v in ((db.column(list(c.ix), k), v) for k, v in db.winner_config(w).items())
                if col is not None}
        hits = [row for row in rows if _winner_hits(row, c, w)]
        for row in hits:
            for i, v in sets.items():
                row[i] = v
        if hits:
            st.measured_overrides += 1
        else:  # e.g. a seqlen bin the release's grid does not have (fuse stops at 1024 in 0.10b/0.11b)
            st.measured_unmatched += 1


def _route_split(rows: list[list], c: _Cols, backend: str | None, plan: RowsPlan, st: TableStats) -> None:
    """op_attn_bwd rows that pick the fused kernel for a pass the spec splits (rows.split_backward)
    pick the split backend instead."""
    if backend is None:
        return
    bi, hi = c.ix[backend], c.ix[c.hd]
    for row in rows:
        if row[bi] == db.BWD_BACKEND_FUSED and plan.splits_backward(c.dtype(row), row[hi]):
            row[bi] = db.BWD_BACKEND_SPLIT
            st.split_routed += 1


def _audit(rows: list[list], key: list[str], c: _Cols, family: str, plan: RowsPlan, st: TableStats) -> None:
    """Every final row against the compile report; a duplicate key (the table's UNIQUE key)
    counts once, as its last row: the one the upsert and upstream's LUT keep."""
    st.compile_checked = True
    kcols = _tuple_of([c.ix[k] for k in key if k in c.ix])
    final = {kcols(row): row for row in rows}
    verdicts: dict[tuple, tuple[str, str] | None] = {}
    unclean, unmeasured = set(), set()
    cfg_key = _cfg_key(c)
    for row in final.values():
        ckey = cfg_key(row)
        if ckey not in verdicts:
            cfg = _config_of(c, family, plan.arch, row)
            verdicts[ckey] = None if cfg is None else (
                cfg.name, variant_status(plan.waves_per_eu_limits["configs"].get(cfg.limit_key), cfg.waves_per_eu))
        if verdicts[ckey] is None:
            continue
        name, status = verdicts[ckey]
        if status == "clean":
            st.compile_clean_rows += 1
        else:
            (unclean if status == "unclean" else unmeasured).add(name)
    st.compile_unclean, st.compile_unmeasured = sorted(unclean), sorted(unmeasured)


def derive_rows(conn: sqlite3.Connection, src: str, table: str, cols: list[str], plan: RowsPlan,
                label: str, required: bool) -> tuple[list[tuple], TableStats]:
    """Rows (values in `cols` order) for every target GPU, from the donor's rows in src.table."""
    st = TableStats()
    family = db.family_of(table)
    missing = [x for x in cols if x not in db.table_columns(conn, table, src)]
    if missing:
        raise DonorError(f"{label}: donor table {table} lacks columns {missing}")
    c = _Cols.of(cols, label, table)
    donor = _donor_rows(conn, src, table, cols, c, plan)
    st.donor_rows = len(donor)
    if required:
        _check_complete(donor, cols, c, plan, label, table)
    checkable = bool(plan.waves_per_eu_limits) and family in FAMILIES and c.has_config
    out = _seed_all(donor, c, family, plan, checkable, st)
    _apply_measured(out, c, plan.measured_for(family), st)
    if table == db.OP_ATTN_BWD_TABLE and plan.split_backward:
        _route_split(out, c, db.column(cols, db.OP_BACKEND), plan, st)
    if checkable:
        _audit(out, _unique_key(conn, table, src), c, family, plan, st)
    return [tuple(r) for r in out], st


def upsert(conn: sqlite3.Connection, table: str, cols: list[str], key: list[str], rows: list[tuple]) -> int:
    """NULL-safe upsert on `key`; rows with a duplicate key: the last one wins (its position is
    that of the key's first occurrence). Returns the number of rows written."""
    ix = {c: i for i, c in enumerate(cols)}
    keyof = _tuple_of([ix[k] for k in key])
    merged: dict[tuple, tuple] = {}
    for r in rows:
        merged[keyof(r)] = r
    dele = f"DELETE FROM main.{q(table)} WHERE " + " AND ".join(f"{q(k)} IS ?" for k in key)
    ins = f"INSERT INTO main.{q(table)} ({', '.join(q(c) for c in cols)}) VALUES ({', '.join('?' * len(cols))})"
    if conn.execute(f"SELECT 1 FROM main.{q(table)} LIMIT 1").fetchone() is not None:  # a new shard: nothing to replace
        conn.executemany(dele, list(merged))  # the keys are unique: delete all, then insert in order
    conn.executemany(ins, list(merged.values()))
    return len(merged)


SQLITE_IN_MEMORY = hasattr(sqlite3.Connection, "serialize")  # Python 3.11+


class _Workspace:
    """Where the databases of one rewrite live: in memory (Connection.deserialize/serialize,
    Python 3.11+) or, on older Pythons, in a temporary folder. The two give the same rows but
    not always the same header bytes (a new shard), so the input key records which one ran."""

    def __init__(self) -> None:
        self.tmp = None if SQLITE_IN_MEMORY else tempfile.TemporaryDirectory(prefix="mi100-codegen-db-")

    def open(self, payload: bytes) -> sqlite3.Connection:
        if self.tmp is None:
            conn = sqlite3.connect(":memory:", isolation_level=None)
            if payload:
                conn.deserialize(payload)
            return conn
        path = Path(self.tmp.name, "main.sqlite3")
        path.write_bytes(payload)
        return sqlite3.connect(path, isolation_level=None)

    def attach(self, conn: sqlite3.Connection, data: bytes, name: str) -> None:
        if self.tmp is None:
            conn.execute(f"ATTACH DATABASE ':memory:' AS {name}")
            conn.deserialize(data, name=name)
            return
        path = Path(self.tmp.name, f"{name}.sqlite3")
        path.write_bytes(data)
        conn.execute(f"ATTACH DATABASE ? AS {name}", (str(path),))

    def image(self, conn: sqlite3.Connection) -> bytes:
        """The main database's bytes (closes the connection)."""
        data = conn.serialize() if self.tmp is None else None
        conn.close()
        return data if data is not None else Path(self.tmp.name, "main.sqlite3").read_bytes()

    def close(self) -> None:
        if self.tmp is not None:
            self.tmp.cleanup()


def _rewrite(base: bytes | None, path: str, donor_sql: bytes | None, plan: RowsPlan, required: bool,
             member_override: str | None = None) -> DbOutput:
    """Upsert target rows into the DB of tarball `base` (or into a fresh DB built from the donor's
    schema when `base` is None). `donor_sql`: the sqlite bytes to read donor rows from when they
    live in another file (a donor shard); None = the DB itself."""
    label = path
    if base is not None:
        member, payload = read_archive(base, path)
    else:
        member, payload = member_override, b""
        assert member is not None
    work = _Workspace()
    conn = None
    try:
        conn = work.open(payload)
        src = "main"
        if donor_sql is not None:
            work.attach(conn, donor_sql, "src")
            src = "src"
            if base is None:  # a new shard: the donor shard's schema exactly (compose is positional)
                for (sql,) in conn.execute(
                        "SELECT sql FROM src.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                        "ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, name").fetchall():
                    conn.execute(sql)
        out = DbOutput(path=path, content=b"")
        conn.execute("BEGIN")
        for table in db.table_names(conn, src):
            if table not in db.table_names(conn, "main"):
                continue
            cols = [c for c in db.table_columns(conn, table, "main") if c != "id"]
            key = _unique_key(conn, table, "main")
            rows, st = derive_rows(conn, src, table, cols, plan, label, required)
            if required and not rows:
                raise DonorError(f"{label}: donor {plan.donor_gpu} has no rows in {table}")
            st.rows_written = upsert(conn, table, cols, key, rows)
            out.tables[table] = st
        conn.execute("COMMIT")
        if src == "src":
            conn.execute("DETACH DATABASE src")
        data, conn = work.image(conn), None
        out.content = write_archive(member, data)
        return out
    except sqlite3.DatabaseError as exc:
        raise DonorError(f"{label}: sqlite error while writing rows: {exc}") from None
    finally:
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        work.close()


def db_targets(adapter: Adapter, plan: RowsPlan, exists: Callable[[str], bool],
               listdir: Callable[[str], list[str]]) -> list[dict]:
    """What DB files apply writes for this release: [{path, kind: 'upsert'|'shard', donor?, required}]."""
    if adapter.tuning_db_layout == "central":
        out = [{"path": adapter.tuning_db, "kind": "upsert", "required": True}]
        if adapter.op_db:
            out.append({"path": adapter.op_db, "kind": "upsert", "required": False})
        return out
    donor_root = f"{adapter.shard_root}/{gpu_arch(plan.donor_gpu)}"  # where the donor GPU's shards live
    # shards lie in a folder per family (<arch>/flash/<kernel>, 0.11.1b-0.13b) or directly in the
    # arch folder (main: one database folder per family): read from the tree, not assumed
    shards = sorted([name for name in listdir(donor_root) if name.endswith(DB_ARCHIVE_SUFFIX)]
                    + [f"{fam}/{name}" for fam in listdir(donor_root) if not fam.endswith(DB_ARCHIVE_SUFFIX)
                       for name in listdir(f"{donor_root}/{fam}") if name.endswith(DB_ARCHIVE_SUFFIX)])
    if not shards:
        raise DonorError(f"{donor_root}: no tuning-database shards for the donor GPU {plan.donor_gpu}",
                         hint="pick a rows.donor_gpu that this release has tuned rows for")
    out = [{"path": f"{adapter.shard_root}/{plan.arch}/{rel}", "kind": "shard", "donor": f"{donor_root}/{rel}",
            "required": True} for rel in shards]
    if adapter.op_db:
        out.append({"path": adapter.op_db, "kind": "upsert", "required": False})
    return out


def input_key(target: dict, base_sha: dict[str, str | None], plan: RowsPlan) -> str:
    """Everything a DB output depends on; equal keys -> equal bytes (same sqlite/xz libraries)."""
    blob = json.dumps({"target": target, "bases": base_sha, "rows": plan.to_json(), "code": ROWS_CODE_VERSION,
                       "sqlite": sqlite3.sqlite_version, "sqlite_io": "memory" if SQLITE_IN_MEMORY else "file",
                       "archive": ARCHIVE_FORMAT}, sort_keys=True)
    return sha256(blob.encode())


def build_db(target: dict, read: Reader, plan: RowsPlan) -> DbOutput:
    if target["kind"] == "upsert":
        base = read(target["path"])
        if base is None:
            raise DonorError(f"{target['path']}: missing from the tree")
        return _rewrite(base, target["path"], None, plan, target["required"])
    donor = read(target["donor"])
    if donor is None:
        raise DonorError(f"{target['donor']}: missing from the tree")
    _, donor_sql = read_archive(donor, target["donor"])
    base = read(target["path"])
    return _rewrite(base, target["path"], donor_sql, plan, target["required"], member_override=member_name(target["path"]))
