"""Tuning-row derivation: caps, measured overrides, NULL-safe upserts, completeness, bytes."""

from __future__ import annotations

import sqlite3
import tarfile
import io
import lzma

import pytest

from codegen.apply.dbrows import DonorError, build_db, db_targets, upsert
from codegen.formats.tuning_db import read_archive, write_archive
from fake_tree import make_fake_tree
from codegen.models.rows import RowsPlan
from codegen.upstream import detect

ROWS = {
    "gpus": ["gfx908_mod0"], "donor_gpu": "gfx90a_mod0", "head_dims": [32, 64], "dtypes": ["bf16", "fp16", "fp32"],
    "waves_per_eu_caps": [{"block_m": 128, "block_n": 64, "max_waves_per_eu": 1, "family": None, "dtype": None,
                           "head_dim": None, "reason": "spills"}],
    "default_max_waves_per_eu": None, "measured": [],
}


def _query(content: bytes, sql: str, tmp_path):
    _, payload = read_archive(content, "x")
    p = tmp_path / "q.sqlite3"
    p.write_bytes(payload)
    conn = sqlite3.connect(p)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
        p.unlink()


def _build(tree, rows, kernel="attn_fwd"):
    a = detect(tree)
    ls = lambda rel: sorted(x.name for x in (tree / rel).iterdir()) if (tree / rel).is_dir() else []  # noqa: E731
    rows = RowsPlan.from_json(rows, "gfx908")
    targets = {t["path"]: t for t in db_targets(a, rows, None, ls)}
    t = targets[a.shard_path("gfx908", kernel)]
    return build_db(t, lambda rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None, rows)


def test_caps_default_cap_and_measured_override(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    rows = dict(ROWS, default_max_waves_per_eu=0, measured=[{
        "gpu": "gfx908_mod0", "family": "attn_fwd", "dtype": "fp16", "head_dim": 64, "causal": 0, "dropout": 0,
        "bias": 0, "seqlen_q": 128, "seqlen_k": 128, "block_m": 32, "block_n": 16, "waves_per_eu": 3,
        "num_warps": 2, "num_stages": 1, "pre_load_v": "True"}])
    out = _build(tree, rows)
    st = out.tables["FLASH$attn_fwd"]
    assert st.rows_written == st.donor_rows == 144 and st.measured_overrides == 1
    got = _query(out.content, 'SELECT "tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N", "tuned_kernel$PRE_LOAD_V", '
                 '"compiler_options$waves_per_eu", "compiler_options$num_warps" FROM "FLASH$attn_fwd" WHERE '
                 '"inputs$Q_dtype"=\'torch.float16\' AND "inputs$BLOCK_DMODEL"=64 AND "inputs$max_seqlen_q"=128 '
                 'AND "inputs$max_seqlen_k"=128 AND "inputs$CAUSAL_TYPE"=0 AND "inputs$ENABLE_DROPOUT"=0 '
                 'AND "inputs$BIAS_TYPE"=0', tmp_path)
    assert got == [(32, 16, 1, 3, 2)]  # measured winner, not capped
    waves = _query(out.content, 'SELECT DISTINCT "compiler_options$waves_per_eu" FROM "FLASH$attn_fwd"', tmp_path)
    assert set(waves) == {(0,), (3,)}  # default cap 0 everywhere else


def test_missing_head_dim_in_donor_is_refused(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    with pytest.raises(DonorError, match="no FLASH\\$attn_fwd rows for torch.bfloat16 hd128, torch.float16 hd128"):
        _build(tree, dict(ROWS, head_dims=[32, 128]))


def test_null_safe_upsert_last_row_wins(tmp_path):
    conn = sqlite3.connect(tmp_path / "u.sqlite3")
    conn.execute('CREATE TABLE t (id INTEGER PRIMARY KEY, gpu TEXT, a INTEGER, v INTEGER, UNIQUE(gpu, a))')
    conn.execute("INSERT INTO t (gpu, a, v) VALUES ('x', NULL, 1), ('y', NULL, 5)")
    n = upsert(conn, "t", ["gpu", "a", "v"], ["gpu", "a"], [("x", None, 2), ("x", None, 3), ("x", 1, 4)])
    assert n == 2
    assert conn.execute("SELECT gpu, a, v FROM t ORDER BY gpu, a").fetchall() == \
        [("x", None, 3), ("x", 1, 4), ("y", None, 5)]


def test_tarball_is_deterministic_and_normalised():
    a, b = write_archive("x.sqlite3", b"payload"), write_archive("x.sqlite3", b"payload")
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(a))) as t:
        (m,) = t.getmembers()
        assert (m.name, m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == ("x.sqlite3", 0, 0, 0, "", "", 0o644)
    assert read_archive(a, "x") == ("x.sqlite3", b"payload")


def test_same_inputs_same_bytes(tmp_path):
    tree = make_fake_tree(tmp_path / "t", (0, 12, 0))
    assert _build(tree, ROWS).content == _build(tree, ROWS).content


def _all_rows(content: bytes, tmp_path) -> dict:
    _, payload = read_archive(content, "x")
    p = tmp_path / "all.sqlite3"
    p.write_bytes(payload)
    conn = sqlite3.connect(p)
    try:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        return {n: conn.execute(f'SELECT * FROM "{n}" ORDER BY rowid').fetchall() for n in names}
    finally:
        conn.close()
        p.unlink()


@pytest.mark.parametrize("version", [(0, 11, 0), (0, 12, 0)])
def test_file_workspace_writes_the_same_rows_as_memory(tmp_path, monkeypatch, version):
    """Pythons without Connection.serialize (3.10) rewrite the databases in a temporary folder:
    the same rows (a new shard's header may differ: the input key says which path ran), and the
    same bytes twice."""
    from codegen.apply import dbrows

    tree = make_fake_tree(tmp_path / "t", version)
    a = detect(tree)
    rows = RowsPlan.from_json(ROWS, "gfx908")
    ls = lambda rel: sorted(x.name for x in (tree / rel).iterdir()) if (tree / rel).is_dir() else []  # noqa: E731
    read = lambda rel: (tree / rel).read_bytes() if (tree / rel).is_file() else None  # noqa: E731
    targets = db_targets(a, rows, None, ls)
    mem = [build_db(t, read, rows) for t in targets]
    key_mem = dbrows.input_key(targets[0], {}, rows)
    monkeypatch.setattr(dbrows, "SQLITE_IN_MEMORY", False)
    files = [build_db(t, read, rows) for t in targets]
    assert [o.content for o in files] == [build_db(t, read, rows).content for t in targets]
    for m, f in zip(mem, files):
        assert _all_rows(m.content, tmp_path) == _all_rows(f.content, tmp_path)
        assert {k: v.as_dict() for k, v in m.tables.items()} == {k: v.as_dict() for k, v in f.tables.items()}
    assert dbrows.input_key(targets[0], {}, rows) != key_mem
