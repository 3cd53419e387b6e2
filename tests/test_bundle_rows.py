"""codegen/ship/rows.py on a small tuning database: the row a case's inputs select (seqlen
bins, flags, NULL extras), the launched stem's configuration against it, other GPUs' rows that
give the same configuration, and a tree without a database refused; the rows a bundle carries
(tuning-rows.json): the same lookups as the tree's, hostile content refused, a tree's rows
compared with them, and the tuning-rows claim of `bundle check` from each source. The real
bundle's rows: tests/test_bundle_real.py."""

from __future__ import annotations

import io
import json
import shutil
import sqlite3
import tarfile
from pathlib import Path

import pytest

from codegen.ship import rows as rows_mod
from codegen.formats.bundle_zip import BundleError
from codegen.models.functional import Functional
from codegen.ship.rows import (ROWS as MEMBER, carried_database, carry_rows, match_row, parse_stem,
                                 read_rows, summary, tree_database)
from codegen.core.errors import UserError
from codegen.models.image_name import ENTRY, SIG

SMOKE = Path(__file__).resolve().parents[1] / "rules" / "examples" / "smoke.yaml"

COLS = ["id", "gpu", "inputs$Q_dtype", "inputs$Max_seqlen_q", "inputs$Max_seqlen_k", "inputs$CAUSAL_TYPE",
        "inputs$BLOCK_DMODEL", "inputs$ENABLE_DROPOUT", "inputs$PADDED_HEAD", "inputs$BIAS_TYPE", "inputs$USE_ALIBI",
        "tuned_kernel$PERSISTENT_TYPE", "tuned_kernel$GRID_CU_MULTIP", "tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N",
        "tuned_kernel$PRE_LOAD_V", "compiler_options$waves_per_eu", "compiler_options$num_warps",
        "compiler_options$num_stages"]


def _archive(path: Path, rows: list[tuple], cols: list[str] = COLS) -> None:
    """One sqlite database of a FLASH$attn_fwd table, tar.xz'd as upstream ships it."""
    conn = sqlite3.connect(":memory:")
    conn.execute('create table "FLASH$attn_fwd" (' + ", ".join(f'"{c}"' for c in cols) + ")")
    conn.executemany(f'insert into "FLASH$attn_fwd" values ({", ".join("?" * len(cols))})', rows)
    conn.commit()
    data = conn.serialize()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:xz") as t:
        info = tarfile.TarInfo(path.name.removesuffix(".tar.xz"))
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))


def _tree(tmp_path: Path, rows: list[tuple]) -> Path:
    tree = tmp_path / "tree"
    _archive(tree / "v3python/rules/tuning_database.sqlite3.tar.xz", rows)
    return tree


def _row(i, gpu, sq, sk, m, n, wpe, causal=0, alibi=0):
    return (i, gpu, "torch.float16", sq, sk, causal, 64, 0, 0, 0, alibi, 0, 2, m, n, 0, wpe, 4, 1)


def _stem(m, n, wpe):
    return (f"amd-gfx908/flash/attn_fwd/FONLY__x/attn_fwd-Sig-F__＊fp16@16_F_F_0_0__P__0_2_{m}_{n}_False"
            f"__CO__wave{wpe}_warp4_stg1--Arch_gfx908")


ROWS = [_row(1, "gfx908_mod0", 128, 128, 64, 32, 1), _row(2, "gfx908_mod0", 128, 256, 64, 64, 1),
        _row(3, "gfx908_mod0", 256, 128, 128, 64, 1), _row(4, "gfx908_mod0", 256, 256, 32, 16, 1),
        _row(5, "gfx90a_mod0", 128, 128, 64, 32, 2), _row(6, "gfx90a_mod0", 128, 256, 64, 64, 1),
        _row(7, "gfx90a_mod0", 256, 128, 128, 64, 2), _row(8, "gfx90a_mod0", 256, 256, 32, 16, 2)]


def test_parse_stem():
    c = parse_stem(_stem(64, 32, 1), SIG)
    assert c.kernel == "attn_fwd" and c.perf == ("0", "2", "64", "32", "False")
    assert (c.waves_per_eu, c.num_warps, c.num_stages) == (1, 4, 1) and str(c) == _stem(64, 32, 1).rsplit("/", 1)[1]
    assert parse_stem("not-a-stem", SIG) is None and parse_stem(_stem(64, 32, 1), ENTRY) is None


@pytest.mark.parametrize("sq,sk,row,m,n", [(97, 211, 2, 64, 64), (1, 1, 1, 64, 32), (211, 97, 3, 128, 64),
                                          (5000, 5000, 4, 32, 16), (256, 128, 3, 128, 64)])
def test_bins_pick_the_row_and_config(tmp_path, sq, sk, row, m, n):
    tdb = tree_database(_tree(tmp_path, ROWS))
    got = match_row(tdb, "gfx908_mod0", _stem(m, n, 1), Functional("fp16", 64, False, False, False, sq, sk), SIG)
    assert got.ok and got.row_id == row and got.key["gpu"] == "gfx908_mod0"
    assert got.want == f"0_2_{m}_{n}_0|wave1_warp4_stg1"
    # the donor's row gives the same config only where its waves_per_eu is also 1 (row 6)
    assert got.same_config_gpus == (["gfx90a_mod0"] if row == 2 else [])


def test_a_donor_config_is_a_mismatch(tmp_path):
    tdb = tree_database(_tree(tmp_path, ROWS))
    got = match_row(tdb, "gfx908_mod0", _stem(64, 32, 2), Functional("fp16", 64, False, False, False, 100, 100), SIG,
                    case="c", phase="fwd")
    assert not got.ok and got.row_id == 1 and got.got == "0_2_64_32_0|wave2_warp4_stg1"
    ok, line = summary([got], "gfx908_mod0")
    assert not ok and "first mismatch: c attn_fwd: launched 0_2_64_32_0|wave2_warp4_stg1" in line


def test_no_row_and_null_extras(tmp_path):
    rows = [_row(1, "gfx908_mod0", 128, 128, 64, 32, 1, alibi=None), _row(2, "gfx90a_mod0", 128, 128, 64, 32, 1)]
    tdb = tree_database(_tree(tmp_path, rows))
    inp = Functional("fp16", 64, False, False, False, 100, 100)
    got = match_row(tdb, "gfx908_mod0", _stem(64, 32, 1), inp, SIG)
    assert got.ok and got.same_config_gpus == ["gfx90a_mod0"]
    ok, line = summary([got], "gfx908_mod0")
    assert ok and "1 of them would get the same configuration from a row of gfx90a_mod0" in line
    causal = match_row(tdb, "gfx908_mod0", _stem(64, 32, 1), Functional("fp16", 64, True, False, False, 100, 100), SIG)
    assert not causal.ok and "no gfx908_mod0 row" in causal.note
    assert match_row(tdb, "gfx908_mod0", _stem(64, 32, 1).replace("attn_fwd-Sig", "bwd_preprocess-Sig"), inp, SIG) is None


def test_a_tree_without_a_database(tmp_path):
    with pytest.raises(UserError, match="no tuning database"):
        tree_database(tmp_path)


def test_a_0_13b_stem_by_field_names(tmp_path):
    """0.13b's image index names kernels `<pack>/flash/<kernel>/<member>/<stem>` with named perf
    fields (one the table lacks, NUM_XCDS, is not part of the row)."""
    tdb = tree_database(_tree(tmp_path, ROWS))
    stem = ("amd-gfx908/flash/attn_fwd/Q='*fp16:16';CAUSAL_TYPE=0/;;#F;Q='*fp16:16';CAUSAL_TYPE=0;;#P;"
            "PERSISTENT_TYPE=0;GRID_CU_MULTIP=2;BLOCK_M=64;BLOCK_N=32;PRE_LOAD_V=False;NUM_XCDS=1;;"
            "#CO;waves_per_eu=1;num_warps=4;num_stages=1;;arch=gfx908")
    cfg = parse_stem(stem, ENTRY)
    assert cfg.kernel == "attn_fwd" and cfg.named_perf["NUM_XCDS"] == "1" and (cfg.waves_per_eu, cfg.num_warps) == (1, 4)
    got = match_row(tdb, "gfx908_mod0", stem, Functional("fp16", 64, False, False, False, 100, 100), ENTRY)
    assert got.ok and got.row_id == 1 and got.got == "0_2_64_32_0|wave1_warp4_stg1"
    worse = match_row(tdb, "gfx908_mod0", stem.replace("BLOCK_M=64", "BLOCK_M=128"),
                      Functional("fp16", 64, False, False, False, 100, 100), ENTRY)
    assert not worse.ok


def test_a_linked_database_is_refused(tmp_path):
    real = _tree(tmp_path, ROWS)
    tree = tmp_path / "linked"
    (tree / "v3python" / "rules").mkdir(parents=True)
    (tree / "v3python/rules/tuning_database.sqlite3.tar.xz").symlink_to(real / "v3python/rules/tuning_database.sqlite3.tar.xz")
    with pytest.raises(UserError, match="symbolic link"):
        tree_database(tree)
    shards = tmp_path / "sharded"
    (shards / "v3python" / "database").mkdir(parents=True)
    (shards / "v3python/database/amd").symlink_to(real / "v3python/rules", target_is_directory=True)
    with pytest.raises(UserError, match="no tuning database"):
        tree_database(shards)                       # a linked shard folder is not walked


@pytest.mark.parametrize("db", ["v3python/database", "modules/database", "modules/flash/database"])
def test_sharded_layouts_are_read(tmp_path, db):
    """0.11.1b-0.12.1b, 0.13b and main keep a schema-only central archive and per-arch shards below
    its folder (each layout where codegen.upstream says); a shard may order its columns its own way."""
    tree = tmp_path / "tree"
    _archive(tree / db / "tuning_database.sqlite3.tar.xz", [])
    _archive(tree / db / "amd/gfx908/flash/attn_fwd.sqlite3.tar.xz", ROWS[:4])
    swapped = COLS[:1] + COLS[2:3] + COLS[1:2] + COLS[3:]            # gpu and Q_dtype swapped
    _archive(tree / db / "amd/gfx90a/flash/attn_fwd.sqlite3.tar.xz",
             [r[:1] + r[2:3] + r[1:2] + r[3:] for r in ROWS[4:]], swapped)
    _archive(tree / db / "op_database.sqlite3.tar.xz", [_row(99, "gfx908_mod0", 128, 128, 16, 16, 9)])
    tdb = tree_database(tree)
    got = match_row(tdb, "gfx908_mod0", _stem(64, 64, 1), Functional("fp16", 64, False, False, False, 97, 211), SIG)
    assert got.ok and got.row_id == 2 and got.same_config_gpus == ["gfx90a_mod0"]
    assert len(tdb.family("attn_fwd").rows) == len(ROWS)                # the op database is not read


def test_cli_refuses_a_tree_without_a_database_first(tmp_path):
    """`bundle check FILE --tree DIR`: a tree without a database is one message, exit 2, before
    the bundle is even opened."""
    from typer.testing import CliRunner

    from codegen.cli import app

    r = CliRunner().invoke(app, ["bundle", "check", str(tmp_path / "missing.zip"), "--tree", str(tmp_path)])
    assert r.exit_code == 2 and "no tuning database" in r.output and "Traceback" not in r.output


def test_a_padded_head_reads_its_buckets_unpadded_row(tmp_path):
    """Head dim 56 runs in the 64 bucket (the table's next BLOCK_DMODEL, not a power of two: 48
    exists too), read from the PADDED_HEAD=0 row as upstream looks it up."""
    rows = ROWS + [(9, "gfx908_mod0", "torch.float16", 128, 128, 0, 48, 0, 0, 0, 0, 0, 2, 16, 16, 0, 1, 4, 1)]
    tdb = tree_database(_tree(tmp_path, rows))
    got = match_row(tdb, "gfx908_mod0", _stem(64, 32, 1), Functional("fp16", 56, False, False, False, 100, 100), SIG)
    assert got.ok and got.row_id == 1 and got.key["inputs$BLOCK_DMODEL"] == 64
    d48 = match_row(tdb, "gfx908_mod0", _stem(16, 16, 1), Functional("fp16", 40, False, False, False, 100, 100), SIG)
    assert d48.ok and d48.row_id == 9


def test_a_functional_column_a_release_adds_is_a_feature_left_off(tmp_path):
    """A release whose tables gain an `inputs$` column (here USE_SINK) needs nothing new: the lookup
    (codegen.formats.tuning_db.Table.lookup) reads it as a feature the cases leave off, 0 or NULL,
    in the tree's rows and in the rows a bundle carries, whatever the rows' order."""
    cols = COLS[:11] + ["inputs$USE_SINK"] + COLS[11:]
    on = _row(7, "gfx908_mod0", 128, 128, 128, 64, 2)
    rows = [r[:11] + (1,) + r[11:] for r in [on]] + [r[:11] + (s,) + r[11:] for r, s in zip(ROWS[:4], (0, None, 0, 0))]
    tree = tmp_path / "tree"
    _archive(tree / "v3python/rules/tuning_database.sqlite3.tar.xz", rows + rows[:1], cols)   # the sink row last too
    tdb = tree_database(tree)
    for t in (tdb, carried_database(carry_rows(tdb, ["gfx908_mod0"]))):
        got = match_row(t, "gfx908_mod0", _stem(64, 32, 1), Functional("fp16", 64, False, False, False, 100, 100), SIG)
        assert got.ok and got.row_id == 1 and got.key["inputs$USE_SINK"] == 0
        assert match_row(t, "gfx908_mod0", _stem(64, 64, 1), Functional("fp16", 64, False, False, False, 100, 200),
                         SIG).key["inputs$USE_SINK"] is None


@pytest.mark.aotriton
@pytest.mark.parametrize("tag", ["0.11b", "0.12b", "0.13b", "0.14.0-dev"])
def test_each_release_layouts_database_is_read(pristine_tree, tag):
    """The detected release's place: the central archive (0.11b), v3python/database shards (0.12b),
    modules/database (0.13b), modules/flash/database (main): the donor's attn_fwd rows are there."""
    tdb = tree_database(pristine_tree(tag))
    t = tdb.family("attn_fwd")
    assert sum(r[t.columns.index("gpu")] == "gfx90a_mod0" for r in t.rows) > 1000



# --- the rows a bundle carries ------------------------------------------------------------------
def _carried(tmp_path: Path, rows: list[tuple] = ROWS) -> bytes:
    return carry_rows(tree_database(_tree(tmp_path, rows)), ["gfx908_mod0"])


def test_carried_rows_give_the_trees_lookups(tmp_path):
    """The spec GPU's rows and every GPU's head-dim buckets are carried: each lookup gives the
    tree's row (here a 48 bucket only the donor has sends head dim 40 to no gfx908 row in both);
    other GPUs are not named, and the summary says they are not carried."""
    rows = ROWS + [(9, "gfx90a_mod0", "torch.float16", 128, 128, 0, 48, 0, 0, 0, 0, 0, 2, 16, 16, 0, 1, 4, 1)]
    tree = tree_database(_tree(tmp_path, rows))
    data = carry_rows(tree, ["gfx908_mod0"])
    assert data == carry_rows(tree_database(tmp_path / "tree"), ["gfx908_mod0"])      # deterministic
    kept = carried_database(data)
    assert kept.gpus == ("gfx908_mod0",) and kept.sources == ("v3python/rules/tuning_database.sqlite3.tar.xz",)
    assert len(kept.family("attn_fwd").rows) == 4 and kept.family("attn_fwd").head_dims == (48, 64)
    for sq, sk, head in [(97, 211, 64), (1, 1, 64), (5000, 5000, 64), (256, 128, 64), (100, 100, 40)]:
        inp = Functional("fp16", head, False, False, False, sq, sk)
        a, b = (match_row(t, "gfx908_mod0", _stem(64, 64, 1), inp, SIG) for t in (tree, kept))
        assert (a.ok, a.row_id, a.key, a.want, a.note) == (b.ok, b.row_id, b.key, b.want, b.note)
        assert b.same_config_gpus == []
    b = match_row(kept, "gfx908_mod0", _stem(64, 64, 1), Functional("fp16", 64, False, False, False, 97, 211), SIG)
    ok, line = summary([b], "gfx908_mod0", every_gpu=False)
    assert ok and "no other GPU's row" not in line and "other GPUs' rows are not carried: give --tree" in line


def _edit(data: bytes, change) -> bytes:
    doc = json.loads(data)
    change(doc, doc["tables"]["FLASH$attn_fwd"]["rows"][0])
    return json.dumps(doc).encode()


HOSTILE = {
    "not JSON": lambda doc, row: None,
    "a key twice": lambda doc, row: None,
    "another format": lambda doc, row: doc.update(format=2),
    "an unknown key": lambda doc, row: doc.update(extra=1),
    "a short row": lambda doc, row: row.pop(),
    "a seqlen as text": lambda doc, row: row.__setitem__(3, "128"),
    "a boolean option": lambda doc, row: row.__setitem__(18, True),
    "a row of a GPU it does not name": lambda doc, row: row.__setitem__(1, "gfx90a_mod0"),
    "a control character": lambda doc, row: row.__setitem__(2, "torch\x1b[2J"),
    "not a FLASH table": lambda doc, row: doc["tables"].update({"evil": doc["tables"].pop("FLASH$attn_fwd")}),
    "no gpu column": lambda doc, row: doc["tables"]["FLASH$attn_fwd"]["columns"].__setitem__(1, "gpux"),
    "a bad GPU name": lambda doc, row: doc.update(gpus=["\x1b[2J"]),
    "an absolute source": lambda doc, row: doc.update(sources=["/etc/passwd"]),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_carried_rows_are_one_message(tmp_path, case):
    data = _carried(tmp_path)
    bad = b"{" if case == "not JSON" else data.replace(b"{", b'{"gpus": [], ', 1) if case == "a key twice" \
        else _edit(data, HOSTILE[case])
    with pytest.raises(BundleError, match=r"b\.zip: tuning-rows\.json: not the tuning rows of a bundle \(") as e:
        carried_database(bad, f"b.zip: {MEMBER}")
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)


def test_oversized_carried_rows(tmp_path, monkeypatch):
    data = _carried(tmp_path)
    monkeypatch.setattr(rows_mod, "ROWS_LIMIT", len(data) - 1)
    with pytest.raises(BundleError, match="larger than"):
        carried_database(data)


def test_read_rows_from_a_tree_the_carried_rows_or_none(tmp_path):
    data = _carried(tmp_path)
    none = read_rows()
    assert none.db is None and not none.carried
    kept = read_rows(carried=data)
    assert kept.carried and kept.db.gpus == ("gfx908_mod0",) and kept.differ == ()
    same = read_rows(tree=tmp_path / "tree", carried=data)
    assert same.carried and same.db.gpus is None and same.differ == ()
    changed = [ROWS[0][:13] + (128,) + ROWS[0][14:]] + ROWS[1:]              # row 1's BLOCK_M
    other = read_rows(tree=_tree(tmp_path / "b", changed), carried=data)
    assert other.differ == ("FLASH$attn_fwd 2 rows (4 in the tree, 4 carried)",)
    old = read_rows(tree=tmp_path / "tree")                                   # a bundle without rows
    assert old.db.gpus is None and not old.carried


def _report(tmp_path: Path):
    """A CheckReport of the smoke spec whose dispatch launched, for q97k211, the config of the
    gfx908 row its bins select (row 2: BLOCK_M 64, BLOCK_N 64)."""
    from codegen.formats.bundle_zip import manifest_of
    from codegen.ship.check import CheckReport
    from codegen.ship.dispatch import CaseResult, DispatchReport
    from test_bundle_units import minimal_manifest

    root = tmp_path / "bundle"
    root.mkdir(parents=True)
    shutil.copy(SMOKE, root / "spec.yaml")
    res = CaseResult("fp16.d64.full.b2h4k4.q97k211", 0, 0, {"fwd": [_stem(64, 64, 1)], "bwd": []})
    manifest = manifest_of(minimal_manifest({"lib/libaotriton_v2.so.0.11.0": b"x"}), "b.zip")
    return root, CheckReport("b.zip", manifest, dispatch=DispatchReport("gfx908", 6, 0, [res], 1))


def test_check_rows_from_each_source(tmp_path):
    from codegen.ship.check import NO_ROWS, check_rows

    data = _carried(tmp_path)
    root, rep = _report(tmp_path)
    check_rows(rep, root, read_rows())                                        # an old bundle, no --tree
    assert rep.rows_claim is None and rep.rows == [] and rep.rows_note == NO_ROWS
    assert rep.as_json()["tuning_rows"] is None and rep.as_json()["tuning_rows_note"] == NO_ROWS

    root, rep = _report(tmp_path / "c")
    check_rows(rep, root, read_rows(carried=data))
    c = rep.rows_claim
    assert c.ok and c.name == "tuned kernels from the gfx908_mod0 rows of the bundle's tuning-rows.json"
    assert "bundle's tuning-rows.json" in c.where and "not carried: give --tree" in c.detail
    assert [m.row_id for m in rep.rows] == [2]

    root, rep = _report(tmp_path / "t")
    check_rows(rep, root, read_rows(tree=tmp_path / "tree", carried=data))
    c = rep.rows_claim
    assert c.ok and c.name == "tuned kernels from the gfx908_mod0 rows of tree's database"
    assert "same as the bundle's tuning-rows.json" in c.where and "carries the same rows" in c.detail

    changed = [r if r[0] != 2 else r[:13] + (128,) + r[14:] for r in ROWS]   # row 2 is what q97k211 reads
    root, rep = _report(tmp_path / "d")
    check_rows(rep, root, read_rows(tree=_tree(tmp_path / "d", changed), carried=data))
    c = rep.rows_claim
    assert not c.ok and "the tree's rows differ from those the bundle carries (tuning-rows.json): " \
        "FLASH$attn_fwd 2 rows" in c.detail and "differ from the bundle's" in c.where


def test_a_table_that_numbers_no_rows(tmp_path):
    """0.13b's shards have no `id` column: a row found there is found (ok), only unnumbered."""
    tdb = tree_database(_tree(tmp_path, ROWS))
    for name, t in list(tdb.tables.items()):
        i = t.columns.index("id")
        tdb.tables[name] = type(t)([c for c in t.columns if c != "id"],
                                   [r[:i] + r[i + 1:] for r in t.rows]).with_head_dims()
    got = match_row(tdb, "gfx908_mod0", _stem(64, 32, 1), Functional("fp16", 64, False, False, False, 100, 100), SIG)
    assert got.ok and got.found and got.row_id is None
    missing = match_row(tdb, "gfx908_mod0", _stem(64, 32, 1), Functional("fp16", 64, True, False, False, 100, 100), SIG)
    assert not missing.ok and not missing.found and "no gfx908_mod0 row" in missing.note
