"""Running CMake and ninja: full output to a log file, a Rich progress bar from ninja's
`[finished/total]` status lines, Ctrl-C passed on so that a re-run resumes where this one stopped
(ninja deletes the outputs of interrupted commands and keeps every finished one)."""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TextIO

from rich.console import Console

from codegen.core import processes, ui
from codegen.core.errors import UpstreamError

STATUS_RE = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
KERNEL_RE = re.compile(r"\.hsaco\b")
NINJA_STATUS = "[%f/%t] "
INTERRUPT_GRACE_S = 120.0  # after Ctrl-C, for ninja to stop its running steps and remove their outputs


class BuildFailed(UpstreamError):
    """CMake or ninja failed; the message carries the tail of the log."""


@dataclass
class NinjaResult:
    edges_total: int = 0
    edges_done: int = 0
    kernels_compiled: int = 0
    seconds: float = 0.0
    no_work: bool = False


def _short(desc: str, width: int = 60) -> str:
    m = re.search(r"([^/\s']+\.hsaco)", desc)
    text = m.group(1) if m else desc
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _stream(cmd: list[str], *, env: dict[str, str], log: TextIO, on_line: Callable[[str], None]) -> tuple[int, deque]:
    """Run `cmd`, every output line to `log` and `on_line`; on Ctrl-C the command gets SIGINT and
    INTERRUPT_GRACE_S to stop (ninja keeps every finished step), then the interrupt goes on."""
    tail: deque = deque(maxlen=60)

    def line(text: str) -> None:
        log.write(text)
        text = text.rstrip("\n")
        tail.append(text)
        on_line(text)

    try:
        return processes.stream(cmd, line, env=env, interrupt_grace=INTERRUPT_GRACE_S), tail
    except KeyboardInterrupt:
        log.write("\n[mi100-codegen] interrupted: re-run the same command to resume\n")
        raise


def _fail_message(what: str, tail: deque, log_path: Path) -> str:
    lines = list(tail)
    idx = max((i for i, l in enumerate(lines) if l.startswith(("FAILED:", "CMake Error"))), default=None)
    shown = lines[idx:idx + 25] if idx is not None else lines[-25:]
    return f"{what} failed; full log: {log_path}\n" + "\n".join(shown)


def run_cmake(args: list[str], *, env: dict[str, str], log_path: Path, console: Console,
              cmake: str = "cmake") -> float:
    t0 = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8", buffering=1) as log:
        log.write(f"\n[mi100-codegen] configure: cmake {' '.join(args)}\n")
        log.flush()
        with console.status("configuring (CMake runs the kernel generator)…"):
            rc, tail = _stream([cmake, *args], env=env, log=log, on_line=lambda _l: None)
    if rc != 0:
        raise BuildFailed(_fail_message("CMake configure", tail, log_path))
    return time.monotonic() - t0


def run_ninja(build_dir: Path, *, jobs: int, target: str, env: dict[str, str], log_path: Path,
              console: Console, ninja: str = "ninja", show_progress: bool = True,
              kernel_counts: Callable[[], tuple[int, int, int]] | None = None) -> NinjaResult:
    """`kernel_counts`: (compiled, from the cache, to do at the start) of the compile service, for
    the progress display; without it the kernels are counted from ninja's status lines."""
    res = NinjaResult()
    env = dict(env)
    env["NINJA_STATUS"] = NINJA_STATUS
    cmd = [ninja, "-C", str(build_dir), "-j", str(jobs), target]
    t0 = time.monotonic()
    progress = ui.progress(console, label="[bold]build[/]", detail="kernels {task.fields[kernels]}",
                           tail="[dim]{task.fields[what]}", spinner=True, disable=not show_progress)
    with open(log_path, "a", encoding="utf-8", buffering=1) as log, progress:
        log.write(f"\n[mi100-codegen] build: {' '.join(cmd)}\n")
        log.flush()
        task = progress.add_task("build", total=None, kernels=0, what="starting")

        def on_line(line: str) -> None:
            m = STATUS_RE.match(line)
            if m:
                done, total, desc = int(m.group(1)), int(m.group(2)), m.group(3)
                res.edges_done, res.edges_total = done, total
                if KERNEL_RE.search(desc) and desc.startswith("Generating"):
                    res.kernels_compiled += 1
                kernels = str(res.kernels_compiled)
                if kernel_counts is not None:
                    compiled, cached, todo = kernel_counts()
                    kernels = f"compiled {compiled} cached {cached} left {max(0, todo - compiled - cached)}"
                progress.update(task, completed=done, total=total, kernels=kernels, what=_short(desc))
            elif line.startswith("ninja: no work to do"):
                res.no_work = True

        rc, tail = _stream(cmd, env=env, log=log, on_line=on_line)
    res.seconds = time.monotonic() - t0
    if rc != 0:
        raise BuildFailed(_fail_message("ninja", tail, log_path),
                          hint="fix the cause and re-run the same command: finished steps are kept")
    return res


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
