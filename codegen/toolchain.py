"""The spec's toolchain (`toolchain.triton`) against the Triton a stage would compile with (pure).

`precompile`, `build` and `tune` call `require_triton` before any work: a Triton outside the
spec's versions is refused with one message that names the fix, a build venv of the spec's
Triton (`build_venv_recipe`). Nothing here installs anything, and the fix never installs into the
interpreter found: on a ROCm box that is the torch environment, whose `triton` module is AMD's
fork (pytorch-triton-rocm) that torch.compile needs (docs/build.md, "Which Triton").
"""

from __future__ import annotations

import importlib.metadata

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .errors import EnvironmentMissing
from .models import TargetSpec

# The versions that compile AOTriton's kernels when the spec names none (gfx908, measured).
DEFAULT_TRITON = ">=3.5.1,<3.9"
VENV = "~/.cache/mi100-codegen/venv-triton"


# distributions that install the top-level `triton` module: pip's, AMD's fork (ROCm torch wheels
# depend on it), the CUDA torch wheels' pin
TRITON_DISTRIBUTIONS = ("triton", "pytorch-triton-rocm", "pytorch-triton")


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


def build_venv_recipe(spec: TargetSpec) -> str:
    """Shell commands that create a build venv holding the spec's Triton (and this project)."""
    want = triton_specifier(spec)
    return (f"python3 -m venv {VENV}-{spec.arch} && {VENV}-{spec.arch}/bin/pip install 'triton{want}' "
            f"'mi100-codegen[upstream]' (or -e <this checkout>[upstream]); then run mi100-codegen from "
            f"that venv ({VENV}-{spec.arch}/bin/mi100-codegen), never pip install triton into the torch environment")


def triton_mismatch(spec: TargetSpec, version: str | None) -> str | None:
    """Why `version` (None: no Triton) cannot compile for the spec's arch; None when it can."""
    want = triton_specifier(spec)
    if version is None:
        return f"no Triton installed; {spec.arch} needs Triton {want} (toolchain.triton of the spec)"
    try:
        v = Version(version)
    except InvalidVersion:
        return f"cannot read Triton's version {version!r}; {spec.arch} needs Triton {want}"
    # local builds (e.g. AMD's fork 3.5.0+rocm7.1) compare by their public version
    if Version(v.public) not in SpecifierSet(want, prereleases=True):
        return (f"Triton {version} does not compile AOTriton's kernels for {spec.arch}: "
                f"the spec's toolchain.triton is {want!r}")
    return None


def require_triton(spec: TargetSpec, version: str | None, stage: str, python: str = "this Python") -> None:
    """Refuse a Triton outside the spec's toolchain: one message naming the fix (exit 3)."""
    why = triton_mismatch(spec, version)
    if why is not None:
        raise EnvironmentMissing(f"{stage}: {why} (in {python})", hint=build_venv_recipe(spec))


__all__ = ["DEFAULT_TRITON", "TRITON_DISTRIBUTIONS", "build_venv_recipe", "installed_triton_version", "require_triton", "triton_mismatch", "triton_specifier"]
