"""Stop a command at its n-th filesystem step, the way a kill or a Ctrl-C would, for the crash
tests of `torch install` and `torch restore` (tests/test_torch_crash.py, tests/test_bundle_real.py).

A step is every call that changes a folder: os.replace, os.rename, os.unlink, os.rmdir, os.mkdir,
os.link, a file copied (shutil.copyfile: the backup's copies; codegen.apply.journal.copy_durable:
the staged ones), counted when one of its paths lies below `under` (or it works relative to an
open folder, as shutil.rmtree does). The command runs in a forked child, so a kill is real: at
the step, `os._exit(137)` before it runs (no `finally`, no handler, nothing flushed, as SIGKILL
or SIGTERM leave a process); an interrupt raises KeyboardInterrupt just after it ran, as a
Ctrl-C landing there does."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from codegen.apply import journal

STEPS = ("replace", "rename", "unlink", "rmdir", "mkdir", "link")
KILLED = 137
Pick = Callable[[str, list[str]], bool]   # (step name, its paths, absolute): the step to stop at


@dataclass
class Counter:
    under: str
    at: int | Pick | None      # None: count only
    action: str                # "kill" | "interrupt"
    seen: int = 0
    hit: bool = False

    def wrap(self, name: str, real: Callable) -> Callable:
        def step(*args, **kwargs):
            paths = self._paths(args, kwargs)
            if not any(p.startswith(self.under) for p in paths):
                return real(*args, **kwargs)
            self.seen += 1
            now = not self.hit and (self.seen >= self.at if isinstance(self.at, int) else
                                    self.at is not None and self.at(name, paths))
            if now and self.action == "kill":
                os._exit(KILLED)
            out = real(*args, **kwargs)   # a step that fails (mkdir's parents first) is interrupted at the next
            if now:
                self.hit = True
                raise KeyboardInterrupt
            return out
        return step

    @staticmethod
    def _paths(args, kwargs) -> list[str]:
        fd = kwargs.get("dir_fd")   # shutil.rmtree works relative to an open folder
        top = os.readlink(f"/proc/self/fd/{fd}") if fd is not None else ""
        return [os.path.join(top, str(a)) for a in args if isinstance(a, (str, Path))]


@contextmanager
def stepping(under: Path, at: int | Pick | None, action: str = "kill"):
    """Every step below `under` counted (`Counter.seen`) and, at `at`, the kill or interrupt."""
    c = Counter(str(under), at, action)
    saved = [(os, n, getattr(os, n)) for n in STEPS] + [(shutil, "copyfile", shutil.copyfile)]
    if hasattr(journal, "copy_durable"):   # (the code before it, 360f28b, copied with shutil only)
        saved.append((journal, "copy_durable", journal.copy_durable))
    for mod, name, real in saved:
        setattr(mod, name, c.wrap(name, real))
    try:
        yield c
    finally:
        for mod, name, real in saved:
            setattr(mod, name, real)


def count_steps(under: Path, command: Callable[[], object]) -> int:
    """How many steps `command` takes below `under` (it runs here, to the end)."""
    with stepping(under, None) as c:
        command()
    return c.seen


@dataclass
class Outcome:
    killed: bool
    code: int | None = None     # the exit status the command returned (not killed)
    output: str = ""
    hit: bool = False           # the interrupt was injected


def run_stopped(under: Path, command: Callable[[], object], at: int | Pick, action: str, log: Path) -> Outcome:
    """`command` (a CliRunner invocation) run in a forked child, stopped at step `at`."""
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        try:
            with stepping(under, at, action) as c:
                r = command()
            log.write_text(json.dumps({"code": r.exit_code, "output": r.output, "hit": c.hit}))
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == KILLED:
        return Outcome(True)
    doc = json.loads(log.read_text())
    log.unlink()
    return Outcome(False, doc["code"], doc["output"], doc["hit"])


def state(site: Path, mtimes: bool = True) -> dict[str, tuple]:
    """Every path below `site` (as tests/test_torch_install.snapshot), the backup's manifest by
    content (its mtime is when it was written); `mtimes`: each file's too (an installed bundle's
    files have the time they were extracted: compare installed states without)."""
    from test_torch_install import snapshot

    out = snapshot(site)
    for rel, v in list(out.items()):
        if rel.endswith("mi100-codegen-backup/manifest.json"):
            out[rel] = (v[0], v[1], json.loads((site / rel).read_text()))
        elif not mtimes and v[0] == "file":
            out[rel] = v[:3]
    return out


def leftovers(site: Path) -> list[str]:
    """Temporaries and state folders an interrupted command may leave (none once recovered)."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*")
                  if p.name.endswith((".mi100-tmp", ".tmp")) or p.name == journal.STATE_DIR)
