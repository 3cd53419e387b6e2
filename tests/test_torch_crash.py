"""Issue 36 items 1-3: `torch install` and `torch restore` killed or interrupted at every
filesystem step (tests/crash_points.py: a forked child stopped at its n-th rename, copy, unlink,
mkdir or rmdir), on a wheel-shaped ROCm torch (test_torch_install_bundle's fixtures: real ELF
libraries, a stale image of the arch that install removes) and a bundle of the fixture prefix.
After each: torch is byte for byte as before or fully installed once the next `torch install` or
`torch restore` has run (without --force), that command says what it finished, and no temporary
is left. Then the red team's cases one by one, and real SIGKILLs of a child process landing
inside the transaction (MI100_CODEGEN_TXN_DELAY). On the code before the journaled install
(360f28b) these fail: an interrupted install lost torch's library, and every way back was
refused."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crash_points import Outcome, count_steps, leftovers, run_stopped, state
from test_torch_install import cli, load_which, need_cc
from test_torch_install_bundle import make_bundle

REPO = Path(__file__).resolve().parents[1]
LIB = "torch/lib/libaotriton_v2.so.0.11.0"
STALE = "torch/lib/aotriton.images/amd-gfx908/flash/zz-old.aks2"
BACKUP = "torch.mi100-codegen-backup"


def make_world(base: Path, site: Path, bundle: Path) -> dict:
    """`site` (a site-packages holding a torch the bundle fits, with a stale image of its arch) and
    the states before and after the bundle's install; each test works on copies."""
    done = _copy(site, base / "installed")
    r = install(done, bundle)
    assert r.exit_code == 0, r.output
    return {"site": site, "bundle": bundle, "pristine": state(site), "installed": state(done, mtimes=False),
            "done": done, "base": base}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A wheel-shaped torch (HIP 6) with a stale gfx908 image, and the fixture bundle for it."""
    from test_torch_hip_runtime import torch_with_hip

    need_cc()
    base = tmp_path_factory.mktemp("crash")
    site = base / "template"
    torch_with_hip(site, 6)
    (site / STALE).parent.mkdir(parents=True)
    (site / STALE).write_bytes(b"an image of another build\n")
    return make_world(base, site, make_bundle(base / "mk"))


def is_state(world, site: Path, which: str) -> bool:
    """`site` is exactly as before the install (every mtime too), or fully installed."""
    return state(site, mtimes=which == "pristine") == world[which]


def _copy(src: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    return dest


def install(site: Path, bundle: Path, *more: str):
    """The install, the stale gfx908 image named on purpose (`--replace-shipped`: torch's folder
    for the arch holds kernels that are not ours)."""
    return cli("torch", "install", "--bundle", str(bundle), "--torch-dir", str(site / "torch"),
               "--replace-shipped", "gfx908", *more)


def restore(site: Path, *more: str):
    return cli("torch", "restore", "--torch-dir", str(site / "torch"), *more)


def _settles(world, site: Path, after: Outcome, then: str, where: str) -> None:
    """The next command (`install` or `restore`) ends in its state, says what it finished when the
    stopped command left something, and leaves nothing behind."""
    unfinished = bool(leftovers(site))
    r = install(site, world["bundle"]) if then == "install" else restore(site)
    assert r.exit_code == 0 or (then == "restore" and r.exit_code == 2 and "nothing to restore" in r.output
                                and not unfinished), (where, r.output)
    assert "--force" not in r.output, (where, r.output)
    if unfinished:
        assert "finished" in r.output or "removed" in r.output, (where, r.output)
    assert leftovers(site) == [], where
    assert is_state(world, site, "installed" if then == "install" else "pristine"), (where, r.output)


def sweep(world, command: str, action: str, then: str, samples: int | None = None) -> int:
    """`command` stopped at each of its steps in turn (`samples`: about that many, evenly spread),
    then `then`."""
    base = world["base"] / f"{command}-{action}-{then}"
    template = world["site"] if command == "install" else world["done"]
    run = (lambda s: (lambda: install(s, world["bundle"]))) if command == "install" else (lambda s: (lambda: restore(s)))
    probe = _copy(template, base / "probe")
    steps = count_steps(probe, run(probe))
    assert steps > 10
    for at in range(1, steps + 1, max(1, steps // samples) if samples else 1):
        site = _copy(template, base / "site")
        out = run_stopped(site, run(site), at, action, base / "log.json")
        where = f"{command} {action} at step {at} of {steps}"
        if action == "interrupt":
            assert out.killed is False and out.hit and out.code == 130, (where, out.output)
            now = {k: v for k, v in state(site).items()   # temporaries aside: the next command removes them
                   if not k.startswith(("torch/.mi100-codegen", f"{BACKUP}.tmp"))}
            assert now == world["pristine"] or {k: v[:3] if v[0] == "file" and len(v) == 4 else v
                                                for k, v in now.items()} == world["installed"], where   # at once
        else:
            assert out.killed, where
        _settles(world, site, out, then, where)
    return steps


@pytest.mark.parametrize("then", ["restore", "install"])
def test_install_killed_at_every_step_settles(world, then):
    sweep(world, "install", "kill", then)


@pytest.mark.parametrize("then", ["restore", "install"])
def test_restore_killed_at_every_step_settles(world, then):
    sweep(world, "restore", "kill", then)


@pytest.mark.parametrize("command", ["install", "restore"])
def test_ctrl_c_at_every_step_leaves_torch_before_or_installed(world, command):
    sweep(world, command, "interrupt", "restore" if command == "install" else "install")


# ------------------------------------------------------------------------- the red team, one by one --

def _lands_on(name: str, suffix: str):
    """The rename (`name`: "replace" only, or "any") whose destination ends with `suffix`."""
    return lambda step, paths: step in ("replace", "rename") and paths[1].endswith(suffix) and \
        (name == "any" or step == name)


def test_ctrl_c_right_after_the_library_is_renamed_into_torch(world, tmp_path):
    """Red team item 1: a SIGINT just after torch's library was replaced. It exits 130, torch has
    our build whole (the install finished its committed journal first), status says so, and
    restore puts the wheel's own library back."""
    site = _copy(world["site"], tmp_path / "site")
    original = (site / LIB).read_bytes()
    out = run_stopped(site, lambda: install(site, world["bundle"]), _lands_on("replace", LIB.split("/")[-1]),
                      "interrupt", tmp_path / "log.json")
    assert out.hit and out.code == 130, out.output
    assert "interrupted: torch install had passed its commit point and was finished first" in out.output
    assert is_state(world, site, "installed") and load_which(site / "torch") == "mi100"
    import json
    s = json.loads(cli("torch", "status", "--torch-dir", str(site / "torch"), "--json").stdout)
    assert s["ours_installed"] and s["ours"]["library_matches_install"], s
    r = restore(site)
    assert r.exit_code == 0, r.output
    assert (site / LIB).read_bytes() == original and is_state(world, site, "pristine")


@pytest.mark.parametrize("case", ["kill after the backup is in place", "ctrl-c after the backup is in place",
                                  "kill before the library", "kill mid-restore", "kill while the backup is removed"])
@pytest.mark.parametrize("then", ["install", "restore"])
def test_every_way_back_after_a_crash_works(world, tmp_path, case, then):
    """Red team item 2: after each of these, re-running install said "already installed, run torch
    restore first", restore said "files we installed were changed since", --force left a
    .mi100-tmp file in torch, and a kill during the backup's removal left a folder only rm -rf
    cleared. Now the next install or restore finishes the recovery, without --force."""
    command = "restore" if "restore" in case or "removed" in case else "install"
    site = _copy(world["site"] if command == "install" else world["done"], tmp_path / "site")
    pick = {   # each as the code before the journal (360f28b) took the step too
        "kill after the backup is in place": lambda s, p: s in ("replace", "rename") and "/torch/lib/" in p[1],
        "ctrl-c after the backup is in place": _lands_on("any", BACKUP),
        "kill before the library": _lands_on("replace", LIB.split("/")[-1]),
        "kill mid-restore": lambda s, p: s == "replace" and "/torch/lib/aotriton.images/" in p[1],
        "kill while the backup is removed": lambda s, p: s in ("unlink", "rmdir") and f"/{BACKUP}" in p[0],
    }[case]
    action = "interrupt" if case.startswith("ctrl-c") else "kill"
    run = (lambda: install(site, world["bundle"])) if command == "install" else (lambda: restore(site))
    out = run_stopped(site, run, pick, action, tmp_path / "log.json")
    assert out.killed or out.hit, case
    _settles(world, site, out, then, case)
    # and the command after that works as on a torch that never crashed
    r = restore(site) if then == "install" else install(site, world["bundle"])
    assert r.exit_code == 0, r.output
    assert is_state(world, site, "pristine" if then == "install" else "installed")


def test_force_never_copies_in_another_torchs_library(world, tmp_path):
    """Red team item 7 (issue 36 must-hold 3): a backup made by an install into another torch of
    the same version, planted beside this one, is refused without suggesting --force, and
    --force does not copy that torch's library in."""
    other = _copy(world["done"], tmp_path / "other")
    (other / LIB).write_bytes(b"another torch's library\n")   # what that torch's install backed up
    import json
    man = json.loads((other / BACKUP / "manifest.json").read_text())
    for e in man["entries"]:
        if e["path"] == "lib/libaotriton_v2.so.0.11.0":
            copy = other / BACKUP / "files" / e["path"]
            copy.write_bytes(b"another torch's library\n")
            import hashlib
            e["sha256_before"] = hashlib.sha256(copy.read_bytes()).hexdigest()
            e["sha256_after"] = "a" * 64   # what that install put there: not this torch's
    (other / BACKUP / "manifest.json").write_text(json.dumps(man))
    site = _copy(world["site"], tmp_path / "site")
    shutil.copytree(other / BACKUP, site / BACKUP)
    before = state(site)
    for force in ((), ("--force",)):
        r = restore(site, *force)
        assert r.exit_code == 2 and "not the library the backup" in r.output, r.output
        assert "--force" not in r.output
    assert state(site) == before


def test_a_backup_dir_that_is_a_file_is_refused_by_name(world, tmp_path):
    """Issue 36 item 11: `--backup-dir` naming a regular file: install and restore name it."""
    site = _copy(world["site"], tmp_path / "site")
    f = tmp_path / "backup-file"
    f.write_text("mine\n")
    before = state(site)
    for r in (install(site, world["bundle"], "--backup-dir", str(f)), restore(site, "--backup-dir", str(f)),
              install(site, world["bundle"], "--backup-dir", str(f), "--dry-run")):
        assert r.exit_code == 2 and f"--backup-dir {f}: a file, not a folder" in " ".join(r.output.split()), r.output
    assert state(site) == before and f.read_text() == "mine\n"


def test_a_crash_with_another_backup_dir_names_it(world, tmp_path):
    """The journal says which backup folder the interrupted install used: a command naming another
    one changes nothing and says which --backup-dir finishes it."""
    site = _copy(world["site"], tmp_path / "site")
    bk = tmp_path / "elsewhere" / "bk"
    bk.parent.mkdir()
    out = run_stopped(site, lambda: install(site, world["bundle"], "--backup-dir", str(bk)),
                      _lands_on("replace", LIB.split("/")[-1]), "kill", tmp_path / "log.json")
    assert out.killed
    frozen = state(site)
    r = restore(site)
    assert r.exit_code == 2 and f"--backup-dir {bk}" in " ".join(r.output.split()), r.output
    assert state(site) == frozen
    r = restore(site, "--backup-dir", str(bk))
    assert r.exit_code == 0 and "finished the interrupted torch install" in r.output, r.output
    assert is_state(world, site, "pristine") and not bk.exists()


def test_dry_run_says_an_interrupted_install_is_unfinished_and_changes_nothing(world, tmp_path):
    site = _copy(world["site"], tmp_path / "site")
    out = run_stopped(site, lambda: install(site, world["bundle"]), _lands_on("replace", LIB.split("/")[-1]),
                      "kill", tmp_path / "log.json")
    assert out.killed
    frozen = state(site)
    r = install(site, world["bundle"], "--dry-run")
    assert "the next torch install or torch restore finishes it" in " ".join(r.output.split()), r.output
    assert state(site) == frozen


# ------------------------------------------------------------------ real SIGKILLs of a child process --

def _child(site: Path, bundle: Path, delay: float) -> subprocess.Popen:
    env = dict(os.environ, MI100_CODEGEN_TXN_DELAY=str(delay))
    return subprocess.Popen([sys.executable, "-m", "codegen.cli", "torch", "install", "--bundle", str(bundle),
                             "--torch-dir", str(site / "torch"), "--replace-shipped", "gfx908"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("sig,ops", [(signal.SIGKILL, 0), (signal.SIGKILL, 1), (signal.SIGKILL, 3), (signal.SIGKILL, 6),
                                     (signal.SIGTERM, 2), (signal.SIGINT, 2)])
def test_a_real_signal_inside_the_transaction(world, tmp_path, sig, ops):
    """A `torch install` child process sent `sig` after `ops` operations of its journal (each
    delayed 0.3 s), then `torch restore` in a fresh process: torch as before, nothing left. SIGINT
    (Ctrl-C) exits 130 with the install finished; SIGKILL and SIGTERM leave it to the restore."""
    site = _copy(world["site"], tmp_path / "site")
    journal = site / "torch" / ".mi100-codegen" / "txn" / "journal.json"
    p = _child(site, world["bundle"], 0.3)
    t0 = time.monotonic()
    while not journal.exists() and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.01)
    assert journal.exists(), "the install never committed"
    time.sleep(0.3 * ops + 0.15)
    p.send_signal(sig)
    assert p.wait() == (130 if sig == signal.SIGINT else -sig)
    if sig == signal.SIGINT:
        assert is_state(world, site, "installed") and leftovers(site) == []
    r = subprocess.run([sys.executable, "-m", "codegen.cli", "torch", "restore", "--torch-dir", str(site / "torch")],
                       cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sig == signal.SIGINT or "finished the interrupted torch install" in r.stderr, r.stderr
    assert is_state(world, site, "pristine") and leftovers(site) == []


def test_status_says_an_interrupted_install_is_unfinished(world, tmp_path):
    site = _copy(world["site"], tmp_path / "site")
    out = run_stopped(site, lambda: install(site, world["bundle"]), _lands_on("replace", LIB.split("/")[-1]),
                      "kill", tmp_path / "log.json")
    assert out.killed
    r = cli("torch", "status", "--torch-dir", str(site / "torch"))
    assert r.exit_code == 0 and "an interrupted torch install left its journal" in " ".join(r.stdout.split()), r.stdout


def test_the_owners_dry_run_says_an_interrupted_install_is_unfinished(world, tmp_path, monkeypatch):
    """`torch install --bundle auto --dry-run` changes nothing and names the unfinished install."""
    from owner_machine import sysfs

    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "cache"))
    site = _copy(world["site"], tmp_path / "site")
    out = run_stopped(site, lambda: install(site, world["bundle"]), _lands_on("replace", LIB.split("/")[-1]),
                      "kill", tmp_path / "log.json")
    assert out.killed
    frozen = state(site)
    r = cli("torch", "install", "--bundle", "auto", "--index", str(tmp_path / "none"), "--torch-dir",
            str(site / "torch"), "--sysfs", str(sysfs(tmp_path / "sys", "gfx908")), "--build-locally", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "note:     an interrupted torch install left its journal" in r.output, r.output
    assert state(site) == frozen
