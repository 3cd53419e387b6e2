"""ninja runner: status-line parsing, log file, failure message (a fake ninja, no compiler)."""

from __future__ import annotations

import os
import stat

import pytest
from rich.console import Console

from codegen.imagebuild.run import BuildFailed, run_ninja


def _fake_ninja(tmp_path, body: str):
    p = tmp_path / "ninja"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_progress_and_log(tmp_path):
    ninja = _fake_ninja(tmp_path, 'echo "$NINJA_STATUS" >&2\n'
                        'echo "[1/3] Building CXX object a.o"\n'
                        'echo "[2/3] Generating flash/gpu_kernel_image.attn_fwd/k.hsaco"\n'
                        'echo "warning: something"\n'
                        'echo "[3/3] Install the project..."\n')
    log = tmp_path / "build.log"
    res = run_ninja(tmp_path, jobs=2, target="install", env=dict(os.environ), log_path=log,
                    console=Console(file=open(os.devnull, "w")), ninja=ninja, show_progress=False)
    assert (res.edges_done, res.edges_total, res.kernels_compiled) == (3, 3, 1)
    text = log.read_text()
    assert "[2/3] Generating" in text and "warning: something" in text and "[%f/%t] " in text


def test_failure_shows_failed_step(tmp_path):
    ninja = _fake_ninja(tmp_path, 'echo "[1/2] Building CXX object a.o"\n'
                        'echo "FAILED: a.o"\necho "a.cc:1: error: boom"\n'
                        'echo "ninja: build stopped: subcommand failed."\nexit 1\n')
    log = tmp_path / "build.log"
    with pytest.raises(BuildFailed) as ei:
        run_ninja(tmp_path, jobs=1, target="install", env=dict(os.environ), log_path=log,
                  console=Console(file=open(os.devnull, "w")), ninja=ninja, show_progress=False)
    msg = str(ei.value)
    assert "FAILED: a.o" in msg and "error: boom" in msg and str(log) in msg
    assert ei.value.exit_code == 3 and "re-run" in ei.value.hint


def test_progress_shows_compiled_cached_and_left(tmp_path):
    """With the compile service, the bar's kernel field is its counts: compiled, cached, left."""
    import io

    ninja = _fake_ninja(tmp_path, 'echo "[1/2] Generating flash/a.hsaco"\nsleep 0.3\n'
                        'echo "[2/2] Generating flash/b.hsaco"\nsleep 0.3\n')
    out = io.StringIO()
    counts = iter([(0, 1, 5), (1, 1, 5)])
    run_ninja(tmp_path, jobs=1, target="install", env=dict(os.environ), log_path=tmp_path / "build.log",
              console=Console(file=out, force_terminal=True, width=200), ninja=ninja, show_progress=True,
              kernel_counts=lambda: next(counts))
    text = out.getvalue()
    assert "compiled 0 cached 1 left 4" in text and "compiled 1 cached 1 left 3" in text
