"""Which Python a compiling stage (precompile, bench, build) uses: the build venv by default, or the
interpreter given as `--python`, used as given (read-only) once its Triton passes the spec's check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from codegen.core import preflight, processes, ui
from codegen.core.errors import EnvironmentMissing, UserError
from codegen.models import TargetSpec
from codegen.render.inputs import committed_report
from codegen.toolchain import TRITON_DISTRIBUTIONS, require_triton, triton_mismatch, triton_specifier
from codegen.toolchain.venv import ensure_venv

_PROBE = r"""
import importlib.metadata as md, json, site, sys
found = {}
for n in json.loads(sys.argv[1]):
    try:
        found[n] = md.version(n)
    except md.PackageNotFoundError:
        found[n] = None
paths = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
if getattr(site, "ENABLE_USER_SITE", False) and site.getusersitepackages():
    paths.append(site.getusersitepackages())
print(json.dumps({"found": found, "site": paths, "python": list(sys.version_info[:3])}))
"""


@dataclass(frozen=True)
class CompilerPython:
    """The interpreter whose Triton compiles the kernels and whose environment runs the generator."""

    python: str
    triton: str
    origin: str                     # "build venv" or "--python"
    venv: Path | None = None

    @property
    def is_current(self) -> bool:
        """The running interpreter itself (its compile workers need nothing special). By path, not by
        the symlink's target: a venv's python and its base interpreter resolve to the same file but
        have different environments (treating the same one as another is harmless)."""
        return os.path.abspath(self.python) == os.path.abspath(sys.executable) and self.venv is None

    def describe(self) -> str:
        return f"Triton {self.triton} from {self.origin} {self.venv or self.python}"


PROBE_TIMEOUT_S = 60.0  # importing importlib.metadata and reading one version takes well under a second


def probe(python: str, names=(), env: dict | None = None) -> dict:
    """What another interpreter has (read-only): `found` (the version of each distribution of
    `names`, None when absent), `site` (its site-packages folders), `python` ([major, minor, micro])
    and `triton` (the first of TRITON_DISTRIBUTIONS found, or None)."""
    try:
        proc = processes.run([python, "-c", _PROBE, json.dumps(list(dict.fromkeys([*names, *TRITON_DISTRIBUTIONS])))],
                             capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=PROBE_TIMEOUT_S,
                             env=env)
    except subprocess.TimeoutExpired:
        raise EnvironmentMissing(f"{python} did not answer a version probe within "
                                 f"{PROBE_TIMEOUT_S:g} s (killed): is it a Python interpreter?") from None
    except OSError as exc:
        raise EnvironmentMissing(f"cannot run Python interpreter {python}: {exc}") from None
    if proc.returncode != 0:
        raise EnvironmentMissing(f"cannot run Python interpreter {python}: {proc.stderr.strip()[-400:]}")
    try:
        found = json.loads(proc.stdout)
        if not (isinstance(found, dict) and isinstance(found.get("python"), list)
                and isinstance(found.get("found"), dict) and isinstance(found.get("site"), list)):
            raise ValueError(found)
    except ValueError:
        raise EnvironmentMissing(f"{python}: its answer to the version probe is not ours "
                                 f"({proc.stdout.strip()[:200]!r}): is it a Python interpreter?") from None
    found["triton"] = next((v for d in TRITON_DISTRIBUTIONS if (v := found["found"].get(d))), None)
    return found


def compiler_python(spec: TargetSpec, stage: str, *, python: str | None = None, triton: str | None = None,
                    requirements=(), console: Console | None = None,
                    same_python: bool = False) -> CompilerPython:
    """`python` None: the cached build venv of the spec's Triton (exactly `triton` when given, else
    the version the committed compile report measured, when the spec allows it), created on first
    use; else that interpreter, refused unless its Triton is one the spec allows.
    `same_python`: the stage loads our modules in that interpreter (precompile's workers), so its
    Python version must be this one's."""
    measured = measured_triton(spec)
    if python is None:
        pick = triton if triton is not None else (measured if measured and not triton_mismatch(spec, measured)
                                                   else None)
        v = ensure_venv(triton_specifier(spec), requirements, triton=pick, console=console)
        _warn_unmeasured(spec, v.triton, measured, console)
        return CompilerPython(python=v.python, triton=v.triton, origin="build venv", venv=v.path)
    if triton is not None:
        raise UserError("--triton-version picks the build venv's Triton; with --python the interpreter's own "
                        "Triton is used: pass one of them")
    path = preflight.interpreter(python)
    found = probe(path)
    require_triton(spec, found["triton"], stage, path)
    if same_python and tuple(found["python"][:2]) != tuple(sys.version_info[:2]):
        have = ".".join(map(str, found["python"][:2]))
        raise UserError(f"--python {path} is Python {have}; {stage}'s compile workers load mi100-codegen's "
                        f"modules there from this Python {sys.version_info[0]}.{sys.version_info[1]}",
                        hint="pass an interpreter of the same Python version, or leave out --python (the build venv)")
    _warn_unmeasured(spec, found["triton"], measured, console)
    return CompilerPython(python=path, triton=found["triton"], origin="--python")


def measured_triton(spec: TargetSpec) -> str | None:
    """The Triton of tuning/<arch>/compile_report.json: the seeded rows are capped to what it measured."""
    report = committed_report(spec.arch)
    return report.triton if report is not None else None


def _warn_unmeasured(spec: TargetSpec, used: str | None, measured: str | None, console: Console | None) -> None:
    if measured and used and used != measured:
        (console or ui.console()).print(
            f"warning: compiling with Triton {used}, but tuning/{spec.arch}/compile_report.json (which caps the "
            f"seeded rows' waves_per_eu) was measured with {measured}: configs clean there may spill here; "
            f"re-measure (`mi100-codegen precompile TREE --tuning-report FILE`) or use Triton {measured}", style="yellow", markup=False)
