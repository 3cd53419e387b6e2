"""The spec's toolchain (`toolchain.triton`) against the Triton a stage would compile with.

`precompile`, `build` and `tune` call `require_triton` before any work: a Triton outside the
spec's versions is refused with one message that names the fix. `precompile` and `build` compile
with a build venv of their own by default (`codegen.toolchain.venv` creates and caches it;
`codegen.toolchain.interpreter` picks it or the interpreter passed as `--python`), so the fix they name
is that venv. Nothing in this package installs into the running interpreter or the user's torch
environment: on a ROCm box that environment's `triton` module is AMD's fork (pytorch-triton-rocm),
which torch.compile needs (docs/toolchain.md).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from codegen.core.errors import EnvironmentMissing
from codegen.models import TargetSpec

# The versions that compile AOTriton's kernels when the spec names none (gfx908, measured).
DEFAULT_TRITON = ">=3.5.1,<3.9"

# distributions that install the top-level `triton` module: pip's, AMD's fork (ROCm torch wheels
# depend on it), the CUDA torch wheels' pin
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")

# requirements.txt entries the generator never imports (test runners, packaging, the Python
# binding): neither demanded nor installed. The generator needs numpy, pandas (and pyyaml in 0.12b).
NOT_NEEDED = frozenset({"iniconfig", "pluggy", "setuptools", "wheel", "pybind11", "filelock", "packaging"})

DOCS = "docs/toolchain.md"


def installed_triton_version() -> str | None:
    """The version of the distribution that provides `triton` in this Python (None: none)."""
    for dist in TRITON_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def triton_specifier(spec: TargetSpec) -> str:
    return spec.toolchain.triton or DEFAULT_TRITON


def requirement_names(tree: Path) -> list[str]:
    """Distribution names in the tree's requirements.txt (what its generator imports)."""
    req = Path(tree) / "requirements.txt"
    names: list[str] = []
    if req.is_file():
        for line in req.read_text(errors="replace").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", line)
            if m:
                names.append(m.group(1))
    return sorted(set(names))


def generator_requirements(tree: Path, python_binding: bool = False) -> tuple[str, ...]:
    """What the tree's generator (and, asked for, its Python binding) needs in the compiler's Python."""
    skip = NOT_NEEDED - ({"pybind11"} if python_binding else set())
    return tuple(n for n in requirement_names(tree) if n.lower() not in skip)


def venv_fix(spec: TargetSpec) -> str:
    """The fix every refusal of precompile/build names: the build venv, never the torch environment."""
    return (f"leave out --python: precompile and build then compile with a build venv of "
            f"'triton{triton_specifier(spec)}' that they create and cache themselves (--triton-version "
            f"picks one; {DOCS}); never pip install triton into the torch environment")


def tune_fix(spec: TargetSpec) -> str:
    """tune launches kernels on torch tensors in its own process: it cannot use the build venv."""
    return (f"tune uses this environment's Triton read-only (it launches the kernels on torch tensors): "
            f"run it in a torch environment whose triton or pytorch-triton-rocm is '{triton_specifier(spec)}' "
            f"(e.g. a newer ROCm torch wheel in a venv of its own); never pip install triton into the torch "
            f"environment ({DOCS})")


def triton_mismatch(spec: TargetSpec, version: str | None) -> str | None:
    """Why `version` (None: no Triton) cannot compile for the spec's arch; None when it can."""
    want = triton_specifier(spec)
    if version is None:
        return f"no Triton installed; {spec.arch} needs Triton '{want}' (toolchain.triton of the spec)"
    try:
        v = Version(version)
    except InvalidVersion:
        return f"cannot read Triton's version {version!r}; {spec.arch} needs Triton '{want}'"
    # local builds (e.g. AMD's fork 3.5.0+rocm7.1) compare by their public version
    if Version(v.public) not in SpecifierSet(want, prereleases=True):
        return (f"Triton {version} does not compile AOTriton's kernels for {spec.arch}: "
                f"the spec's toolchain.triton is {want!r}")
    return None


def require_triton(spec: TargetSpec, version: str | None, stage: str, python: str = "this Python",
                   hint: str | None = None) -> None:
    """Refuse a Triton outside the spec's toolchain: one message naming the fix (exit 3)."""
    why = triton_mismatch(spec, version)
    if why is not None:
        raise EnvironmentMissing(f"{stage}: {why} (in {python})", hint=hint or venv_fix(spec))


__all__ = ["DEFAULT_TRITON", "DOCS", "NOT_NEEDED", "TRITON_DISTRIBUTIONS", "generator_requirements",
           "installed_triton_version", "require_triton", "requirement_names", "triton_mismatch",
           "triton_specifier", "tune_fix", "venv_fix"]
