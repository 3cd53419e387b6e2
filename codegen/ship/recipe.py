"""`torch rebuild-recipe`: build PyTorch from source against our AOTriton install prefix.

PyTorch's `cmake/External/aotriton.cmake` (2.6 and later) reads two environment variables:
`AOTRITON_INSTALLED_PREFIX` makes it use (and copy into torch/lib) a preinstalled AOTriton
(`lib/` with the library and `aotriton.images/`, `include/`); `AOTRITON_INSTALL_FROM_SOURCE`
makes it clone and build upstream AOTriton itself (pristine, without gfx908), so the recipe
unsets it. `PYTORCH_ROCM_ARCH` selects the GPU targets of torch's own HIP code.

The torch branch is chosen from the AOTriton release of the prefix (the table in layout.py):
building a torch whose release line differs from the prefix's would link a mismatched library.
Where two torch lines link the same AOTriton line (2.11 and 2.12: 0.11.2b), the installed torch's
line is preferred when it is one of them. Without --prefix or --release the release comes from
the installed ROCm torch: the newest release of the line it links that mi100-codegen supports.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from codegen.core import processes
from codegen.core.errors import CodegenError, EXIT_UPSTREAM, EnvironmentMissing, UserError
from codegen.ship.layout import (TORCH_LINES, TORCH_TO_AOTRITON, TorchInstall, build_release_for_line, inspect_prefix,
                     unsupported_line_message)
from codegen.upstream.releases import tag_line

PYTORCH_GIT = "https://github.com/pytorch/pytorch.git"


class RecipeError(CodegenError):
    exit_code = EXIT_UPSTREAM


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    cwd: str  # "." (workdir) or the torch source folder
    done_if: str | None = None  # a path (relative to workdir) whose existence means done


@dataclass(frozen=True)
class Recipe:
    torch_line: str
    aotriton_tag: str
    prefix: str
    arch: str
    branch: str
    src: str
    env: tuple[tuple[str, str], ...]
    unset: tuple[str, ...]
    steps: tuple[Step, ...]


def torch_line_for_tag(tag: str, prefer: str | None = None) -> str | None:
    """The PyTorch feature release for an AOTriton tag: `prefer` (the installed torch's line) when
    it links the same release line, else the one that links exactly this tag, else the first one
    of its release line."""
    line = tag_line(tag)
    if prefer is not None and line is not None and tag_line(TORCH_TO_AOTRITON.get(prefer, "")) == line:
        return prefer
    exact = (t for t, want in TORCH_TO_AOTRITON.items() if want == tag)
    same_line = (t for t, want in TORCH_TO_AOTRITON.items() if line is not None and tag_line(want) == line)
    return next(exact, next(same_line, None))


def release_for_installed_torch(torch: TorchInstall) -> str:
    """The AOTriton release to build for an installed ROCm torch: the newest supported release of
    the line its libtorch_hip.so links."""
    if not torch.is_rocm or torch.aot_needed is None:
        raise UserError(f"torch {torch.version} at {torch.root} links no libaotriton_v2.so.X.Y.Z (not a ROCm "
                        "build with AOTriton)",
                        hint="give --prefix (the AOTriton install prefix) or --release (an AOTriton tag like 0.11b)")
    tag = build_release_for_line(torch.aot_needed.line)
    if tag is None:
        raise UserError(unsupported_line_message(torch.aot_needed.tag))
    return tag


def plan_recipe(prefix: Path | None, release: str | None, arch: str, jobs: int | None = None,
                prefer_torch_line: str | None = None) -> Recipe:
    if prefix is not None:
        pre = inspect_prefix(prefix)
        tag = pre.parsed.tag
        if release and release != tag:
            raise UserError(f"--release {release} contradicts the prefix, which holds AOTriton {tag}")
        prefix_s = str(Path(prefix).resolve())
    elif release:
        tag = release
        prefix_s = "<PREFIX>"
    else:
        raise UserError("give --prefix (the AOTriton install prefix) or --release (an AOTriton tag like 0.11b)")
    line = torch_line_for_tag(tag, prefer_torch_line)
    if line is None:
        known = ", ".join(f"torch {k} <- AOTriton {v}" for k, v in TORCH_TO_AOTRITON.items())
        raise UserError(f"no known PyTorch release links AOTriton {tag}", hint=f"known: {known}")
    if build_release_for_line(tag_line(tag) or "") is None:
        raise UserError(unsupported_line_message(tag))
    branch = next(t.branch for t in TORCH_LINES if t.torch == line)
    src = f"pytorch-{line}"
    env = [
        ("USE_ROCM", "1"),
        ("USE_CUDA", "0"),
        ("PYTORCH_ROCM_ARCH", arch),
        ("AOTRITON_INSTALLED_PREFIX", prefix_s),
    ]
    if jobs:
        env.append(("MAX_JOBS", str(jobs)))
    steps = (
        Step("clone", ("git", "clone", "--branch", branch, "--recursive", PYTORCH_GIT, src), ".",
             done_if=f"{src}/setup.py"),
        Step("requirements", ("python", "-m", "pip", "install", "-r", "requirements.txt"), src),
        Step("hipify", ("python", "tools/amd_build/build_amd.py"), src),
        Step("wheel", ("python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", ".", "-w", "dist"), src),
        Step("install", ("sh", "-c", "python -m pip install --force-reinstall --no-deps dist/torch-*.whl"), src),
    )
    return Recipe(line, tag, prefix_s, arch, branch, src, tuple(env), ("AOTRITON_INSTALL_FROM_SOURCE",), steps)


def render_recipe(r: Recipe) -> str:
    out = [
        "#!/usr/bin/env bash",
        f"# PyTorch {r.torch_line} from source for {r.arch}, linked against the AOTriton {r.aotriton_tag}",
        f"# install prefix {r.prefix} (generated by mi100-codegen torch rebuild-recipe).",
        "# Needs ROCm (hipcc) and a Python environment to build in; takes hours.",
        "set -euo pipefail",
    ]
    for k, v in r.env:
        out.append(f"export {k}={shlex.quote(v)}")
    for k in r.unset:
        out.append(f"unset {k}  # would clone and build upstream AOTriton (no {r.arch}) instead of the prefix")
    for s in r.steps:
        cmd = " ".join(shlex.quote(a) for a in s.argv)
        if s.done_if:
            out.append(f"[ -e {shlex.quote(s.done_if)} ] || {cmd}   # step {s.name}")
        elif s.cwd == ".":
            out.append(f"{cmd}   # step {s.name}")
        else:
            out.append(f"(cd {shlex.quote(s.cwd)} && {cmd})   # step {s.name}")
    out.append("python -c 'import torch; print(torch.__version__, torch.version.hip)'")
    out.append("mi100-codegen torch status && mi100-codegen validate --json report.json --md report.md")
    return "\n".join(out) + "\n"


def run_recipe(r: Recipe, workdir: Path, log=print) -> None:
    """Run the steps in `workdir`; each finished step leaves a marker, so a rerun resumes."""
    if r.prefix == "<PREFIX>":
        raise UserError("--run needs --prefix (the AOTriton install prefix to build against)")
    rocm = os.environ.get("ROCM_PATH", "/opt/rocm")
    if shutil.which("hipcc") is None and not Path(rocm, "bin", "hipcc").exists():
        raise EnvironmentMissing(f"no ROCm found (hipcc is not on PATH and not in {rocm}/bin): building "
                                 "PyTorch for ROCm needs it", hint="run this on the ROCm machine, or print the recipe without --run")
    if shutil.which("git") is None:
        raise EnvironmentMissing("git is not installed: the recipe clones PyTorch",
                                 hint="install git (apt-get install -y git) and run it again")
    workdir.mkdir(parents=True, exist_ok=True)
    marks = workdir / ".mi100-recipe"
    marks.mkdir(exist_ok=True)
    env = dict(os.environ)
    for k in r.unset:
        env.pop(k, None)
    env.update(dict(r.env))
    for s in r.steps:
        mark = marks / f"{s.name}.done"
        if mark.exists() or (s.done_if and (workdir / s.done_if).exists()):
            log(f"skip {s.name} (done)")
            continue
        log(f"run  {s.name}: {' '.join(s.argv)}")
        cwd = workdir if s.cwd == "." else workdir / s.cwd
        rc = processes.run(list(s.argv), cwd=cwd, env=env, timeout=None).returncode  # hours: no limit
        if rc != 0:
            raise RecipeError(f"step {s.name} failed (exit {rc}) in {cwd}",
                              hint="fix the cause and rerun the same command: finished steps are skipped")
        mark.write_text("")
