"""Which tuning-database row each emulated-dispatch case got, and whether it is the spec's.

The library picks a kernel per functional through the autotune tables generated from the tree's
tuning database: a LUT over seqlen bins (`BinningLessOrEqual`: the smallest bin at least the
length, the largest bin past the end) whose cells name one kernel; the kernel's image stem carries
its configuration (`__P__` the `tuned_kernel$` values in the table's column order, `__CO__`
`wave<waves_per_eu>_warp<num_warps>_stg<num_stages>`). So from the applied tree's database
(`tree_database`: the same sqlite archives the build compiled, ours written by `apply`) and a
case's inputs (dtype, head dim -> the table's BLOCK_DMODEL bucket, causal, dropout, bias,
seqlens -> bins) this module computes the
row the spec's GPU defines, and checks that the kernel the stub saw launched has that row's
configuration. A row of another GPU (e.g. the donor's) that would give the same configuration is
named beside it: the check then cannot tell the two apart, and says so.

Where it ran: a CPU; the kernels never run. Label: "CPU-built, dispatch emulated; never run on a card".
"""

from __future__ import annotations

import os
import re
import sqlite3
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ..contain import inside
from ..errors import UserError
from ..models.dtypes import DTYPE_INFO
from ..upstream import tuning_db as db
from ..upstream import tuning_db_places

# up to 0.12.1b: <kernel>-Sig-F__<functional>__P__<perf>__CO__wave<W>_warp<N>_stg<S>--Arch_<arch>
# 0.13b (named `<pack>/flash/<kernel>/<member>/<stem>` by the image index):
#   ;;#F;<functional k=v;…>;;#P;<perf k=v;…>;;#CO;waves_per_eu=W;num_warps=N;num_stages=S;;arch=<arch>
STEM13_RE = re.compile(r";;#P;(?P<p>[^#]*?);;#CO;waves_per_eu=(?P<w>\d+);num_warps=(?P<n>\d+);num_stages=(?P<s>\d+)"
                       r";;arch=(?P<arch>[A-Za-z0-9_]+)$")
STEM_RE = re.compile(r"^(?P<kernel>[A-Za-z0-9_]+)-Sig-F__(?P<f>.*?)__P__(?P<p>.*?)"
                     r"__CO__wave(?P<w>\d+)_warp(?P<n>\d+)_stg(?P<s>\d+)--Arch_(?P<arch>[A-Za-z0-9_]+)$")
MAX_DB_BYTES = 1 << 31
TUNED, OPTIONS = "tuned_kernel$", "compiler_options$"
CO_COLUMNS = ("compiler_options$waves_per_eu", "compiler_options$num_warps", "compiler_options$num_stages")


@dataclass(frozen=True)
class StemConfig:
    kernel: str
    perf: tuple[str, ...]      # values in upstream's order (names in 0.13b's `perf_named`)
    co: tuple[int, int, int]   # waves_per_eu, num_warps, num_stages
    perf_named: tuple[tuple[str, str], ...] = ()


def parse_stem(stem: str) -> StemConfig | None:
    """A kernel image stem (optionally `<package>/<stem>`) -> its kernel and configuration."""
    m13 = STEM13_RE.search(stem)
    parts = stem.split("/")
    if m13 and len(parts) >= 5:   # 0.13b: the kernel is the zip's name
        named = tuple(tuple(kv.split("=", 1)) for kv in m13.group("p").split(";") if "=" in kv)
        return StemConfig(parts[2], tuple(v for _, v in named),
                          (int(m13.group("w")), int(m13.group("n")), int(m13.group("s"))), named)
    m = STEM_RE.match(stem.rsplit("/", 1)[-1])
    if not m:
        return None
    perf = tuple(m.group("p").split("_")) if m.group("p") else ()
    return StemConfig(m.group("kernel"), perf, (int(m.group("w")), int(m.group("n")), int(m.group("s"))))


def _token(v) -> str:
    """A database value as upstream spells it in an image name (booleans as True/False)."""
    return str(v)


class TuningDatabase:
    """The `FLASH$<family>` tables of one or more sqlite databases, in memory."""

    def __init__(self, conns: list[sqlite3.Connection]):
        self.tables: dict[str, tuple[list[str], list[tuple]]] = {}
        for c in conns:
            for (name,) in c.execute("select name from sqlite_master where type='table' order by name"):
                if not name.startswith(db.TABLE_PREFIX):
                    continue
                cols = [r[1] for r in c.execute(f'pragma table_info("{name}")')]
                rows = c.execute(f'select * from "{name}"').fetchall()
                have = self.tables.get(name)
                if have and have[0] == cols:
                    have[1].extend(rows)
                elif have and sorted(have[0]) == sorted(cols):   # a shard's own column order
                    order = [cols.index(x) for x in have[0]]
                    have[1].extend(tuple(r[i] for i in order) for r in rows)
                elif not have or not have[1]:     # a schema-only central DB beside its shards
                    self.tables[name] = (cols, list(rows))
                else:
                    raise UserError(f"{name}: the tuning database's shards disagree on its columns")

    def family(self, family: str) -> tuple[list[str], list[tuple]] | None:
        return self.tables.get(db.table_of(family))


def _sqlite_of(archive: Path) -> sqlite3.Connection:
    with tarfile.open(archive) as t:
        members = [m for m in t.getmembers() if m.isfile() and m.name.endswith(".sqlite3")]
        if len(members) != 1 or members[0].size > MAX_DB_BYTES:
            raise UserError(f"{archive}: not one tuning database in the archive")
        data = t.extractfile(members[0]).read()
    conn = sqlite3.connect(":memory:")
    conn.deserialize(data)
    return conn


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
                          if f.endswith(".sqlite3.tar.xz") and Path(dirpath) / f != tree / central]
    found = []
    for p in cands:
        p = inside(tree, p.relative_to(tree).as_posix())          # Escape (a UserError) on a link
        if p.is_file() and "op_" not in p.name and p not in found:
            found.append(p)
    if not found:
        places = " or ".join(f"{c}{' (and shards beside it)' if sh else ''}" for c, sh in tuning_db_places(tree))
        raise UserError(f"{tree}: no tuning database ({places}) in this tree")
    return TuningDatabase([_sqlite_of(p) for p in found])


def _bin(values: set[int], n: int) -> int:
    """BinningLessOrEqual: the smallest bin >= n, else the largest."""
    ok = [v for v in values if v >= n]
    return min(ok) if ok else max(values)


@dataclass(frozen=True)
class Inputs:
    dtype: str
    head_dim: int
    causal: bool
    dropout: bool
    bias: bool
    seqlen_q: int
    seqlen_k: int


@dataclass
class RowMatch:
    case: str
    phase: str
    kernel: str                 # the launched image stem
    family: str
    gpu: str
    row_id: int | None = None
    key: dict = field(default_factory=dict)
    want: str = ""              # the row's config, spelled as in the stem
    got: str = ""
    same_config_gpus: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.row_id is not None and self.want == self.got

    def as_json(self) -> dict:
        return {"case": self.case, "phase": self.phase, "family": self.family, "kernel": self.kernel,
                "gpu": self.gpu, "row_id": self.row_id, "row_key": self.key, "row_config": self.want,
                "launched_config": self.got, "ok": self.ok,
                "other_gpus_with_same_config": self.same_config_gpus, "note": self.note}


def _spell(cols: list[str], row: tuple) -> str:
    perf = "_".join(_token(row[i]) for i, c in enumerate(cols) if c.startswith(TUNED))
    w, n, s = (row[cols.index(c)] for c in CO_COLUMNS)
    return f"{perf}|wave{w}_warp{n}_stg{s}"


def _stem_spelling(cfg: StemConfig, cols: list[str]) -> str:
    # PRE_LOAD_V is stored 0/1 but named False/True: normalise the stem's booleans to the DB's ints
    if cfg.perf_named:   # 0.13b names its perf fields: take the table's, in its column order
        named = dict(cfg.perf_named)
        perf = [named.get(c[len(TUNED):], "?") for c in cols if c.startswith(TUNED)]
    else:
        perf = list(cfg.perf)
    perf = [{"False": "0", "True": "1"}.get(t, t) for t in perf]
    return f"{'_'.join(perf)}|wave{cfg.co[0]}_warp{cfg.co[1]}_stg{cfg.co[2]}"


def match_row(tdb: TuningDatabase, gpu: str, stem: str, inp: Inputs, *, case: str = "", phase: str = "") -> RowMatch | None:
    """The row `gpu` defines for `inp` in the table of the stem's kernel, against the stem's config.
    None when the kernel has no tuning table (e.g. bwd_preprocess: one kernel per functional)."""
    cfg = parse_stem(stem)
    if cfg is None:
        return None
    table = tdb.family(cfg.kernel)
    if table is None:
        return None
    cols, rows = table
    m = RowMatch(case, phase, stem, cfg.kernel, gpu, got=_stem_spelling(cfg, cols))
    sq = db.column(cols, db.SEQLEN_Q)
    sk = db.column(cols, db.SEQLEN_K)
    # the head dim's bucket: the smallest BLOCK_DMODEL of the table at least the head dim; the
    # rows read are the PADDED_HEAD=False ones for a padded head too (upstream's rules list
    # PADDED_HEAD among PARTIALLY_TUNED_FUNCTIONALS, looked up as False)
    hi = cols.index(db.HEAD_DIM)
    dims = sorted({r[hi] for r in rows if isinstance(r[hi], int) and r[hi] >= inp.head_dim})
    bucket = dims[0] if dims else inp.head_dim
    fixed = {db.DTYPE: DTYPE_INFO[inp.dtype].db_value, db.HEAD_DIM: bucket,
             "inputs$CAUSAL_TYPE": db.CAUSAL_TYPE_CAUSAL if inp.causal else 0,
             "inputs$ENABLE_DROPOUT": int(inp.dropout), "inputs$PADDED_HEAD": 0,
             "inputs$BIAS_TYPE": int(inp.bias)}
    # features the cases never use: 0, or NULL where the table keeps the column unset (bwd_kernel_fuse)
    unused = [cols.index(c) for c in ("inputs$USE_ALIBI", "inputs$INT8", "inputs$INT8_KV", "inputs$USE_P_SCALE")
              if c in cols]
    idx = {c: cols.index(c) for c in fixed}
    gi = cols.index(db.GPU)

    def rows_of(g: str) -> list[tuple]:
        return [r for r in rows if r[gi] == g and all(r[i] == fixed[c] for c, i in idx.items())
                and all(r[i] in (0, None) for i in unused)]

    def pick(cands: list[tuple]) -> tuple | None:
        if not cands or sq is None or sk is None:
            return None
        qi, ki = cols.index(sq), cols.index(sk)
        bq = _bin({r[qi] for r in cands}, inp.seqlen_q)
        bk = _bin({r[ki] for r in cands if r[qi] == bq}, inp.seqlen_k)
        hits = [r for r in cands if r[qi] == bq and r[ki] == bk]
        return hits[-1] if hits else None   # duplicate keys: upstream's LUT keeps the last row

    row = pick(rows_of(gpu))
    if row is None:
        m.note = f"no {gpu} row for these inputs in {db.table_of(cfg.kernel)}"
        return m
    m.row_id = row[cols.index("id")] if "id" in cols else None
    m.key = {c: row[cols.index(c)] for c in cols if c.startswith(db.INPUT_PREFIX) or c == db.GPU}
    m.want = _spell(cols, row)
    for g in sorted({r[gi] for r in rows} - {gpu}):
        other = pick(rows_of(g))
        if other is not None and _spell(cols, other) == m.want:
            m.same_config_gpus.append(g)
    return m


def case_inputs(case) -> Inputs:
    """A dispatch.DispatchCase -> the inputs the LUT is indexed by."""
    s = case.shape
    return Inputs(case.dtype, case.head_dim, case.causal, case.dropout > 0, case.bias, s.seqlen_q, s.seqlen_k)


def match_report(tdb: TuningDatabase, gpu: str, cases: list, results: list) -> list[RowMatch]:
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
                m = match_row(tdb, gpu, stem, case_inputs(case), case=res.case, phase=phase)
                if m is not None:
                    out.append(m)
    return out


def summary(matches: list[RowMatch], gpu: str) -> tuple[bool, str]:
    """(ok, one line): every launched tuned kernel has the configuration of `gpu`'s row."""
    bad = [m for m in matches if not m.ok]
    shared = sum(1 for m in matches if m.ok and m.same_config_gpus)
    others = sorted({g for m in matches for g in m.same_config_gpus})
    line = (f"{len(matches) - len(bad)} of {len(matches)} tuned launches have the configuration of the "
            f"{gpu} row for their inputs")
    if matches and not bad:
        line += (f"; {shared} of them would get the same configuration from a row of {', '.join(others)}"
                 if shared else "; no other GPU's row gives any of them")
    if bad:
        b = bad[0]
        line += f"; first mismatch: {b.case} {b.family}: launched {b.got}, row {b.want or b.note}"
    return bool(matches) and not bad, line


__all__ = ["Inputs", "RowMatch", "StemConfig", "TuningDatabase", "case_inputs", "match_report", "match_row",
           "parse_stem", "summary", "tree_database"]
