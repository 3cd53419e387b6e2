"""Which tuning-database row each emulated-dispatch case got, and whether it is the spec's.

The library picks a kernel per functional through the autotune tables generated from the tree's
tuning database: a LUT over seqlen bins whose cells name one kernel (codegen.formats.tuning_db:
the functional key and the lookup); the kernel's image name carries its configuration
(codegen.models.image_name: the `tuned_kernel$` values in the table's column order, or by name,
and the compiler options). So from the applied tree's database (`tree_database`: the same sqlite
archives the build compiled, ours written by `apply`) and a case's functional this module
computes the row the spec's GPU defines, and checks that the kernel the stub saw launched has that
row's configuration. A row of another GPU (e.g. the donor's) that would give the same configuration is
named beside it: the check then cannot tell the two apart, and says so.

A bundle carries the rows the check needs (`tuning-rows.json`, written by `carry_rows` when the
bundle is staged): the spec's GPUs' rows of every tuned table and each table's head-dim buckets.
Other GPUs' rows are not carried (all of them are tens of MB), so without the tree no other GPU
is named. `read_rows` is the one reader the check uses: the tree's database when a tree is given
(compared with the carried rows), else the carried rows, validated as hostile input.

Where it ran: a CPU; the kernels never run. Label: "CPU-built, dispatch emulated; never run on a card".
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PlainValidator, StrictInt, ValidationError, model_validator

from codegen.core.contain import inside
from codegen.core.errors import UserError
from codegen.models.records import Record, RecordError, parse_json
from codegen.models.functional import Functional
from codegen.models.image_name import ImageName, Spelling
from codegen.models.target import GpuName
from codegen.formats import tuning_db as db
from codegen.formats.tuning_db import Table
from codegen.upstream import tuning_db_places
from codegen.upstream.releases import DB_ARCHIVE_SUFFIX
from codegen.formats.bundle_zip import BundleError

ROWS = "tuning-rows.json"        # the bundle member that carries the rows
ROWS_FORMAT = 1
ROWS_LIMIT = 64 << 20            # bytes of that member (the default spec's: about 1 MB)


def parse_stem(stem: str, names: Spelling) -> ImageName | None:
    """A launched kernel as the image index names it (`<pack>/<dir>/<kernel>/<container>/<name>`,
    codegen.ship.dispatch; or the bare name) -> its image name, spelt as `names`."""
    parts = stem.split("/")
    return names.parse(parts[-1], parts[2] if len(parts) >= 4 else "")


class TuningDatabase:
    """The `FLASH$<family>` tables of a tree's sqlite databases, or the rows a bundle carries.
    `gpus`: the GPUs whose rows it holds (None: every GPU's, as the tree has them); `origin`: how
    a claim names it; `sources`: the archives read, relative to the tree."""

    def __init__(self, tables: dict[str, Table], *, gpus: tuple[str, ...] | None = None, origin: str = "",
                 sources: tuple[str, ...] = ()):
        self.tables, self.gpus, self.origin, self.sources = tables, gpus, origin, sources

    @classmethod
    def from_sqlite(cls, conns: list[sqlite3.Connection], *, origin: str = "",
                    sources: tuple[str, ...] = ()) -> "TuningDatabase":
        return cls(db.read_tables(conns), origin=origin, sources=sources)

    def family(self, family: str) -> Table | None:
        return self.tables.get(db.table_of(family))


def tree_database(tree: Path) -> TuningDatabase:
    """The kernel tuning databases of an applied tree, where its release keeps them
    (`codegen.upstream.tuning_db_places`: the central archive, 0.10b and 0.11b, or the schema-only
    one and the per-arch shards below its folder, later releases); never the op DB. Only regular
    files reached through no symbolic link below the tree are read."""
    tree = Path(tree).resolve()
    if not tree.is_dir():
        raise UserError(f"{tree}: not a folder (the applied AOTriton tree the bundle was built from)")
    cands = []
    for central, sharded in tuning_db_places(tree):
        cands.append(tree / central)
        shards = (tree / central).parent
        if sharded and shards.is_dir() and not shards.is_symlink():
            for dirpath, dirnames, filenames in os.walk(shards):   # os.walk follows no directory link
                dirnames.sort()
                cands += [Path(dirpath) / f for f in sorted(filenames)
                          if f.endswith(DB_ARCHIVE_SUFFIX) and Path(dirpath) / f != tree / central]
    found = []
    for p in cands:
        p = inside(tree, p.relative_to(tree).as_posix())          # Escape (a UserError) on a link
        if p.is_file() and "op_" not in p.name and p not in found:
            found.append(p)
    if not found:
        places = " or ".join(f"{c}{' (and shards beside it)' if sh else ''}" for c, sh in tuning_db_places(tree))
        raise UserError(f"{tree}: no tuning database ({places}) in this tree")
    return TuningDatabase.from_sqlite([db.open_archive(p) for p in found], origin=f"{tree.name}'s database",
                                      sources=tuple(p.relative_to(tree).as_posix() for p in found))


# --- the rows a bundle carries (tuning-rows.json) ----------------------------------------------
TEXT_RE = re.compile(r"[\x20-\x7e]{0,200}")      # a cell is printed: no control characters


def _cell(v: object) -> object:
    if v is None or type(v) in (int, float) or (type(v) is str and TEXT_RE.fullmatch(v)):
        return v
    raise ValueError("a cell that is not a number, printable text of at most 200 characters or null")


Cell = Annotated[object, PlainValidator(_cell)]
Column = Annotated[str, Field(pattern=r"^[A-Za-z0-9_$]{1,100}$")]
TableName = Annotated[str, Field(pattern=r"^FLASH\$[A-Za-z0-9_]{1,100}$")]
Source = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.][A-Za-z0-9_./-]{0,300}$")]
INT_COLUMNS = (db.HEAD_DIM,) + db.CO_COLUMNS     # read as numbers by the lookup (with the seqlen columns)


class CarriedTable(Record):
    columns: list[Column] = Field(min_length=1)
    head_dims: list[StrictInt]
    rows: list[list[Cell]]

    @model_validator(mode="after")
    def _shape(self) -> "CarriedTable":
        cols = self.columns
        if len(set(cols)) != len(cols):
            raise ValueError("a column is named twice")
        lacking = [c for c in (db.GPU,) + INT_COLUMNS if c not in cols]
        if lacking:
            raise ValueError(f"no column {', '.join(lacking)}")
        seqlens = (db.column(cols, db.SEQLEN_Q), db.column(cols, db.SEQLEN_K))
        ints = [cols.index(c) for c in INT_COLUMNS + tuple(c for c in seqlens if c)]
        for n, r in enumerate(self.rows):
            if len(r) != len(cols):
                raise ValueError(f"row {n} has {len(r)} cells for {len(cols)} columns")
            if any(type(r[i]) is not int for i in ints):
                raise ValueError(f"row {n}: a head dim, seqlen or compiler option that is not an integer")
        return self


class CarriedRows(Record):
    """`tuning-rows.json`: the spec's GPUs' rows of every tuned table of the tree the bundle was
    built from (a bundle member, so hostile input: read only through this model)."""
    format: Literal[1]
    gpus: list[GpuName] = Field(min_length=1)
    sources: list[Source]
    tables: dict[TableName, CarriedTable]

    @model_validator(mode="after")
    def _gpus(self) -> "CarriedRows":
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError("a GPU is named twice")
        for name, t in self.tables.items():
            gi = t.columns.index(db.GPU)
            if any(r[gi] not in self.gpus for r in t.rows):
                raise ValueError(f"{name} holds a row of a GPU it does not name")
        return self


def _carried_tables(tdb: TuningDatabase, gpus: list[str] | tuple[str, ...]) -> dict[str, Table]:
    """The tables a bundle carries: every table of tuned kernels (compiler options among its
    columns), with the rows of `gpus` only, and its head-dim buckets over every GPU."""
    out = {}
    for name, t in sorted(tdb.tables.items()):
        if not all(c in t.columns for c in (db.GPU,) + INT_COLUMNS):
            continue
        gi = t.columns.index(db.GPU)
        out[name] = Table(t.columns, [r for r in t.rows if r[gi] in gpus], t.head_dims)
    return out


def carry_rows(tdb: TuningDatabase, gpus: list[str] | tuple[str, ...]) -> bytes:
    """`tuning-rows.json` of a bundle built from the tree `tdb` was read from, for the spec's GPUs."""
    tables = _carried_tables(tdb, gpus)
    doc = {"format": ROWS_FORMAT, "gpus": sorted(gpus), "sources": list(tdb.sources),
           "tables": {n: {"columns": t.columns, "head_dims": list(t.head_dims), "rows": [list(r) for r in t.rows]}
                      for n, t in tables.items()}}
    try:
        data = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        CarriedRows.model_validate_json(data)     # what the reader takes, and nothing it would refuse
    except (ValueError, TypeError) as exc:        # ValidationError is a ValueError
        why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise UserError(f"{', '.join(tdb.sources) or 'the tuning database'}: rows a bundle cannot carry ({why})") \
            from None
    return data


def carried_database(data: bytes, name: str = ROWS) -> TuningDatabase:
    """The rows a bundle carries, validated; BundleError (exit 2, one message) on anything wrong."""
    if len(data) > ROWS_LIMIT:
        raise BundleError(f"{name}: larger than {ROWS_LIMIT:,} bytes: not the rows of a bundle")
    try:
        doc = CarriedRows.model_validate_json(data)
        parse_json(data, where=name, what=ROWS)   # the travelling documents' one rule: no key twice
    except (ValidationError, RecordError) as exc:
        if isinstance(exc, RecordError):
            why = exc.problem
        else:
            e = exc.errors()[0]
            why = f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"]
        why = "".join(ch if " " <= ch <= "~" else "?" for ch in why[:300])   # hostile text, printed
        raise BundleError(f"{name}: not the tuning rows of a bundle ({why})",
                          hint="the bundle was changed after it was built: download or build it again") from None
    tables = {n: Table(list(t.columns), [tuple(r) for r in t.rows], tuple(sorted(set(t.head_dims))))
              for n, t in sorted(doc.tables.items())}
    return TuningDatabase(tables, gpus=tuple(doc.gpus), origin=f"the bundle's {ROWS}",
                          sources=tuple(doc.sources))


def differences(tree: TuningDatabase, carried: TuningDatabase) -> list[str]:
    """Where the tree's rows of the carried GPUs differ from the carried ones, one phrase a table."""
    mine = _carried_tables(tree, carried.gpus or ())
    out = []
    for name in sorted(set(mine) | set(carried.tables)):
        a, b = mine.get(name), carried.tables.get(name)
        if a is None or b is None:
            out.append(f"{name} {'only carried' if a is None else 'not carried'}")
        elif a.columns != b.columns:
            out.append(f"{name} columns")
        else:
            n = sum(((Counter(a.rows) - Counter(b.rows)) + (Counter(b.rows) - Counter(a.rows))).values())
            if n:
                out.append(f"{name} {n} rows ({len(a.rows)} in the tree, {len(b.rows)} carried)")
            if a.head_dims != b.head_dims:
                out.append(f"{name} head-dim buckets")
    return out


@dataclass(frozen=True)
class RowsSource:
    """The rows a check reads (`db`, None: neither a tree nor carried rows), whether the bundle
    carries rows, and where a tree's differ from them."""
    db: TuningDatabase | None
    carried: bool = False
    differ: tuple[str, ...] = ()


def read_rows(*, tree: Path | None = None, carried: bytes | None = None, name: str = ROWS,
              tree_db: TuningDatabase | None = None) -> RowsSource:
    """The one reader of the rows a check uses: the applied tree's database when a tree is given
    (`tree_db`: already read), compared with the rows the bundle carries; else those rows."""
    kept = carried_database(carried, name) if carried is not None else None
    if tree_db is None and tree is not None:
        tree_db = tree_database(tree)
    if tree_db is None:
        return RowsSource(kept, kept is not None)
    return RowsSource(tree_db, kept is not None, tuple(differences(tree_db, kept)) if kept else ())


@dataclass
class RowMatch:
    case: str
    phase: str
    kernel: str                 # the launched image stem
    family: str
    gpu: str
    row_id: int | None = None   # None also where the table has no `id` column (0.13b's shards)
    found: bool = False         # the GPU defines a row for these inputs
    key: dict = field(default_factory=dict)
    want: str = ""              # the row's config, spelled as in the stem
    got: str = ""
    same_config_gpus: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.found and self.want == self.got

    def as_json(self) -> dict:
        return {"case": self.case, "phase": self.phase, "family": self.family, "kernel": self.kernel,
                "gpu": self.gpu, "row_id": self.row_id, "row_key": self.key, "row_config": self.want,
                "launched_config": self.got, "ok": self.ok,
                "other_gpus_with_same_config": self.same_config_gpus, "note": self.note}


def _spell(cols: list[str], row: tuple) -> str:
    perf = "_".join(str(row[i]) for i, c in enumerate(cols) if c.startswith(db.TUNED_PREFIX))
    w, n, s = (row[cols.index(c)] for c in db.CO_COLUMNS)
    return f"{perf}|wave{w}_warp{n}_stg{s}"


def _stem_spelling(cfg: ImageName, cols: list[str]) -> str:
    # PRE_LOAD_V is stored 0/1 but named False/True: normalise the stem's booleans to the DB's ints
    if cfg.perf_names:   # 0.13b names its perf fields: take the table's, in its column order
        named = cfg.named_perf
        perf = [named.get(c[len(db.TUNED_PREFIX):], "?") for c in cols if c.startswith(db.TUNED_PREFIX)]
    else:
        perf = list(cfg.perf)
    perf = [{"False": "0", "True": "1"}.get(t, t) for t in perf]
    return f"{'_'.join(perf)}|wave{cfg.waves_per_eu}_warp{cfg.num_warps}_stg{cfg.num_stages}"


def match_row(tdb: TuningDatabase, gpu: str, stem: str, inp: Functional, names: Spelling, *, case: str = "",
              phase: str = "") -> RowMatch | None:
    """The row `gpu` defines for `inp` in the table of the stem's kernel, against the stem's config
    (`names`: how the bundle's release names images). None when the kernel has no tuning table
    (e.g. bwd_preprocess: one kernel per functional)."""
    cfg = parse_stem(stem, names)
    if cfg is None:
        return None
    table = tdb.family(cfg.kernel)
    if table is None:
        return None
    cols = table.columns
    m = RowMatch(case, phase, stem, cfg.kernel, gpu, got=_stem_spelling(cfg, cols))
    row = table.lookup(gpu, inp)
    if row is None:
        m.note = f"no {gpu} row for these inputs in {db.table_of(cfg.kernel)}"
        return m
    m.found = True
    m.row_id = row[cols.index("id")] if "id" in cols else None
    m.key = {c: row[cols.index(c)] for c in cols if c.startswith(db.INPUT_PREFIX) or c == db.GPU}
    m.want = _spell(cols, row)
    gi = cols.index(db.GPU)
    for g in sorted({r[gi] for r in table.rows} - {gpu}):
        other = table.lookup(g, inp)
        if other is not None and _spell(cols, other) == m.want:
            m.same_config_gpus.append(g)
    return m


def match_report(tdb: TuningDatabase, gpu: str, cases: list, results: list, names: Spelling) -> list[RowMatch]:
    """Every launched kernel of every case (dispatch.DispatchCase / CaseResult pairs, by name)
    that has a tuning table, matched to the row `gpu` defines."""
    by_name = {c.name: c for c in cases}
    out = []
    for res in results:
        case = by_name.get(res.case)
        if case is None:
            continue
        for phase in ("fwd", "bwd"):
            for stem in res.kernels[phase]:
                m = match_row(tdb, gpu, stem, case.functional, names, case=res.case, phase=phase)
                if m is not None:
                    out.append(m)
    return out


def summary(matches: list[RowMatch], gpu: str, *, every_gpu: bool = True) -> tuple[bool, str]:
    """(ok, one line): every launched tuned kernel has the configuration of `gpu`'s row.
    `every_gpu`: the rows read hold every GPU's (a tree), else only the spec's (a bundle's)."""
    bad = [m for m in matches if not m.ok]
    shared = sum(1 for m in matches if m.ok and m.same_config_gpus)
    others = sorted({g for m in matches for g in m.same_config_gpus})
    line = (f"{len(matches) - len(bad)} of {len(matches)} tuned launches have the configuration of the "
            f"{gpu} row for their inputs")
    if matches and not bad:
        line += (f"; {shared} of them would get the same configuration from a row of {', '.join(others)}"
                 if shared else "; no other GPU's row gives any of them" if every_gpu else "")
    if not every_gpu:
        line += "; other GPUs' rows are not carried: give --tree to name those giving the same configuration"
    if bad:
        b = bad[0]
        line += f"; first mismatch: {b.case} {b.family}: launched {b.got}, row {b.want or b.note}"
    return bool(matches) and not bad, line
