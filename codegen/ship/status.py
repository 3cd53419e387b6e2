"""`torch status`: what an installed PyTorch links, and whether our build is in it.

Everything it prints comes from a torch folder and a backup that may be someone else's: the text
form escapes control characters line by line (`codegen.core.ui.printable`: a version string's ESC
prints as `\x1b`, a newline cannot start a forged `problem:` line); JSON escapes them itself."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from codegen.core.errors import EnvironmentMissing, UserError
from codegen.core.fsutil import sha256_file
from codegen.core.ui import printable
from codegen.formats.elf import ElfError, read_dynamic
from codegen.models.archs import HSA_OVERRIDE_ENV
from codegen.models.machine import Machine
from codegen.models.records import Record
from codegen.ship.detect import SYSFS, DetectOptions, detect_machine, families, wheel_lines
from codegen.ship.install import MANIFEST, backup_location, default_backup_dir, read_manifest, unfinished
from codegen.ship.layout import (TORCH_TO_AOTRITON, TorchInstall, build_release_for_line, image_archs, inspect_torch,
                                 unsupported_line_message)


class PythonFacts(Record):
    """The Python mi100-codegen runs in: the one whose torch `torch status` reads by default."""

    executable: str
    version: str


class AotritonFile(Record):
    """The AOTriton library file torch links, as found in its lib/ folder."""

    path: str
    present: bool
    sha256: str | None = None
    soname: str | None = None
    error: str | None = None


class OursInstalled(Record):
    """Our build in torch, as its backup's manifest records it."""

    backup_dir: str
    arch: str
    prefix_library: str
    files: int
    library_matches_install: bool
    bundle: dict[str, Any] | None = None


class TorchStatus(Record):
    """What `torch status` found (text: `format_status`; JSON: `model_dump`). Every field but
    `python`, `machine`, `hsa_override`, `missing` and `next` is about the torch folder, None or
    empty when there is none (`torch_found` false)."""

    python: PythonFacts | None = None
    machine: Machine | None = None
    hsa_override: str | None = None          # HSA_OVERRIDE_GFX_VERSION in this environment
    torch_found: bool = True
    torch_dir: str | None = None
    torch_version: str | None = None
    hip_version: str | None = None
    cuda_version: str | None = None
    rocm_build: bool = False
    hip_library: str | None = None
    hip_runpath: list[str] | None = None
    aotriton_needed: str | None = None
    release_line: str | None = None
    release_tag: str | None = None
    build_release: str | None = None
    build_release_problem: str | None = None
    expected_release_for_torch: str | None = None
    aotriton_file: AotritonFile | None = None
    images: dict[str, int] = {}
    ours_installed: bool = False
    ours: OursInstalled | None = None
    problems: list[str] = []
    missing: list[str] = []                  # what this machine lacks for a drop-in, one phrase each
    next: str | None = None                  # the one next step, a command with the user's options


@dataclass(frozen=True)
class StatusOptions:
    torch_dir: Path | None = None            # --torch-dir (None: the torch this Python imports)
    backup_dir: Path | None = None           # --backup-dir
    arch: str | None = None                  # --arch
    sysfs: Path = SYSFS                      # --sysfs


def torch_facts(torch: TorchInstall, backup_dir: Path | None = None) -> dict:
    """The torch folder's part of the status (the TorchStatus fields about torch)."""
    backup_dir = backup_dir or default_backup_dir(torch)
    out: dict = {
        "torch_dir": str(torch.root),
        "torch_version": torch.version,
        "hip_version": torch.hip,
        "cuda_version": torch.cuda,
        "rocm_build": torch.is_rocm,
        "hip_library": str(torch.hip_lib) if torch.hip_lib else None,
        "expected_release_for_torch": TORCH_TO_AOTRITON.get(torch.feature_release),
        "images": image_archs(torch.lib_dir),
        "problems": [],
    }
    if torch.hip_dyn is not None:
        out["hip_runpath"] = list(torch.hip_dyn.runpath or torch.hip_dyn.rpath)
    need = torch.aot_needed
    if need is not None:
        out["aotriton_needed"] = need.name
        out["release_line"] = need.line
        out["release_tag"] = need.tag
        # what to build for this torch: the newest release of its line that we support
        out["build_release"] = build_release_for_line(need.line)
        if out["build_release"] is None:
            out["build_release_problem"] = unsupported_line_message(need.tag)
        f = torch.lib_dir / need.name
        info: dict = {"path": str(f), "present": f.is_file()}
        if f.is_file():
            info["sha256"] = sha256_file(f)
            try:
                info["soname"] = read_dynamic(f).soname
            except ElfError as exc:
                info["error"] = str(exc)
        else:
            out["problems"].append(f"{need.name} is missing from {torch.lib_dir}: import torch fails")
        out["aotriton_file"] = info
    elif torch.hip_dyn is not None:
        out["problems"].append("libtorch_hip.so needs no libaotriton_v2.so.X.Y.Z (static or no AOTriton)")
    out["problems"] += [u for u in [unfinished(torch, backup_dir)] if u]
    if os.path.islink(backup_dir) or os.path.lexists(backup_dir / MANIFEST):
        try:
            m = read_manifest(backup_dir)
        except UserError as exc:  # a damaged backup is reported, not fatal
            out["problems"].append(str(exc))
        else:
            lib_entry = next((e for e in m.entries if e.path == m.library), None)
            current = out.get("aotriton_file") or {}
            matches = lib_entry is not None and current.get("sha256") == lib_entry.sha256_after
            out["ours_installed"] = True
            out["ours"] = {
                "backup_dir": str(backup_dir),
                "arch": m.arch,
                "prefix_library": m.prefix_library,
                "files": len(m.entries),
                "library_matches_install": matches,
                "bundle": m.bundle.to_json() if m.bundle is not None else None,
            }
            if not matches:
                out["problems"].append("the AOTriton file changed since our install (torch reinstalled?)")
    return out


def torch_status(torch: TorchInstall, backup_dir: Path | None = None) -> TorchStatus:
    """The status of one torch folder alone (`report` takes it: the card is validate's)."""
    return TorchStatus(**torch_facts(torch, backup_dir))


def read_status(opts: StatusOptions = StatusOptions(), env: Mapping[str, str] | None = None) -> TorchStatus:
    """Everything `torch status` shows: this Python, the GPUs and the card, the HSA override, the
    torch (or that this Python has none: the rest is still detected), what is missing and the one
    next step. A `--torch-dir` that holds no torch is still refused (exit 2): the user named it."""
    env = os.environ if env is None else env
    try:
        torch = inspect_torch(opts.torch_dir)
    except EnvironmentMissing:   # no torch in this Python (a --torch-dir without one raises UserError)
        torch = None
    machine = detect_machine(torch, DetectOptions(opts.arch, opts.sysfs,
                                                  ask_torch=opts.torch_dir is None and torch is not None
                                                  and torch.is_rocm), env)
    fields: dict = torch_facts(torch, backup_location(torch, opts.backup_dir)) if torch is not None else {}
    fields.update(python={"executable": sys.executable, "version": platform.python_version()},
                  machine=machine, hsa_override=env.get(HSA_OVERRIDE_ENV), torch_found=torch is not None)
    missing, step = _next_step(fields, machine, opts)
    return TorchStatus(**fields, missing=missing, next=step)


def _options(opts: StatusOptions) -> str:
    """The user's own options, for a command of the next step."""
    given = [("--torch-dir", opts.torch_dir), ("--backup-dir", opts.backup_dir), ("--arch", opts.arch)]
    return "".join(f" {name} {value}" for name, value in given if value is not None)


def _next_step(s: dict, machine: Machine, opts: StatusOptions) -> tuple[list[str], str | None]:
    """What is missing for a drop-in (every gap, one phrase each) and the one thing to do next:
    the step of the first gap, in the order the owner meets them; with none, the next stage."""
    card, facts = machine.card, machine.torch
    wheel = "; ".join(wheel_lines()[-1:])
    gaps: list[tuple[str, str | None]] = []
    if not s["torch_found"]:
        gaps.append((f"torch: this Python ({sys.executable}) has none",
                     "install mi100-codegen into the environment of your ROCm PyTorch and use it from there (or "
                     f"pass --torch-dir); no ROCm PyTorch yet: {wheel}"))
    elif facts is not None and facts.problem:
        gaps.append((f"a torch a bundle can go into (torch {facts.version}: see 'no bundle fits')",
                      f"install a pytorch.org ROCm wheel: {wheel}"))
    if card is None:
        gaps.append((f"a GPU ({'; '.join(machine.notes) or 'none found'})",
                     "check the card's driver (rocminfo lists it), or name the card: mi100-codegen torch status "
                     f"--arch ARCH ({', '.join(f.arch for f in families())})"))
    elif card.problem or card.family is None:
        gaps.append((f"a card mi100-codegen builds for ({card.arch})", None))
    elif not card.override_ok:
        gaps.append((f"{HSA_OVERRIDE_ENV}={card.override} in this environment",
                     f"export {HSA_OVERRIDE_ENV}={card.override} in every shell that runs torch"))
    if gaps:
        return [g for g, _ in gaps], next((step for _, step in gaps if step), None)
    if not s.get("ours_installed") or not (s.get("ours") or {}).get("library_matches_install"):
        return [], "mi100-codegen torch install --bundle auto" + _options(opts)
    return [], "mi100-codegen report (runs validate on the card; attach the file it writes to a Card report issue)"


def machine_lines(m: Machine, hsa_override: str | None) -> list[str]:
    """The GPUs, the card and what serves it, and the HSA override, as status prints them."""
    gpus = ", ".join(f"{g.target or g.arch} ({g.devices} device{'s' if g.devices != 1 else ''})"
                     for g in m.gpus if g.devices)
    found = m.gpus[0].source if m.gpus else "; ".join(m.notes) or "none found"
    lines = [f"GPUs:             {gpus or 'none'}  ({found})"]
    card = m.card
    now = f"{HSA_OVERRIDE_ENV}={hsa_override}" if hsa_override is not None else f"{HSA_OVERRIDE_ENV} unset"
    if card is None:
        lines.append("card:             none (no GPU found; --arch names one)")
    elif card.problem or card.family is None:
        lines.append(f"card:             {card.problem}")
    else:
        fam = card.family
        lines.append(f"card:             {card.arch} -> bundle arch {fam.arch}, spec {fam.spec}: {fam.spec_file}")
        if card.override:
            state = ("set" if card.override_ok else f"set to {card.override_now}, not {card.override}"
                     if card.override_now else "NOT set")
            lines.append(f"HSA override:     {card.arch} runs {fam.arch}'s kernels with "
                         f"{HSA_OVERRIDE_ENV}={card.override}: {state} in this environment")
        else:
            now += f" ({card.arch} runs its own kernels: none needed)"
    if card is None or not card.override:
        lines.append(f"HSA override:     {now}")
    t = m.torch
    if t and t.hip_major is not None:
        lines.append(f"HIP major:        {t.hip_major}  ({t.hip_source})")
    if t and t.problem:
        lines.append(f"no bundle fits:   {t.problem}")
    return lines


def format_status(s: TorchStatus) -> str:
    def yn(b: bool) -> str:
        return "yes" if b else "no"

    lines = []
    if s.python is not None:
        lines.append(f"Python:           {s.python.version}  ({s.python.executable})")
    if s.machine is not None:
        lines += machine_lines(s.machine, s.hsa_override)
    if not s.torch_found:
        lines.append("torch:            none in this Python")
    else:
        lines += [
            f"torch:            {s.torch_version}  ({s.torch_dir})",
            f"HIP version:      {s.hip_version or '-'}" + (f"   CUDA: {s.cuda_version}" if s.cuda_version else ""),
            f"ROCm build:       {yn(s.rocm_build)}",
        ]
        if s.aotriton_needed:
            lines.append(f"links AOTriton:   {s.aotriton_needed}  (DT_NEEDED of libtorch_hip.so)")
            exp = s.expected_release_for_torch
            lines.append(f"release line:     {s.release_line}  (release {s.release_tag}"
                         + (f"; table for this torch: {exp}" if exp else "") + ")")
            if s.build_release:
                lines.append(f"build with:       AOTriton {s.build_release}  (newest supported release of line "
                             f"{s.release_line})")
            elif s.build_release_problem:
                lines.append(f"build with:       none: {s.build_release_problem}")
            f = s.aotriton_file
            if f and f.present:
                lines.append(f"library file:     {f.path}  sha256 {(f.sha256 or '')[:16]}…")
        lines.append("kernel images:    " + (", ".join(f"{a} ({n} files)" for a, n in s.images.items()) or "none"))
        if s.ours is not None:
            o = s.ours
            lines.append(f"our build:        installed for {o.arch} ({o.prefix_library}, {o.files} files; "
                         f"backup {o.backup_dir})")
            b = o.bundle
            if b:
                lines.append(f"bundle:           {b.get('file')}  (AOTriton {b.get('release')}, {b.get('arch')}, HIP "
                             f"{b.get('hip_major')}; sha256 {str(b.get('sha256'))[:16]}…; {b.get('label')})")
        else:
            lines.append("our build:        not installed")
    for p in s.problems:
        lines.append(f"problem:          {p}")
    for m in s.missing:
        lines.append(f"missing:          {m}")
    if s.next:
        lines.append(f"next:             {s.next}")
    return "\n".join(printable(line) for line in lines) + "\n"
