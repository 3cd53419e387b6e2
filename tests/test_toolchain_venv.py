"""The build venv (codegen.toolchain.venv): key derivation, lookup, atomic creation under a lock,
interruption safety, pip failures, and the compile workers running in it.

The real creations here are offline and take seconds: `python -m venv` plus pip installing a tiny
stand-in `triton` wheel built by the test (no index: PIP_NO_INDEX, PIP_FIND_LINKS). A real
`pip install triton` (250 MB) is `slow`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock
from rich.console import Console

from codegen.core.errors import EnvironmentMissing, UpstreamError, UserError
from codegen.toolchain import generator_requirements
from codegen.toolchain import venv
from codegen.toolchain.interpreter import compiler_python
from codegen.toolchain.venv import (BuildVenv, VenvError, cached_venvs, default_root, ensure_venv, find_venv,
                                    key_for)

SPEC = ">=3.5.1,<3.9"


def _quiet() -> Console:
    return Console(stderr=True, quiet=True)


def fake_triton_wheel(folder: Path, version: str) -> Path:
    """A pure-Python wheel named triton whose module only reports its version."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"triton-{version}-py3-none-any.whl"
    info = f"triton-{version}.dist-info"
    files = {
        "triton/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: triton\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: mi100-codegen-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return whl


@pytest.fixture
def offline_pip(tmp_path, monkeypatch):
    """pip sees only a local folder of stand-in triton wheels (3.6.0 and 3.8.0)."""
    wheels = tmp_path / "wheels"
    for v in ("3.6.0", "3.8.0"):
        fake_triton_wheel(wheels, v)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


def _fake_entry(root: Path, triton: str, reqs=(), *, python=None) -> BuildVenv:
    """A cache entry as creation leaves it (record + bin/python), without running pip."""
    key = key_for(triton, reqs, python)
    d = root / key.dirname
    (d / "bin").mkdir(parents=True)
    os.symlink(sys.executable, d / "bin" / "python")
    (d / venv.RECORD).write_text(json.dumps(key.as_dict()))
    return BuildVenv(d, key)


def test_key_derivation():
    a = key_for("3.6.0", ["pandas", "PyYAML", "numpy"])
    assert a == key_for("3.6.0", ["numpy", "pyyaml", "pandas", "pandas"])  # canonical names, sorted, once
    assert a.requirements == ("numpy", "pandas", "pyyaml")
    assert a.digest == key_for("3.6.0", ("pyyaml", "numpy", "pandas")).digest
    assert a.digest != key_for("3.8.0", ["numpy", "pandas", "pyyaml"]).digest
    assert a.digest != key_for("3.6.0", ["numpy", "pandas"]).digest
    other_py = venv.VenvKey(python="cpython-3.12.1", base=a.base, triton=a.triton, requirements=a.requirements)
    assert other_py.digest != a.digest
    assert a.dirname.startswith(f"triton-3.6.0-{a.python}-") and a.dirname.endswith(a.digest[:12])


def test_root_honours_the_cache_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("MI100_CODEGEN_CACHE", str(tmp_path / "c"))
    assert default_root() == tmp_path / "c" / "toolchain"
    monkeypatch.delenv("MI100_CODEGEN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_root() == tmp_path / "x" / "mi100-codegen" / "toolchain"


def test_generator_requirements(tmp_path):
    (tmp_path / "requirements.txt").write_text("filelock\npackaging\nnumpy\npybind11\npandas\npyyaml\nwheel\n")
    assert generator_requirements(tmp_path) == ("numpy", "pandas", "pyyaml")
    assert generator_requirements(tmp_path, python_binding=True) == ("numpy", "pandas", "pybind11", "pyyaml")


def test_lookup_accepts_complete_entries_only(tmp_path):
    root = tmp_path / "toolchain"
    old = _fake_entry(root, "3.6.0", ["numpy", "pandas", "pyyaml"])
    new = _fake_entry(root, "3.8.0", ["numpy", "pandas"])
    (root / ".tmp-abc").mkdir()                                     # an interrupted creation
    renamed = root / "triton-3.8.0-x"                                # a copy under another name
    (renamed / "bin").mkdir(parents=True)
    (renamed / venv.RECORD).write_text(json.dumps(new.key.as_dict()))
    broken = _fake_entry(root, "3.7.0")
    (broken.path / venv.RECORD).write_text("{")
    assert [v.triton for v in cached_venvs(root)] == ["3.6.0", "3.8.0"]
    assert find_venv(root, SPEC, ["pandas"]).path == new.path           # newest Triton the spec allows
    assert find_venv(root, SPEC, ["pandas", "PyYAML"]).path == old.path  # requirements must be held
    assert find_venv(root, ">=3.8.0,<3.9", ["pyyaml"]) is None
    assert find_venv(root, SPEC, [], triton="3.6.0").path == old.path
    assert find_venv(root, "<3.6", []) is None


def test_creation_is_real_atomic_and_cached(tmp_path, offline_pip, monkeypatch):
    from codegen.toolchain import installed_triton_version

    root = tmp_path / "toolchain"
    before = installed_triton_version()
    made = ensure_venv(SPEC, [], root=root, console=_quiet())
    assert made.triton == "3.8.0"                                    # the newest the spec allows
    assert made.path.parent == root and made.path.name == made.key.dirname
    out = subprocess.run([made.python, "-c", "import triton; print(triton.__version__)"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert out.stdout.strip() == "3.8.0"
    assert not list(root.glob(".tmp-*")) and (root / "pip.log").is_file()
    # re-running is safe and installs nothing
    monkeypatch.setattr(venv, "create_venv", lambda *a, **k: pytest.fail("re-created"))
    assert ensure_venv(SPEC, [], root=root, console=_quiet()) == made
    assert ensure_venv(">=3.8.0,<3.9", [], root=root, console=_quiet()) == made
    assert installed_triton_version() == before                      # the running interpreter untouched


def test_pip_failure_is_one_message_with_the_log(tmp_path, offline_pip):
    root = tmp_path / "toolchain"
    with pytest.raises(VenvError) as ei:
        ensure_venv(SPEC, ["surely-not-a-package-xyz"], root=root, console=_quiet())
    assert ei.value.exit_code == 3
    assert "pip install failed" in str(ei.value) and str(root / "pip.log") in str(ei.value)
    assert "surely-not-a-package-xyz" in (root / "pip.log").read_text()
    assert cached_venvs(root) == [] and not list(root.glob(".tmp-*"))


def test_interrupted_creation_leaves_nothing_valid(tmp_path, monkeypatch):
    root = tmp_path / "toolchain"

    def interrupted(cmd, log, what):  # Ctrl-C halfway through: the temp dir has content
        (Path(cmd[-1]) / "bin").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(venv, "_run_logged", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ensure_venv(SPEC, [], root=root, console=_quiet())
    assert cached_venvs(root) == [] and not list(root.glob(".tmp-*"))
    # a creation killed outright leaves a .tmp-* dir: never accepted, removed by the next creation
    stale = root / ".tmp-killed"
    (stale / "bin").mkdir(parents=True)
    made = []
    monkeypatch.setattr(venv, "create_venv", lambda root, *a, **k: made.append(root) or _fake_entry(root, "3.8.0"))
    got = ensure_venv(SPEC, [], root=root, console=_quiet())
    assert got.triton == "3.8.0" and len(made) == 1 and not stale.exists()


def test_lock_serialises_creations(tmp_path, monkeypatch):
    root = tmp_path / "toolchain"
    root.mkdir()
    calls = []

    def create(root, *a, **k):
        calls.append(1)
        time.sleep(0.3)
        return _fake_entry(root, "3.8.0")

    monkeypatch.setattr(venv, "create_venv", create)
    console = Console(stderr=True, record=True, force_terminal=False)
    waiting = threading.Semaphore(0)   # released as each run says it waits: an event, not a timing
    shown = console.print

    def noted(*args, **kw):
        shown(*args, **kw)
        if "waiting for another mi100-codegen run" in str(args[0]):
            waiting.release()

    console.print = noted
    held = FileLock(str(root / venv.LOCK))
    held.acquire()
    results = []
    runs = [threading.Thread(target=lambda: results.append(ensure_venv(SPEC, [], root=root, console=console)))
            for _ in range(2)]
    for t in runs:
        t.start()
    assert all(waiting.acquire(timeout=120) for _ in runs), "a run did not reach the held lock"
    assert all(t.is_alive() for t in runs) and calls == []           # both wait for the holder
    held.release()
    for t in runs:
        t.join(30)
    assert len(calls) == 1 and len(results) == 2 and results[0] == results[1]  # the second one reused it


def test_interpreter_choice_refusals(tmp_path, monkeypatch):
    from codegen.formats.spec import load_spec
    from codegen.toolchain import interpreter

    gfx908 = load_spec("rules/mi100.yaml").spec
    with pytest.raises(UserError, match="--triton-version picks the build venv"):
        compiler_python(gfx908, "precompile", python=sys.executable, triton="3.6.0")
    monkeypatch.setattr(interpreter, "probe", lambda _py: {"triton": "3.6.0", "python": [2, 7]})
    with pytest.raises(UserError, match="is Python 2.7"):
        compiler_python(gfx908, "precompile", python=sys.executable, same_python=True)
    monkeypatch.setattr(interpreter, "probe", lambda _py: {"triton": "3.5.0+rocm7.1", "python": [3, 11]})
    with pytest.raises(EnvironmentMissing) as ei:  # AMD's fork below the spec: refused, exit 3, venv named
        compiler_python(gfx908, "build", python=sys.executable)
    assert ei.value.exit_code == 3 and "3.5.0+rocm7.1" in str(ei.value) and "build venv" in ei.value.hint
    # the default: the build venv (created by ensure_venv), its Python and Triton
    monkeypatch.setattr(interpreter, "ensure_venv", lambda spec, reqs, **k: _fake_entry(tmp_path, "3.8.0", reqs))
    got = compiler_python(gfx908, "precompile", requirements=["pandas"])
    assert got.origin == "build venv" and got.triton == "3.8.0" and got.python.startswith(str(tmp_path))
    assert not got.is_current


def test_build_venv_defaults_to_the_compile_reports_triton(tmp_path, monkeypatch):
    """The seeded rows are capped by tuning/<arch>/compile_report.json: the build venv takes the Triton
    that report measured (gfx908: 3.5.1, gfx906: 3.8.0) unless --triton-version names another, and a
    Triton other than the report's is compiled with a warning."""
    import io

    from codegen.formats.spec import load_spec
    from codegen.toolchain import interpreter

    asked = []

    def fake(spec, reqs, *, triton=None, console=None):
        asked.append(triton)
        return _fake_entry(tmp_path / str(len(asked)), triton or "3.8.0", reqs)

    monkeypatch.setattr(interpreter, "ensure_venv", fake)
    for name, measured in (("mi100", "3.5.1"), ("mi50", "3.8.0"), ("rdna2", "3.5.1")):
        spec = load_spec(f"rules/{name}.yaml").spec
        assert interpreter.measured_triton(spec) == measured
        out = io.StringIO()
        got = compiler_python(spec, "build", console=Console(file=out, width=200))
        assert asked[-1] == measured and got.triton == measured and "warning" not in out.getvalue()
    gfx908 = load_spec("rules/mi100.yaml").spec
    out = io.StringIO()
    got = compiler_python(gfx908, "build", triton="3.8.0", console=Console(file=out, width=200))
    assert asked[-1] == "3.8.0" and got.triton == "3.8.0"
    assert "compiling with Triton 3.8.0, but tuning/gfx908/compile_report.json" in out.getvalue()
    assert "measured with 3.5.1" in out.getvalue()


def test_workers_run_in_the_venv_with_its_own_triton(tmp_path, offline_pip):
    """The compile workers start in the venv's Python, import its `triton` (not this process's),
    and are refused when that is not the version they were chosen for."""
    from codegen.compile.pool import WorkerPool

    made = ensure_venv(SPEC, [], triton="3.6.0", root=tmp_path / "toolchain", console=_quiet())
    assert made.triton == "3.6.0"                                    # --triton-version: exactly that one
    with pytest.raises(UserError, match="outside the spec's toolchain.triton"):
        ensure_venv(">=3.8.0,<3.9", [], triton="3.6.0", root=tmp_path / "toolchain", console=_quiet())
    task = {"id": "k0", "source": str(tmp_path / "nope.py"), "kernel_name": "k", "signature": "*fp16:16",
            "num_warps": 4, "num_stages": 1, "waves_per_eu": 2, "arch": "gfx908", "warp_size": 64}
    got = []
    WorkerPool(1, {}, 60, python=made.python, triton="3.6.0").run([task], got.append)
    assert len(got) == 1 and got[0]["ok"] is False and got[0]["id"] == "k0"  # the stand-in cannot compile
    with pytest.raises(UpstreamError, match="imported Triton 3.6.0, not the 3.8.0"):
        WorkerPool(1, {}, 60, python=made.python, triton="3.8.0").run([task], got.append)
    from multiprocessing import spawn

    from codegen.core import pool

    assert spawn.get_executable() == pool._DEFAULT_EXECUTABLE            # restored for everyone else


def test_tune_names_a_torch_environment_never_an_install():
    """tune cannot use the build venv (it launches on torch tensors in-process): its refusal names
    a torch environment of an allowed Triton, and installs nothing."""
    from codegen.formats.spec import load_spec
    from codegen.toolchain import require_triton, tune_fix

    gfx908 = load_spec("rules/mi100.yaml").spec
    with pytest.raises(EnvironmentMissing) as ei:
        require_triton(gfx908, "3.5.0+rocm6.4", "tune", "/opt/torch/bin/python", hint=tune_fix(gfx908))
    hint = ei.value.hint
    assert ei.value.exit_code == 3 and "tune: Triton 3.5.0+rocm6.4" in str(ei.value)
    assert "torch environment whose triton or pytorch-triton-rocm is '>=3.5.1,<3.9'" in hint
    assert "never pip install triton into the torch environment" in hint and "--python" not in hint
