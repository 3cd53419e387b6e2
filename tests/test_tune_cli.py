"""`mi100-codegen tune` without a GPU (CPU, CI): --dry-run plans and estimates, errors, and the
run loop with a stand-in measurer: results flushed per entry, interruption, --resume,
--budget-min, entries handed out longest first. The worker processes themselves (deadlines,
crashes, several devices): tests/test_tune_workers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.gpu.tune import runner
from codegen.gpu.tune.store import Provenance, config_columns, entry_columns
from codegen.upstream import SUPPORTED_RELEASES
from codegen.formats.tuning_csv import read_csv

PROV = Provenance("Fake GPU", "nvidia-proxy", "3.6.0", "2.11.0", "2026-11-21")
GRID = ["--family", "attn_fwd", "--dtype", "fp16", "--head-dim", "64", "--seqlen", "1024",
        "--seqlen", "4096", "--square", "--no-dropout", "--no-bias"]


@pytest.fixture
def tree(tmp_path) -> Path:
    t = tmp_path / "aotriton"
    (t / "tritonsrc").mkdir(parents=True)
    (t / "tritonsrc" / "flash.py").write_text("# stand-in\n")
    return t


def invoke(*args):
    return CliRunner().invoke(app, ["tune", *map(str, args)])


def fake_rows(entry, configs, device="Fake GPU"):
    rows = []
    for i, c in enumerate(configs):
        rows.append({**entry_columns(entry, "gfx908_mod0"), **config_columns(c), "status": "ok",
                     "time_ms": 1.0 + i * 0.25 + entry.seqlen_q / 1e4, "errors": "out=0/1",
                     "same_kernel_as": "", **PROV.as_dict(), "device": device})
    return rows


class FakeRunner:
    def __init__(self, monkeypatch, interrupt_after=None, gpus=1, stats=()):
        self.stats = list(stats)
        self.measured: list[str] = []
        self.devices = None
        self.interrupt_after = interrupt_after
        monkeypatch.setattr(runner, "missing_gpu_stack", lambda: [])
        monkeypatch.setattr(runner, "visible_gpus", lambda: gpus)
        monkeypatch.setattr(runner, "backend_name", lambda: "cuda")
        monkeypatch.setattr(runner, "warm_compile", lambda *a, **k: None)
        monkeypatch.setattr(runner, "run_entries", self.run_entries)

    def run_entries(self, aotriton_dir, arch, gpu, work, settings, devices, on_result, cost, stop, meanwhile):
        self.devices = devices
        meanwhile(None)
        for entry, configs in work:
            if stop():
                break
            if self.interrupt_after is not None and len(self.measured) == self.interrupt_after:
                raise KeyboardInterrupt
            self.measured.append(entry.name)
            on_result(entry, fake_rows(entry, configs), "", devices[len(self.measured) % len(devices)])
        return self.stats


def test_help_lists_run_and_import():
    r = invoke("--help")
    assert r.exit_code == 0 and "run" in r.output and "import" in r.output


def test_dry_run_json_lists_grid_and_candidates(tree, tmp_path):
    r = invoke(tree, *GRID, "--dry-run", "--json", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    names = [e["name"] for e in doc["entries"]]
    assert names == [
        "attn_fwd.gfx908.fp16.d64.causal0.drop0.bias0.sq1024.sk1024",
        "attn_fwd.gfx908.fp16.d64.causal0.drop0.bias0.sq4096.sk4096",
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024",
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq4096.sk4096",
    ]
    assert doc["entries"][0]["candidates"][-1] == "attn_fwd.gfx908.fp16.d64.M128N64.wpe1.w4.s1.plv0"
    assert doc["counts"]["todo"] == 4 and not any(e["done"] for e in doc["entries"])
    assert not (tmp_path / "out").exists()  # nothing written


def test_dry_run_text_lists_configs_by_name(tree):
    r = invoke(tree, *GRID, "--causal", "--dry-run")
    assert r.exit_code == 0
    assert "todo attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024" in r.stdout
    assert "       attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--head-dim", "128"], "head dim 128 not in the spec"),
    (["--dtype", "fp8"], "dtype fp8 not in the spec"),
    (["--family", "attn_bwd"], "family attn_bwd not in"),
    (["--seqlen", "100"], "seqlen 100 not in"),
])
def test_filter_errors_exit_2(tree, args, message):
    r = invoke(tree, *args, "--dry-run")
    assert r.exit_code == 2 and message in r.output


def test_not_a_tree_exits_2(tmp_path):
    r = invoke(tmp_path, "--dry-run")
    assert r.exit_code == 2 and "no tritonsrc/flash.py" in r.output


def test_without_a_gpu_a_real_run_exits_3(tree, tmp_path):
    if not runner.missing_gpu_stack():
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is visible here")
    r = invoke(tree, *GRID, "--out", tmp_path / "o")
    assert r.exit_code == 3 and ("needs torch" in r.output or "needs triton" in r.output
                                 or "no GPU visible" in r.output), r.output
    assert not (tmp_path / "o" / "winners.csv").exists()


def test_run_flushes_each_entry_and_resumes_after_interrupt(tree, tmp_path, monkeypatch):
    out = tmp_path / "o"
    fake = FakeRunner(monkeypatch, interrupt_after=2)
    r = invoke(tree, *GRID, "--out", out)
    assert r.exit_code == 130, r.output  # interrupted
    first = read_csv(out / "measurements.csv")
    done = {m["entry"] for m in first}
    assert done == set(fake.measured) and len(done) == 2
    assert len(read_csv(out / "winners.csv")) == 2
    assert not (out / ".tune.lock").exists()

    # --dry-run --resume shows what is done
    r = invoke(tree, *GRID, "--out", out, "--resume", "--dry-run", "--json")
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert {e["name"] for e in doc["entries"] if e["done"]} == done and doc["counts"]["todo"] == 2

    fake2 = FakeRunner(monkeypatch)
    r = invoke(tree, *GRID, "--out", out, "--resume")
    assert r.exit_code == 0, r.output
    assert set(fake2.measured).isdisjoint(done) and len(fake2.measured) == 2  # nothing re-measured
    meas = read_csv(out / "measurements.csv")
    assert [m for m in meas if m["entry"] in done] == first
    winners = read_csv(out / "winners.csv")
    from codegen.models import expand_family
    from codegen.formats.spec import load_spec

    n = len(expand_family(load_spec(None).spec, "attn_fwd", "fp16", 64))  # the spec's candidates (6)
    assert len(winners) == 4 and all(w["candidates"] == n for w in winners)
    assert {w["proxy"] for w in winners} == {"nvidia-proxy"}

    fake3 = FakeRunner(monkeypatch)
    r = invoke(tree, *GRID, "--out", out, "--resume")
    assert r.exit_code == 0 and "nothing to do" in r.output and fake3.measured == []

    # without --resume, entries are measured again and replace their rows
    fake4 = FakeRunner(monkeypatch)
    r = invoke(tree, *GRID, "--out", out)
    assert r.exit_code == 0 and len(fake4.measured) == 4
    assert read_csv(out / "measurements.csv") == meas


def test_budget_stops_handing_out_entries(tree, tmp_path, monkeypatch):
    fake = FakeRunner(monkeypatch)
    r = invoke(tree, *GRID, "--out", tmp_path / "o", "--budget-min", "0.0000001")
    assert r.exit_code == 0 and fake.measured == []
    assert "budget reached" in r.output and "--resume" in r.output


def _plan_line_start() -> str:
    from codegen.formats.spec import load_spec
    from codegen.models import expand_family

    n = len(expand_family(load_spec(None).spec, "attn_fwd", "fp16", 64))
    return f"plan: 4 entries, {4 * n} candidate measurements; estimated GPU time "


def test_entries_go_out_longest_first_to_every_gpu(tree, tmp_path, monkeypatch):
    fake = FakeRunner(monkeypatch, gpus=2)
    r = invoke(tree, *GRID, "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    first = r.output.splitlines()[0]
    assert first.startswith(_plan_line_start())
    assert "device 0: " in first and "device 1: " in first
    # seqlen 4096 before 1024, non-causal (twice the work) before causal
    assert fake.measured == [
        "attn_fwd.gfx908.fp16.d64.causal0.drop0.bias0.sq4096.sk4096",
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq4096.sk4096",
        "attn_fwd.gfx908.fp16.d64.causal0.drop0.bias0.sq1024.sk1024",
        "attn_fwd.gfx908.fp16.d64.causal1.drop0.bias0.sq1024.sk1024",
    ]
    assert fake.devices == [0, 1]


def test_the_summary_counts_lost_candidates_per_device(tree, tmp_path, monkeypatch):
    from codegen.core.pool import SlotStats

    stats = [SlotStats(0, {"device": "Fake GPU"}, jobs=3, steps=17, busy_s=12.5, timeouts=2, crashes=1),
             SlotStats(1, {"device": "Fake GPU"}, jobs=1, steps=6, busy_s=4.0)]
    FakeRunner(monkeypatch, gpus=2, stats=stats)
    r = invoke(tree, *GRID, "--out", tmp_path / "o", "--timeout-s", "30")
    assert r.exit_code == 0, r.output
    assert "2 candidate(s) timed out, 1 crashed their worker" in r.output
    assert "device 0 (Fake GPU): 3 entries, 17 kernels timed or checked in 12.5 s" in r.output
    assert "device 1 (Fake GPU): 1 entries, 6 kernels" in r.output
    r = invoke(tree, *GRID, "--out", tmp_path / "o", "--timeout-s", "nan")
    assert r.exit_code == 2 and "not a finite number" in r.output


def test_dry_run_estimates_per_device_and_the_budget(tree, tmp_path):
    r = invoke(tree, *GRID, "--device", "0,1,2", "--budget-min", "0.001", "--dry-run", "--json",
               "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    line = r.stderr.splitlines()[0]
    assert line.startswith(_plan_line_start())
    assert "device 2: " in line and "the proxy's table tuning/gfx908/measurements.csv" in line
    assert "--budget-min 0.001 starts about 3 of them" in line  # one at 0 s on each of 3 devices
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    est = doc["estimate"]
    assert len(est["per_device_s"]) == 3 and est["seconds"] >= max(est["per_device_s"]) > 0


@pytest.mark.aotriton
@pytest.mark.parametrize("tag", SUPPORTED_RELEASES)
def test_tune_accepts_every_supported_release(pristine_tree, tmp_path, tag):
    """tune's launchers pass arguments by name (codegen.upstream.kernel_args), so no release is
    refused any more, 0.12b+ included (0.13b: kernels in modules/flash/kernel/)."""
    r = CliRunner().invoke(app, ["tune", str(pristine_tree(tag)), "--dry-run", "--family", "attn_fwd",
                                 "--dtype", "fp16", "--head-dim", "64", "--seqlen", "1024", "--square",
                                 "--out", str(tmp_path / "t")])
    assert r.exit_code == 0, r.output
    assert "nothing run (--dry-run)" in r.output and not (tmp_path / "t").exists()
