"""`tune import FILE` (CPU): upstream's raw tuning log (JSON lines of 0.10b/0.11b
test/tune_flash.py, as v2python/table_tool.py reads them) becomes measurements + winners."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.formats.spec import load_spec
from codegen.gpu.tune.importer import parse_records
from codegen.formats.tuning_csv import read_csv


def line(kernel="attn_fwd", arch="gfx908", dtype="float16", d_head=64, sq=1024, sk=1024,
         causal=True, bm=128, bn=64, wpe=1, warps=4, stages=1, time=(0.5, 0.45, 0.55),
         passed=True, task=0, index=0, result="tuned", adiffs=0.001):
    """One record as mptune's DbService.translate_config writes it (FlashTunerSource inputs)."""
    tk = {"BLOCK_M": bm, "BLOCK_N": bn}
    if kernel == "attn_fwd":
        tk = {"PERSISTENT_TYPE": 2 if causal else 0, "GRID_CU_MULTIP": 2, **tk, "PRE_LOAD_V": False}
    return {
        "arch": arch, "kernel_name": kernel,
        "inputs": {"Q_dtype": dtype, "BATCH": 8, "N_HEADS": 12, "D_HEAD": d_head,
                   "Max_seqlen_q": sq, "Max_seqlen_k": sk, "CAUSAL_TYPE": causal,
                   "RETURN_ENCODED_SOFTMAX": False, "BLOCK_DMODEL": d_head, "ENABLE_DROPOUT": False,
                   "PADDED_HEAD": False, "BIAS_TYPE": 0, "USE_ALIBI": False, "INT8": False,
                   "INT8_KV": False, "USE_P_SCALE": False},
        "result": result, "tuned_kernel": tk,
        "compiler_options": {"waves_per_eu": wpe, "num_warps": warps, "num_stages": stages},
        "ut_passed": passed, "time": list(time) if isinstance(time, tuple) else time,
        "adiffs": adiffs, "target_fudge_factors": {"out": 1.0}, "sgpr_spill_count": 0,
        "vgpr_spill_count": 0, "hip_status": "hipError_t.hipSuccess",
        "_debug_kernel_index": index, "_debug_total_number_of_kernels": 3, "_debug_task_id": task,
    }


@pytest.fixture
def log(tmp_path):
    recs = [
        line(bm=128, bn=64, time=(0.50, 0.4, 0.6)),
        line(bm=64, bn=64, time=(0.30, 0.2, 0.4), passed=False),        # fast but wrong
        line(bm=64, bn=32, time=(0.40, 0.3, 0.5), wpe=2),                # winner
        line(bm=64, bn=32, time=float("inf"), wpe=1, passed=False),      # failed to run
        line(kernel="bwd_kernel_dq", dtype="bfloat16", d_head=48, sq=1000, sk=3000, causal=False,
             bm=32, bn=16, time=(0.2, 0.1, 0.3)),                       # d48 -> outside the spec
        line(kernel="bwd_kernel_dq", dtype="torch.bfloat16", d_head=32, sq=1000, sk=3000,
             causal=False, bm=32, bn=16, time=(0.2, 0.1, 0.3), adiffs=[0.01, float("nan")]),
        line(kernel="bwd_kernel_dq", dtype="bfloat16", d_head=32, sq=1000, sk=3000, causal=False,
             bm=64, bn=32, time=(0.25, 0.1, 0.3), adiffs=[0.01, 0.0]),
        {"arch": "gfx908", "inputs": {}, "_debug_task_id": 9, "result": "skipped"},
        line(arch="gfx90a"),
        line(kernel="bwd_preprocess"),
    ]
    p = tmp_path / "tune.json"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return p


def test_parse_rounds_inputs_and_classifies(log):
    spec = load_spec(None).spec
    res = parse_records(log, spec, accept_proxy=False, date="2026-11-21")
    assert sorted(res.entries) == [
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024",
        "bwd_kernel_dq.gfx908.bf16.d32.causal0.drop0.bias0.sq1024.sk4096",  # rounded up to bins
    ]
    _, rows = res.entries["attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024"]
    status = {r["config"]: (r["status"], r["time_ms"]) for r in rows}
    assert status["attn_fwd.gfx908.fp16.d64.M64N64.wpe1.w4.s1.plv0"] == ("numerics", 0.3)
    assert status["attn_fwd.gfx908.fp16.d64.M64N32.wpe1.w4.s1.plv0"] == ("error", "")
    assert status["attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"] == ("ok", 0.4)
    _, dq = res.entries["bwd_kernel_dq.gfx908.bf16.d32.causal0.drop0.bias0.sq1024.sk4096"]
    assert {r["config"]: r["status"] for r in dq} == {
        "bwd_kernel_dq.gfx908.bf16.d32.M32N16.wpe1.w4.s1": "numerics",  # NaN in adiffs
        "bwd_kernel_dq.gfx908.bf16.d32.M64N32.wpe1.w4.s1": "ok",
    }
    assert all(r["proxy"] == "" and r["source"] == "import:test/tune_flash.py" for r in rows)
    assert res.skipped == {"result 'skipped'": 1, "arch gfx90a (not gfx908; --proxy imports it as a proxy)": 1,
                           "kernel 'bwd_preprocess'": 1, "dtype/head dim outside the spec": 1}


def test_proxy_records_are_labelled(log):
    res = parse_records(log, load_spec(None).spec, accept_proxy=True, date="2026-11-21")
    _, rows = res.entries["attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024"]
    assert {r["proxy"] for r in rows} == {"", "amd-gfx90a-proxy"}
    assert {r["gpu"] for r in rows} == {"gfx908_mod0"}


def test_cli_import_writes_winners(log, tmp_path):
    out = tmp_path / "t"
    r = CliRunner().invoke(app, ["tune", "import", str(log), "--out", str(out), "--date", "2026-11-21"])
    assert r.exit_code == 0, r.output
    assert "imported 6 measurements of 2 entries" in r.output
    win = {w["family"]: w for w in read_csv(out / "winners.csv")}
    assert win["attn_fwd"]["config"] == "attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0"
    assert math.isclose(win["attn_fwd"]["time_ms"], 0.4) and win["attn_fwd"]["date"] == "2026-11-21"
    assert win["bwd_kernel_dq"]["seqlen_k"] == 4096
    again = (out / "winners.csv").read_bytes()
    r = CliRunner().invoke(app, ["tune", "import", str(log), "--out", str(out), "--date", "2026-11-21"])
    assert r.exit_code == 0 and (out / "winners.csv").read_bytes() == again  # idempotent


def test_cli_import_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"result": "tuned", "kernel_name": "attn_fwd"}\nnot json\n')
    r = CliRunner().invoke(app, ["tune", "import", str(bad), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "bad.json:1: not an upstream tuning record" in r.output
    bad.write_text("not json\n")
    r = CliRunner().invoke(app, ["tune", "import", str(bad), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "bad.json:1: not a JSON line" in r.output
