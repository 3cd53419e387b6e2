"""The build venv: a virtual environment of our own that holds the spec's Triton and the tree's
generator requirements, created on first use and cached under the user's cache directory.

One venv per key (the Python it runs + its Triton version + the requirements it holds), in
`<cache>/toolchain/<name>/` with a `toolchain.json` record. Creation happens in a temporary
directory beside the cache entries, under a lock file, and ends with one rename: a directory under
its final name is always complete, an interrupted creation leaves only a `.tmp-*` directory
that no lookup accepts and the next creation removes. pip runs in the new venv only (its own
`python -m pip`), with the caller's environment and pip configuration passed through (index
URLs, find-links, constraints, offline wheel directories); never in the running interpreter.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from rich.console import Console

from codegen.core import processes, ui
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.resources import user_cache_dir
from codegen.core.fsutil import move_into_place
from codegen.models.records import read_record
from codegen.models.toolchain import TOOLCHAIN_RECORD, VenvKey
from codegen.toolchain import DOCS

RECORD = TOOLCHAIN_RECORD
PIP_TIMEOUT_S = 3600.0  # one pip install of Triton and the generator requirements
LOCK = ".lock"
TMP_PREFIX = ".tmp-"


class VenvError(EnvironmentMissing):
    """pip or venv failed while creating a build venv (exit 3); the message names pip's log."""


def default_root() -> Path:
    """`$MI100_CODEGEN_CACHE/toolchain`, else `$XDG_CACHE_HOME` (or ~/.cache)`/mi100-codegen/toolchain`."""
    return user_cache_dir("toolchain")


def base_python() -> str:
    """The interpreter a build venv is made from: the one running us (its compile workers load our
    modules from this process's environment, so the Python version must be the same)."""
    return sys.executable


def python_id(python: str | None = None) -> str:
    """`cpython-3.11.7` of the running interpreter (a venv's key part: its ABI)."""
    return f"{platform.python_implementation().lower()}-{platform.python_version()}"


def normalise_requirements(names) -> tuple[str, ...]:
    return tuple(sorted({canonicalize_name(n) for n in names}))


def key_for(triton: str, requirements, python: str | None = None) -> VenvKey:
    py = python or base_python()
    return VenvKey(python=python_id(py), base=os.path.realpath(py), triton=triton,
                   requirements=normalise_requirements(requirements))


@dataclass(frozen=True)
class BuildVenv:
    path: Path
    key: VenvKey

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def triton(self) -> str:
        return self.key.triton


def _read(entry: Path) -> BuildVenv | None:
    """A complete build venv at `entry`, or None (a temp dir, a foreign dir, a broken record)."""
    if entry.name.startswith(".") or not entry.is_dir():
        return None
    try:
        key = read_record(VenvKey, entry / RECORD, what="build venv record")
    except UserError:   # codegen.models.records.RecordError: not a venv of ours
        return None
    if key.dirname != entry.name or not (entry / "bin" / "python").exists():
        return None
    return BuildVenv(entry, key)


def cached_venvs(root: Path) -> list[BuildVenv]:
    if not root.is_dir():
        return []
    return [v for v in (_read(p) for p in sorted(root.iterdir())) if v is not None]


def _triton_allowed(version: str, specifier: str) -> bool:
    try:
        return Version(Version(version).public) in SpecifierSet(specifier, prereleases=True)
    except InvalidVersion:
        return False


def find_venv(root: Path, specifier: str, requirements, triton: str | None = None,
              python: str | None = None) -> BuildVenv | None:
    """The cached venv for this interpreter that holds every requirement and a Triton the specifier
    allows (exactly `triton` when given); the newest Triton among them."""
    want = set(normalise_requirements(requirements))
    me = key_for("0", (), python)
    fits = [v for v in cached_venvs(root)
            if v.key.python == me.python and v.key.base == me.base and want <= set(v.key.requirements)
            and _triton_allowed(v.triton, specifier) and (triton is None or v.triton == triton)]
    return max(fits, key=lambda v: (Version(v.triton), v.path.name), default=None)


@contextmanager
def _locked(root: Path, console: Console) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / LOCK))
    try:
        lock.acquire(timeout=0.5)
    except Timeout:
        console.print(f"waiting for another mi100-codegen run that is creating a build venv ({root / LOCK})")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _remove_stale(root: Path) -> None:
    """Temp dirs left by a killed creation (only a lock holder creates them: none is live now)."""
    for p in root.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(p, ignore_errors=True)


def pip_env() -> dict[str, str]:
    """The caller's environment (pip's own configuration included), minus what would point pip or
    Python at another environment."""
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_TARGET", "PIP_PREFIX", "PIP_USER",
                "PIP_REQUIRE_VIRTUALENV", "CONDA_PREFIX"):
        env.pop(var, None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run_logged(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        try:
            proc = processes.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=pip_env(), text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise VenvError(f"{what} did not finish within {PIP_TIMEOUT_S / 60:g} min (killed); pip's log: {log}",
                            hint=f"check the network or your pip configuration, or pre-create the venv offline "
                                 f"({DOCS})") from None
    if proc.returncode != 0:
        tail = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        last = next((ln.strip() for ln in reversed(tail) if "error" in ln.lower()), tail[-1].strip() if tail else "")
        raise VenvError(f"{what} failed (exit {proc.returncode}): {last}; pip's log: {log}",
                        hint=f"pip runs with your pip configuration (index URLs, PIP_FIND_LINKS, "
                             f"constraints): fix it, or pre-create the venv offline ({DOCS})")


def create_venv(root: Path, specifier: str, requirements, triton: str | None, console: Console,
                python: str | None = None) -> BuildVenv:
    """Create a build venv (caller holds the lock): venv in a temp dir, pip install, record, rename."""
    py = python or base_python()
    want = f"triton=={triton}" if triton else f"triton{specifier}"
    reqs = list(normalise_requirements(requirements))
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root))
    log = root / "pip.log"
    log.write_text("", encoding="utf-8")
    # not "once": a tree whose generator needs a package this venv lacks (0.12b+: pyyaml) gets one more
    console.print(f"creating a build venv with '{want}' {' '.join(reqs)} under {root} (kept: later runs that "
                  f"need this Triton and no other packages reuse it; pip's log: {log})", markup=False)
    try:
        with console.status(f"python -m venv {tmp.name}"):
            _run_logged([py, "-m", "venv", str(tmp)], log, f"{py} -m venv")
        vpy = str(tmp / "bin" / "python")
        with console.status(f"pip install '{want}' {' '.join(reqs)} (about 250 MB for Triton)"):
            _run_logged([vpy, "-m", "pip", "install", "--no-input", want, *reqs], log, "pip install")
        # import-time dependency: a cycle (the interpreter module imports this one)
        from codegen.toolchain.interpreter import probe

        version = probe(vpy, ("triton",), env=pip_env())["found"]["triton"] or ""
        if not _triton_allowed(version, specifier):
            raise VenvError(f"pip installed Triton {version}, outside '{specifier}' (a constraint or "
                            f"pin in your pip configuration?); pip's log: {log}")
        key = key_for(version, reqs, py)
        (tmp / RECORD).write_text(json.dumps(key.as_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        final = root / key.dirname
        existing = _read(final)
        if existing is not None:  # an equal venv appeared (another lock holder before us): use it
            return existing
        if final.exists():
            shutil.rmtree(final)  # a foreign or broken entry under our name: ours to replace
        move_into_place(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    made = _read(final)
    if made is None:  # pragma: no cover - the rename succeeded, so the record is there
        raise VenvError(f"{final}: the build venv is incomplete after creation")
    console.print(f"build venv ready: {final} (Triton {made.triton})")
    return made


def ensure_venv(specifier: str, requirements, *, triton: str | None = None, root: Path | None = None,
                console: Console | None = None) -> BuildVenv:
    """The cached build venv for the spec's Triton (`triton`: exactly that one), created when absent."""
    root = Path(root) if root is not None else default_root()
    console = console or ui.console()
    if triton is not None and not _triton_allowed(triton, specifier):
        raise UserError(f"--triton-version {triton}: outside the spec's toolchain.triton '{specifier}'")
    found = find_venv(root, specifier, requirements, triton)
    if found is not None:
        return found
    with _locked(root, console):
        found = find_venv(root, specifier, requirements, triton)  # made while we waited?
        if found is not None:
            return found
        _remove_stale(root)
        return create_venv(root, specifier, requirements, triton, console)
