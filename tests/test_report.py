"""`mi100-codegen report` (issue 22): one file a card owner sends back. CPU: the refusal without a
GPU (or without torch) is exit 3 with one message and no file; nothing private in what is written.
GPU (`gpu`, run on the NVIDIA proxy): the whole report."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codegen.cli import app
from codegen.gpu.report.collect import environment, render_report
from codegen.gpu.report.privacy import private_values, scrub

REPO = Path(__file__).resolve().parents[1]


def test_without_a_gpu_it_refuses_with_one_message_and_writes_nothing(tmp_path):
    out = tmp_path / "r.md"
    r = CliRunner().invoke(app, ["report", "--out", str(out)])
    if r.exit_code == 0:
        pytest.skip("this machine has a GPU (the gpu test covers it)")
    assert r.exit_code == 3, r.output
    assert r.output.count("error:") == 1 and "Traceback" not in r.output
    assert "torch" in r.output and ("no GPU" in r.output or "not installed" in r.output)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_nothing_private_is_written(tmp_path):
    home, host = str(Path.home()), socket.gethostname()
    status = (f"torch:            2.9.0+rocm6.4  ({sys.prefix}/lib/python3.11/site-packages/torch)\n"
              f"library file:     {home}/venv/lib/python3.11/site-packages/torch/lib/libaotriton_v2.so.0.11.0\n"
              f"our build:        installed for gfx908 ({home}/aotriton-gfx908/lib/libaotriton_v2.so.0.11.0, 3 files)\n"
              f"problem:          built on {host} in {os.getcwd()}/build\n")
    env = environment()
    text = scrub(render_report(env, status, "| case | status |\n|---|---|\n| fwd | pass |\n", {"summary": {"ok": True}},
                               {"torch_dir": f"{sys.prefix}/lib/python3.11/site-packages/torch", "host": host}))
    for value in private_values():
        assert value not in text, value
    assert "<site-packages>/torch/lib/libaotriton_v2.so.0.11.0" in text
    assert "<path>/libaotriton_v2.so.0.11.0" in text and "<path>/build" in text
    assert "https://" not in text or "<path>" not in text.split("https://", 1)[1].split()[0]
    assert "| python | " in text and env["python"] in text


def test_scrub_keeps_urls_arch_strings_and_system_paths():
    text = "see https://github.com/ROCm/aotriton, gfx908:sramecc+:xnack-, /opt/rocm/lib, 10/20 ms"
    assert scrub(text) == text


@pytest.mark.gpu
def test_report_on_a_gpu(tmp_path):
    """The lead runs this on the NVIDIA proxy: a report is written (validate's self-test there)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    out = tmp_path / "report.md"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", "from codegen.cli import main; main()", "report", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    for section in ("## Environment", "## torch status", "## validate", "## Machine-readable",
                    "| arch_full |", "Speed and peak memory"):
        assert section in text, section
    for value in private_values():
        assert value not in text, value
    assert torch.__version__ in text


def test_the_whole_report_with_a_stand_in_card(tmp_path, monkeypatch):
    """CPU: `report` as on an MI100, the GPU and validate's run replaced by stand-ins whose
    results carry private paths: one file, every section, the speed table, nothing private."""
    pytest.importorskip("torch")
    import codegen.gpu.validate.gpu as gpu
    import codegen.gpu.validate.run as vrun

    home = str(Path.home())
    plat = gpu.Platform("rocm", "AMD Instinct MI100", "gfx908", "gfx908:sramecc+:xnack-", "2.9.0+rocm6.4",
                        "6.4.43482", None, 120)
    perf = [{"backend": "flash", "dtype": "fp16", "head_dim": 64, "fwd_ms": 1.5, "fwd_bwd_ms": 4.0,
             "peak_mib": 100.0, "speedup_vs_math": 3.2, "memory_vs_math": 0.1,
             "shape": {"batch": 4, "heads_q": 16, "seqlen_q": 2048}}]
    result = {"mode": "sdpa", "cases": [{"name": "fwd.fp16.d64", "status": "pass", "checks": []}],
              "proof": {"aotriton": {"mapped_files": [f"{home}/venv/lib/python3.11/site-packages/torch/lib/"
                                                      "libaotriton_v2.so.0.11.0"], "sha256": "ab" * 32},
                        "kernels": {}, "checks": [{"what": "flash ran", "ok": True,
                                                   "detail": f"built on {socket.gethostname()}"}]},
              "perf": perf}
    monkeypatch.setattr(gpu, "detect_platform", lambda: plat)
    monkeypatch.setattr(vrun, "_run_mode", lambda opts, loaded, p, progress: (result, None))
    out = tmp_path / "report.md"
    r = CliRunner().invoke(app, ["report", "--out", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    for section in ("## Environment", "| arch_full | gfx908:sramecc+:xnack- |", "## torch status", "## validate",
                    "**Result: PASS**", "Speed and peak memory", "## Machine-readable"):
        assert section in text, section
    for value in private_values():
        assert value not in text, value
    assert "<site-packages>/torch/lib/libaotriton_v2.so.0.11.0" in text
