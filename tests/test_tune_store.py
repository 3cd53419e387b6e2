"""tune's results on disk (CPU): sorted, deterministic CSV flushed per entry; winners picked
from passing configs only; the committed tuning/gfx908 CSV becomes render rows and upstream
database rows."""

from __future__ import annotations

import sqlite3
import tarfile

import pytest

from codegen.core.errors import UserError
from codegen.models import KernelConfig
from codegen.render.inputs import render_overlay
from codegen.core.resources import data_dir
from codegen.formats.spec import load_spec
from codegen.gpu.tune.grid import GridEntry
from codegen.gpu.tune.store import Provenance, ResultStore, config_columns, entry_columns, pick_winner
from codegen.models.rows import Winner
from codegen.formats.tuning_csv import (
    WINNER_COLUMNS,
    load_winner_rows,
    read_csv,
)
from codegen.formats.tuning_db import winner_row


def db_row(row: dict) -> tuple[str, dict]:
    """A CSV winner row as upstream's table and columns (the one mapping: upstream.tuning_db)."""
    return winner_row(Winner(**row))

PROV = Provenance("Test GPU", "nvidia-proxy", "3.6.0", "2.11.0", "2026-11-21")


def _rows(entry: GridEntry, timings: list[tuple[int, int, int, str, float | str]]) -> list[dict]:
    out = []
    for bm, bn, wpe, status, t in timings:
        cfg = KernelConfig(entry.family, entry.arch, entry.dtype, entry.head_dim, bm, bn, wpe, 4, 1,
                           False if entry.family == "attn_fwd" else None)
        out.append({**entry_columns(entry, "gfx908_mod0"), **config_columns(cfg), "status": status,
                    "time_ms": t, "errors": "out=1e-4/1e-3", "same_kernel_as": "", **PROV.as_dict()})
    return out


E1 = GridEntry("attn_fwd", "gfx908", "fp16", 64, True, False, False, 1024, 1024)
E2 = GridEntry("bwd_kernel_dq", "gfx908", "bf16", 32, False, False, False, 128, 256)


def test_winner_is_fastest_passing_config():
    rows = _rows(E1, [(64, 32, 1, "ok", 0.5), (128, 64, 1, "numerics", 0.1), (64, 64, 1, "ok", 0.3),
                      (64, 64, 2, "ok", 0.3), (32, 16, 1, "error", "")])
    best = pick_winner(rows)
    assert best["config"] == "attn_fwd.gfx908.fp16.d64.M64N64.wpe1.w4.s1.plv0"  # tie -> lower wpe
    assert pick_winner([r for r in rows if r["status"] != "ok"]) is None


def test_record_flushes_sorted_csv_and_replaces_entries(tmp_path):
    with ResultStore(tmp_path) as st:
        st.record(E2, _rows(E2, [(32, 16, 1, "ok", 0.2), (64, 32, 1, "ok", 0.1)]), 2)
        st.record(E1, _rows(E1, [(64, 32, 1, "ok", 0.5)]), 1)
        first = (tmp_path / "measurements.csv").read_bytes(), (tmp_path / "winners.csv").read_bytes()
        # recording the same results again is byte-identical (write-if-changed)
        st.record(E1, _rows(E1, [(64, 32, 1, "ok", 0.5)]), 1)
        assert ((tmp_path / "measurements.csv").read_bytes(), (tmp_path / "winners.csv").read_bytes()) == first
        st.record(E1, _rows(E1, [(128, 64, 1, "ok", 0.4)]), 1)  # re-measured: replaces
    meas = read_csv(tmp_path / "measurements.csv")
    assert [r["entry"] for r in meas] == [E1.name, E2.name, E2.name]  # sorted by key, config
    assert [r["config"] for r in meas if r["entry"] == E1.name] == [
        "attn_fwd.gfx908.fp16.d64.M128N64.wpe1.w4.s1.plv0"]
    win = read_csv(tmp_path / "winners.csv")
    assert len(win) == 2 and {w["entry"] for w in win} == {E1.name, E2.name}
    assert [w["block_m"] for w in win if w["entry"] == E2.name] == [64]
    text = (tmp_path / "winners.csv").read_text()
    assert text.endswith("\n") and "\r" not in text
    assert text.splitlines()[0].split(",")[: len(WINNER_COLUMNS)] == list(WINNER_COLUMNS)
    for col in ("triton", "torch", "date", "device", "proxy"):
        assert col in text.splitlines()[0].split(",")
    assert ResultStore(tmp_path).done_entries() == {E1.name, E2.name}


def test_store_is_locked_while_a_run_writes(tmp_path):
    with ResultStore(tmp_path):
        with pytest.raises(UserError, match="another tune run"):
            with ResultStore(tmp_path):
                pass
    with ResultStore(tmp_path):  # released
        pass


def _proxy_spec(tmp_path):
    text = (data_dir("rules") / "mi100.yaml").read_text()
    assert "use_proxy_measurements: false" in text
    path = tmp_path / "proxy.yaml"
    path.write_text(text.replace("use_proxy_measurements: false", "use_proxy_measurements: true"))
    return load_spec(path)


def test_committed_proxy_results_become_render_rows(tmp_path):
    default = load_spec(None).spec
    folder = data_dir("tuning") / default.arch
    winners = read_csv(folder / "winners.csv")
    if not winners:
        pytest.skip("no committed tuning results")
    # proxy (NVIDIA) winners never replace the target's rows unless the spec opts in
    assert load_winner_rows(folder, default) == []
    assert render_overlay(load_spec(None)).rows.to_json()["measured"] == []
    loaded = _proxy_spec(tmp_path)
    spec = loaded.spec
    rows = load_winner_rows(folder, spec)
    assert len(rows) == len(winners) and all(set(r) <= set(WINNER_COLUMNS) for r in rows)
    assert all(r["proxy"] for r in rows), "NVIDIA results must be labelled as proxies"
    assert render_overlay(loaded).rows.to_json()["measured"] == rows
    # every committed winner is the fastest passing measurement of its entry, from the spec space
    meas = read_csv(folder / "measurements.csv")
    space = {c.name for cfgs in __import__("codegen.models", fromlist=["x"]).expand_space(spec).values() for c in cfgs}
    for w in winners:
        ok = [m for m in meas if m["entry"] == w["entry"] and m["status"] == "ok"]
        assert w["time_ms"] == min(m["time_ms"] for m in ok)
        assert w["config"] in space


def test_dropout_and_bias_winners_become_their_rows(tmp_path):
    """Rows tune measures for dropout and bias entries are render rows like the others (proxy
    ones only where the spec opts in) and land on upstream's ENABLE_DROPOUT / BIAS_TYPE keys."""
    e_db = GridEntry("bwd_kernel_dq", "gfx908", "fp16", 64, False, True, True, 1024, 1024)
    e_cd = GridEntry("attn_fwd", "gfx908", "fp16", 64, True, True, False, 512, 512)
    out = tmp_path / "out"
    with ResultStore(out) as st:
        st.record(e_db, _rows(e_db, [(64, 32, 1, "ok", 0.4), (32, 16, 1, "timeout", "")]), 2)
        st.record(e_cd, _rows(e_cd, [(64, 32, 1, "crash", ""), (64, 64, 1, "ok", 0.2)]), 2)
    assert load_winner_rows(out, load_spec(None).spec) == []  # proxy rows, the MI100 spec does not opt in
    rows = load_winner_rows(out, _proxy_spec(tmp_path).spec)
    got = {(r["family"], r["causal"], r["dropout"], r["bias"]): r for r in rows}
    assert set(got) == {("bwd_kernel_dq", 0, 1, 1), ("attn_fwd", 1, 1, 0)}
    assert got[("attn_fwd", 1, 1, 0)]["block_n"] == 64  # the crashed candidate never wins
    table, cols = db_row(got[("bwd_kernel_dq", 0, 1, 1)])
    assert table == "FLASH$bwd_kernel_dq"
    assert cols["inputs$ENABLE_DROPOUT"] == 1 and cols["inputs$BIAS_TYPE"] == 1
    table, cols = db_row(got[("attn_fwd", 1, 1, 0)])
    assert cols["inputs$ENABLE_DROPOUT"] == 1 and cols["inputs$BIAS_TYPE"] == 0 and cols["inputs$CAUSAL_TYPE"] == 3


def test_db_row_uses_upstream_columns():
    table, cols = db_row({"gpu": "gfx908_mod0", "family": "attn_fwd", "dtype": "bf16", "head_dim": 64,
                          "causal": 1, "dropout": 0, "bias": 0, "seqlen_q": 4096, "seqlen_k": 2048,
                          "block_m": 128, "block_n": 64, "waves_per_eu": 1, "num_warps": 4,
                          "num_stages": 1, "pre_load_v": 0})
    assert table == "FLASH$attn_fwd"
    assert cols["inputs$Q_dtype"] == "torch.bfloat16" and cols["inputs$CAUSAL_TYPE"] == 3
    assert cols["inputs$Max_seqlen_q"] == 4096 and cols["tuned_kernel$PERSISTENT_TYPE"] == 2
    table, cols = db_row({"gpu": "gfx908_mod0", "family": "bwd_kernel_dk_dv", "dtype": "fp16",
                          "head_dim": 32, "causal": 0, "dropout": 0, "bias": 0, "seqlen_q": 16,
                          "seqlen_k": 16, "block_m": 32, "block_n": 16, "waves_per_eu": 2,
                          "num_warps": 4, "num_stages": 1, "pre_load_v": ""})
    assert table == "FLASH$bwd_kernel_dk_dv" and "inputs$max_seqlen_q" in cols
    assert "tuned_kernel$PRE_LOAD_V" not in cols and "inputs$USE_ALIBI" not in cols


@pytest.mark.aotriton
def test_committed_winners_upsert_into_upstream_database(pristine_tree, tmp_path):
    """The measured rows replace seeded (donor) rows on upstream's UNIQUE key of 0.11b's DB."""
    spec = _proxy_spec(tmp_path).spec
    rows = load_winner_rows(data_dir("tuning") / spec.arch, spec)
    if not rows:
        pytest.skip("no committed tuning results")
    tree = pristine_tree("0.11b")
    with tarfile.open(tree / "v3python/rules/tuning_database.sqlite3.tar.xz") as tf:
        if hasattr(tarfile, "data_filter"):
            tf.extractall(tmp_path, filter="data")
        else:  # Python without extraction filters
            tf.extractall(tmp_path)
    con = sqlite3.connect(tmp_path / "tuning_database.sqlite3")
    tables = {}
    for table in sorted({db_row(r)[0] for r in rows}):
        names = [c[1] for c in con.execute(f'PRAGMA table_info("{table}")')]
        tables[table] = names
        # seed gfx908 from the donor, as the overlay does
        other = [n for n in names if n not in ("id", "gpu")]
        q = ", ".join(f'"{n}"' for n in other)
        con.execute(f'INSERT INTO "{table}" (gpu, {q}) SELECT \'gfx908_mod0\', {q} FROM "{table}" '
                    f"WHERE gpu = 'gfx90a_mod0'")
    before = {t: con.execute(f'SELECT COUNT(*) FROM "{t}" WHERE gpu = \'gfx908_mod0\'').fetchone()[0]
              for t in tables}
    for r in rows:
        table, cols = db_row(r)
        assert set(cols) <= set(tables[table]), set(cols) - set(tables[table])
        key = [c for c in cols if c == "gpu" or c.startswith("inputs$")]
        where = " AND ".join(f'"{c}" IS ?' for c in key)
        deleted = con.execute(f'DELETE FROM "{table}" WHERE {where}', [cols[c] for c in key]).rowcount
        # the donor has rows for every input, except fused-backward ones above seqlen 1024
        # (0.11b routes long sequences to the split kernels): those are new rows
        assert deleted >= 1 or (table == "FLASH$bwd_kernel_fuse" and r["seqlen_q"] > 1024), cols
        before[table] += 1 - deleted
        names = ", ".join(f'"{c}"' for c in cols)
        con.execute(f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(cols))})',
                    list(cols.values()))
    after = {t: con.execute(f'SELECT COUNT(*) FROM "{t}" WHERE gpu = \'gfx908_mod0\'').fetchone()[0]
             for t in tables}
    assert after == before
    for r in rows:
        table, cols = db_row(r)
        where = " AND ".join(f'"{c}" IS ?' for c in cols if c == "gpu" or c.startswith("inputs$"))
        got = con.execute(f'SELECT "tuned_kernel$BLOCK_M", "tuned_kernel$BLOCK_N", '
                          f'"compiler_options$num_stages" FROM "{table}" WHERE {where}',
                          [v for c, v in cols.items() if c == "gpu" or c.startswith("inputs$")]).fetchall()
        assert got == [(r["block_m"], r["block_n"], r["num_stages"])]
