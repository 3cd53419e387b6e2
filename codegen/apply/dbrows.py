"""The target's own tuning-database rows, written into the tree's sqlite tarballs.

Rows are derived, for every target GPU of the spec, from the donor GPU's rows
(`spec.rows.donor_gpu`) restricted to the spec's head dims and dtypes, renamed to the target
GPU, with `waves_per_eu` capped (`rows.waves_per_eu_caps`, then `rows.default_max_waves_per_eu`,
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
LUT builder keeps. The result is repacked deterministically: VACUUM INTO a fresh file, one tar
member with normalised metadata (mtime 0, uid/gid 0, no owner names, mode 0644, GNU format),
xz preset 6 with CRC64 like upstream's `tar cJf`.

Layouts (from the adapter): 'central' (0.10b, 0.11b) upserts into
`v3python/rules/tuning_database.sqlite3.tar.xz` (+ `op_database` for 0.11b); 'sharded'
(0.11.1b and later) writes new per-arch shards `v3python/database/amd/<arch>/<family>/<kernel>.sqlite3.tar.xz`
with the donor shard's schema, and upserts into the (unsharded) op DB.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import sqlite3
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UserError
from ..models import FAMILIES
from ..models.limits import cap_waves_per_eu, variant_status
from ..models.space import KernelConfig
from ..upstream import Adapter

XZ_PRESET = 6
TORCH_DTYPES = {"fp16": "torch.float16", "bf16": "torch.bfloat16", "fp32": "torch.float32"}
ROWS_CODE_VERSION = 4  # bump when the derivation changes: invalidates cached DB outputs

Reader = Callable[[str], "bytes | None"]  # tree-relative path -> pristine bytes (None: absent)


class DonorError(UserError):
    """The donor GPU's rows cannot give the target a complete LUT."""


@dataclass
class TableStats:
    donor_rows: int = 0
    written: int = 0
    capped: int = 0
    replaced: int = 0
    measured: int = 0
    measured_unmatched: int = 0
    compile_checked: bool = False   # the overlay had a compile report (waves_per_eu_limits)
    compile_capped: int = 0         # rows lowered by the compile report
    compile_clean: int = 0          # final rows whose config the report measured clean
    compile_unclean: list[str] = field(default_factory=list)     # configs: spill/fail, kept
    compile_unmeasured: list[str] = field(default_factory=list)  # configs the report lacks

    def as_dict(self) -> dict:
        out = {"donor_rows": self.donor_rows, "rows_written": self.written,
               "waves_capped": self.capped, "measured_overrides": self.measured,
               "measured_unmatched": self.measured_unmatched}
        if self.replaced:
            out["tiles_replaced"] = self.replaced
        if self.compile_checked:
            out.update({"compile_capped": self.compile_capped, "compile_clean_rows": self.compile_clean,
                        "compile_unclean": list(self.compile_unclean),
                        "compile_unmeasured": list(self.compile_unmeasured)})
        return out


@dataclass
class DbOutput:
    path: str
    content: bytes
    tables: dict[str, TableStats] = field(default_factory=dict)


# ------------------------------------------------------------------------------- tar + xz io --


def read_tarxz(data: bytes, what: str) -> tuple[str, bytes]:
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as t:
            members = [m for m in t.getmembers() if m.isfile()]
            if len(members) != 1:
                raise DonorError(f"{what}: expected one sqlite file in the tarball, found {len(members)}")
            fh = t.extractfile(members[0])
            assert fh is not None
            return members[0].name, fh.read()
    except (tarfile.TarError, lzma.LZMAError, EOFError) as exc:
        raise DonorError(f"{what}: not a readable .tar.xz ({exc})") from None


def write_tarxz(member: str, payload: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        ti = tarfile.TarInfo(member)
        ti.size = len(payload)
        ti.mtime = 0
        ti.mode = 0o644
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = ""
        ti.type = tarfile.REGTYPE
        t.addfile(ti, io.BytesIO(payload))
    return lzma.compress(buf.getvalue(), format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=XZ_PRESET)


# ------------------------------------------------------------------------------------ sqlite --


def q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _tables(conn: sqlite3.Connection, schema: str) -> list[str]:
    return [r[0] for r in conn.execute(
        f"SELECT name FROM {schema}.sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]


def _columns(conn: sqlite3.Connection, table: str, schema: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA {schema}.table_info({q(table)})")]


def _unique_key(conn: sqlite3.Connection, table: str, schema: str) -> list[str]:
    for _, iname, uniq, origin, *_ in conn.execute(f"PRAGMA {schema}.index_list({q(table)})"):
        if uniq and origin == "u":
            return [r[2] for r in conn.execute(f"PRAGMA {schema}.index_info({q(iname)})")]
    raise DonorError(f"table {table}: no UNIQUE key (not an AOTriton tuning table?)")


def _col(cols: list[str], name: str) -> str | None:
    """Case-insensitive column lookup (attn_fwd spells Max_seqlen_q, the others max_seqlen_q)."""
    for c in cols:
        if c.lower() == name.lower():
            return c
    return None


def _gpu_arch(gpu: str) -> str:
    return gpu.split("_mod")[0]


# ----------------------------------------------------------------------------- derivation --


def _cap_for(rows_spec: dict, family: str, dtype: str, hd: int, bm: int, bn: int) -> int | None:
    caps = [c["max_waves_per_eu"] for c in rows_spec.get("waves_per_eu_caps", [])
            if (c.get("family") in (None, family)) and c["block_m"] == bm and c["block_n"] == bn
            and (c.get("dtype") in (None, dtype)) and (c.get("head_dim") in (None, hd))]
    cap = min(caps) if caps else None
    default = rows_spec.get("default_max_waves_per_eu")
    if default is not None:
        cap = default if cap is None else min(cap, default)
    return cap


def _replacement_for(rows_spec: dict, family: str, dtype: str, hd: int, bm: int, bn: int):
    for t in rows_spec.get("tile_replacements", []):
        if (t["family"] == family and t["block_m"] == bm and t["block_n"] == bn
                and t.get("dtype") in (None, dtype) and t.get("head_dim") in (None, hd)):
            return tuple(t["to"])
    return None


def _truthy(v) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes")


def derive_rows(conn: sqlite3.Connection, src: str, table: str, cols: list[str], rows_spec: dict,
                label: str, required: bool) -> tuple[list[tuple], TableStats]:
    """Rows (values in `cols` order) for every target GPU, from the donor's rows in src.table."""
    st = TableStats()
    donor = rows_spec["donor_gpu"]
    family = table.split("$", 1)[1] if "$" in table else table
    src_cols = _columns(conn, table, src)
    missing = [c for c in cols if c not in src_cols]
    if missing:
        raise DonorError(f"{label}: donor table {table} lacks columns {missing}")
    c_dt, c_hd = _col(cols, "inputs$Q_dtype"), _col(cols, "inputs$BLOCK_DMODEL")
    c_sq, c_sk = _col(cols, "inputs$max_seqlen_q"), _col(cols, "inputs$max_seqlen_k")
    if not all((c_dt, c_hd, c_sq, c_sk)) or "gpu" not in cols:
        raise DonorError(f"{label}: table {table} lacks gpu/dtype/head-dim/seqlen columns")
    dts = [TORCH_DTYPES[d] for d in rows_spec["dtypes"]]
    hds = list(rows_spec["head_dims"])
    sql = (f"SELECT {', '.join(q(c) for c in cols)} FROM {src}.{q(table)} WHERE gpu = ? "
           f"AND {q(c_dt)} IN ({', '.join('?' * len(dts))}) AND {q(c_hd)} IN ({', '.join('?' * len(hds))}) "
           f"ORDER BY rowid")
    donor_rows = [list(r) for r in conn.execute(sql, (donor, *dts, *hds))]
    st.donor_rows = len(donor_rows)
    ix = {c: i for i, c in enumerate(cols)}

    # Completeness: every (dtype, head dim) present, each functional a full seqlen grid.
    if required:
        have = {(r[ix[c_dt]], r[ix[c_hd]]) for r in donor_rows}
        holes = [f"{d} hd{h}" for d in dts for h in hds if (d, h) not in have]
        if holes:
            raise DonorError(
                f"{label}: donor {donor} has no {table} rows for {', '.join(holes)}: the target would get "
                f"an incomplete LUT (MissingLutEntry)",
                hint="pick another rows.donor_gpu, or drop those head dims/dtypes from the spec",
            )
        fcols = [c for c in cols if c.startswith("inputs$") and c not in (c_sq, c_sk)]
        grids: dict[tuple, set] = {}
        for r in donor_rows:
            grids.setdefault(tuple(r[ix[c]] for c in fcols), set()).add((r[ix[c_sq]], r[ix[c_sk]]))
        for fkey, pairs in grids.items():
            qs, ks = {p[0] for p in pairs}, {p[1] for p in pairs}
            if len(pairs) != len(qs) * len(ks):
                raise DonorError(f"{label}: donor {donor} {table} functional {fkey} has an incomplete "
                                 f"seqlen grid ({len(pairs)} of {len(qs) * len(ks)} bins)")

    c_bm, c_bn = _col(cols, "tuned_kernel$BLOCK_M"), _col(cols, "tuned_kernel$BLOCK_N")
    c_w = _col(cols, "compiler_options$waves_per_eu")
    c_nw, c_ns = _col(cols, "compiler_options$num_warps"), _col(cols, "compiler_options$num_stages")
    c_plv = _col(cols, "tuned_kernel$PRE_LOAD_V")
    rev_dt = {v: k for k, v in TORCH_DTYPES.items()}
    measured = [m for m in rows_spec.get("measured", []) if m.get("family") == family]
    limits = rows_spec.get("waves_per_eu_limits")
    checkable = bool(limits) and family in FAMILIES and all((c_bm, c_bn, c_w, c_nw, c_ns))

    def config_of(row: list) -> KernelConfig | None:
        if not checkable or any(row[ix[c]] is None for c in (c_bm, c_bn, c_w, c_nw, c_ns)):
            return None
        plv = None
        if family == "attn_fwd":
            plv = _truthy(row[ix[c_plv]]) if c_plv and row[ix[c_plv]] is not None else False
        return KernelConfig(family, _gpu_arch(row[ix["gpu"]]), rev_dt.get(row[ix[c_dt]], ""), row[ix[c_hd]],
                            row[ix[c_bm]], row[ix[c_bn]], int(row[ix[c_w]]), row[ix[c_nw]], row[ix[c_ns]], plv)

    out: list[list] = []
    for gpu in rows_spec["gpus"]:
        for r in donor_rows:
            row = list(r)
            row[ix["gpu"]] = gpu
            if c_bm and c_bn and row[ix[c_bm]] is not None:
                to = _replacement_for(rows_spec, family, rev_dt.get(row[ix[c_dt]], ""), row[ix[c_hd]],
                                      row[ix[c_bm]], row[ix[c_bn]])
                if to is not None:
                    row[ix[c_bm]], row[ix[c_bn]] = to
                    st.replaced += 1
            if c_bm and c_bn and c_w and row[ix[c_w]] is not None:
                cap = _cap_for(rows_spec, family, rev_dt.get(row[ix[c_dt]], ""), row[ix[c_hd]],
                               row[ix[c_bm]], row[ix[c_bn]])
                if cap is not None and row[ix[c_w]] > cap:
                    row[ix[c_w]] = cap
                    st.capped += 1
            cfg = config_of(row)
            if cfg is not None:  # the compile report: largest spill-free waves_per_eu of the config
                w, _ = cap_waves_per_eu(limits, cfg.limit_key, cfg.waves_per_eu)
                if w != row[ix[c_w]]:
                    row[ix[c_w]] = w
                    st.compile_capped += 1
            out.append(row)

    # Measured winners override the seeded config of their grid entry.
    flags = {"causal": _col(cols, "inputs$CAUSAL_TYPE"), "dropout": _col(cols, "inputs$ENABLE_DROPOUT"),
             "bias": _col(cols, "inputs$BIAS_TYPE")}
    sets = {"block_m": c_bm, "block_n": c_bn, "waves_per_eu": c_w,
            "num_warps": _col(cols, "compiler_options$num_warps"),
            "num_stages": _col(cols, "compiler_options$num_stages"),
            "pre_load_v": _col(cols, "tuned_kernel$PRE_LOAD_V")}
    for m in measured:
        hit = False
        for row in out:
            if (row[ix["gpu"]] != m["gpu"] or row[ix[c_dt]] != TORCH_DTYPES.get(m["dtype"])
                    or row[ix[c_hd]] != int(m["head_dim"]) or row[ix[c_sq]] != int(m["seqlen_q"])
                    or row[ix[c_sk]] != int(m["seqlen_k"])):
                continue
            if any(col and str(m.get(k, "")) != "" and (bool(row[ix[col]]) != bool(int(m[k])))
                   for k, col in flags.items()):
                continue
            for k, col in sets.items():
                if col and str(m.get(k, "")) != "":
                    row[ix[col]] = int(_truthy(m[k])) if k == "pre_load_v" else int(m[k])
            hit = True
        if hit:
            st.measured += 1
        else:  # e.g. a seqlen bin the release's grid does not have (fuse stops at 1024 in 0.10b/0.11b)
            st.measured_unmatched += 1

    # Audit every final row (measured ones included) against the compile report; a duplicate
    # key (the table's UNIQUE key) counts once, as its last row: the one the upsert and
    # upstream's LUT keep.
    if checkable:
        st.compile_checked = True
        kcols = [ix[c] for c in _unique_key(conn, table, src) if c in ix]
        final = {tuple(row[i] for i in kcols): row for row in out}
        unclean, unmeasured = set(), set()
        for row in final.values():
            cfg = config_of(row)
            if cfg is None:
                continue
            status = variant_status(limits["configs"].get(cfg.limit_key), cfg.waves_per_eu)
            if status == "clean":
                st.compile_clean += 1
            else:
                (unclean if status == "unclean" else unmeasured).add(cfg.name)
        st.compile_unclean, st.compile_unmeasured = sorted(unclean), sorted(unmeasured)
    return [tuple(r) for r in out], st


def upsert(conn: sqlite3.Connection, table: str, cols: list[str], key: list[str], rows: list[tuple]) -> int:
    """NULL-safe upsert on `key`; rows with a duplicate key: the last one wins (its position is
    that of the key's first occurrence). Returns the number of rows written."""
    ix = {c: i for i, c in enumerate(cols)}
    merged: dict[tuple, tuple] = {}
    for r in rows:
        merged[tuple(r[ix[k]] for k in key)] = r
    dele = f"DELETE FROM main.{q(table)} WHERE " + " AND ".join(f"{q(k)} IS ?" for k in key)
    ins = f"INSERT INTO main.{q(table)} ({', '.join(q(c) for c in cols)}) VALUES ({', '.join('?' * len(cols))})"
    for k, r in merged.items():
        conn.execute(dele, k)
        conn.execute(ins, r)
    return len(merged)


def _vacuum_bytes(conn: sqlite3.Connection, tmp: Path, name: str) -> bytes:
    out = tmp / f"out-{name}"
    if out.exists():
        out.unlink()
    conn.execute("VACUUM main INTO ?", (str(out),))
    conn.close()
    return out.read_bytes()


def _rewrite(base: bytes, path: str, donor_payload: dict[str, bytes] | None, rows_spec: dict, tmp: Path,
             required: bool, member_override: str | None = None) -> DbOutput:
    """Upsert target rows into the DB of tarball `base` (or into a fresh DB built from the donor's
    schema when `base` is None). `donor_payload`: {'src': sqlite bytes} to read donor rows from a
    different file (a donor shard); None = the DB itself."""
    label = path
    tag = hashlib.sha256(path.encode()).hexdigest()[:12]
    dst = tmp / f"dst-{tag}.sqlite3"
    if base is not None:
        member, payload = read_tarxz(base, path)
        dst.write_bytes(payload)
    else:
        member, payload = member_override, b""
        assert member is not None
    conn = sqlite3.connect(dst, isolation_level=None)
    try:
        src = "main"
        if donor_payload is not None:
            srcf = tmp / f"src-{tag}.sqlite3"
            srcf.write_bytes(donor_payload["src"])
            conn.execute("ATTACH DATABASE ? AS src", (str(srcf),))
            src = "src"
            if base is None:  # a new shard: the donor shard's schema exactly (compose is positional)
                for (sql,) in conn.execute(
                        "SELECT sql FROM src.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                        "ORDER BY CASE type WHEN 'table' THEN 0 ELSE 1 END, name").fetchall():
                    conn.execute(sql)
        out = DbOutput(path=path, content=b"")
        conn.execute("BEGIN")
        for table in _tables(conn, src):
            if table not in _tables(conn, "main"):
                continue
            cols = [c for c in _columns(conn, table, "main") if c != "id"]
            key = _unique_key(conn, table, "main")
            rows, st = derive_rows(conn, src, table, cols, rows_spec, label, required)
            if required and not rows:
                raise DonorError(f"{label}: donor {rows_spec['donor_gpu']} has no rows in {table}")
            st.written = upsert(conn, table, cols, key, rows)
            out.tables[table] = st
        conn.execute("COMMIT")
        if src == "src":
            conn.execute("DETACH DATABASE src")
        out.content = write_tarxz(member, _vacuum_bytes(conn, tmp, tag))
        return out
    except sqlite3.DatabaseError as exc:
        raise DonorError(f"{label}: sqlite error while writing rows: {exc}") from None
    finally:
        try:
            conn.close()
        except sqlite3.Error:
            pass


def db_targets(adapter: Adapter, rows_spec: dict, exists: Callable[[str], bool],
               listdir: Callable[[str], list[str]]) -> list[dict]:
    """What DB files apply writes for this release: [{path, kind: 'upsert'|'shard', donor?, required}]."""
    if adapter.tuning_db_layout == "central":
        out = [{"path": adapter.tuning_db, "kind": "upsert", "required": True}]
        if adapter.op_db:
            out.append({"path": adapter.op_db, "kind": "upsert", "required": False})
        return out
    donor_arch = _gpu_arch(rows_spec["donor_gpu"])
    target_archs = sorted({_gpu_arch(g) for g in rows_spec["gpus"]})
    donor_root = f"{adapter.shard_root}/{donor_arch}"
    shards = sorted(f"{fam}/{name}" for fam in listdir(donor_root) for name in listdir(f"{donor_root}/{fam}")
                    if name.endswith(".sqlite3.tar.xz"))
    if not shards:
        raise DonorError(f"{donor_root}: no tuning-database shards for the donor GPU {rows_spec['donor_gpu']}",
                         hint="pick a rows.donor_gpu that this release has tuned rows for")
    out = []
    for arch in target_archs:
        for rel in shards:
            out.append({"path": f"{adapter.shard_root}/{arch}/{rel}", "kind": "shard",
                        "donor": f"{donor_root}/{rel}", "required": True})
    if adapter.op_db:
        out.append({"path": adapter.op_db, "kind": "upsert", "required": False})
    return out


def input_key(target: dict, base_sha: dict[str, str | None], rows_spec: dict) -> str:
    """Everything a DB output depends on; equal keys -> equal bytes (same sqlite/xz libraries)."""
    blob = json.dumps({"target": target, "bases": base_sha, "rows": rows_spec, "code": ROWS_CODE_VERSION,
                       "sqlite": sqlite3.sqlite_version, "xz": XZ_PRESET}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def build_db(target: dict, read: Reader, rows_spec: dict) -> DbOutput:
    with tempfile.TemporaryDirectory(prefix="mi100-codegen-db-") as td:
        tmp = Path(td)
        if target["kind"] == "upsert":
            base = read(target["path"])
            if base is None:
                raise DonorError(f"{target['path']}: missing from the tree")
            return _rewrite(base, target["path"], None, rows_spec, tmp, target["required"])
        donor = read(target["donor"])
        if donor is None:
            raise DonorError(f"{target['donor']}: missing from the tree")
        _, donor_sql = read_tarxz(donor, target["donor"])
        base = read(target["path"])
        member = Path(target["path"]).name[: -len(".tar.xz")]
        return _rewrite(base, target["path"], {"src": donor_sql}, rows_spec, tmp, target["required"],
                        member_override=member)


__all__ = ["DbOutput", "DonorError", "TableStats", "build_db", "db_targets", "input_key", "read_tarxz",
           "write_tarxz"]
