"""`torch status`: what an installed PyTorch links, and whether our build is in it.

Everything it prints comes from a torch folder and a backup that may be someone else's: the text
form escapes control characters line by line (`codegen.core.ui.printable`: a version string's ESC
prints as `\x1b`, a newline cannot start a forged `problem:` line); JSON escapes them itself."""

from __future__ import annotations

import os
from pathlib import Path

from codegen.core.errors import UserError
from codegen.core.ui import printable
from codegen.formats.elf import ElfError, read_dynamic
from codegen.models.archs import HSA_OVERRIDE_ENV
from codegen.models.machine import Machine
from codegen.ship.install import MANIFEST, default_backup_dir, read_manifest, unfinished
from codegen.ship.layout import (TORCH_TO_AOTRITON, TorchInstall, build_release_for_line, image_archs, sha256_file,
                     unsupported_line_message)


def torch_status(torch: TorchInstall, backup_dir: Path | None = None, machine: Machine | None = None) -> dict:
    """What `torch status` prints; `machine`: what detection found (codegen.ship.detect), shown
    first as `machine` (the GPUs, the card and the family that serves it, the torch's facts)."""
    backup_dir = backup_dir or default_backup_dir(torch)
    out: dict = {
        "torch_dir": str(torch.root),
        "torch_version": torch.version,
        "hip_version": torch.hip,
        "cuda_version": torch.cuda,
        "rocm_build": torch.is_rocm,
        "hip_library": str(torch.hip_lib) if torch.hip_lib else None,
        "aotriton_needed": None,
        "release_line": None,
        "build_release": None,
        "expected_release_for_torch": TORCH_TO_AOTRITON.get(torch.feature_release),
        "aotriton_file": None,
        "images": image_archs(torch.lib_dir),
        "ours_installed": False,
        "problems": [],
    }
    if machine is not None:
        out["machine"] = machine.model_dump(mode="json")
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
            current = out["aotriton_file"] or {}
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


def machine_lines(m: dict) -> list[str]:
    """The card and what serves it, as status prints them (from `Machine.model_dump`)."""
    gpus = ", ".join(f"{g['target'] or g['arch']} ({g['devices']} device{'s' if g['devices'] != 1 else ''})"
                     for g in m["gpus"] if g["devices"])
    found = m["gpus"][0]["source"] if m["gpus"] else "; ".join(m["notes"]) or "none found"
    lines = [f"GPUs:             {gpus or 'none'}  ({found})"]
    card = m.get("card")
    if card is None:
        lines.append("card:             none (no GPU found; --arch names one)")
    elif card["problem"]:
        lines.append(f"card:             {card['problem']}")
    else:
        fam = card["family"]
        lines.append(f"card:             {card['arch']} -> spec {fam['spec']} ({fam['spec_file']}), bundle arch {fam['arch']}")
        if card["override"]:
            now = card["override_now"]
            state = ("set" if now == card["override"] else f"set to {now}, not {card['override']}" if now else "NOT set")
            lines.append(f"HSA override:     {card['arch']} runs {fam['arch']}'s kernels with "
                         f"{HSA_OVERRIDE_ENV}={card['override']}: {state} in this environment")
    t = m.get("torch")
    if t and t["hip_major"] is not None:
        lines.append(f"HIP major:        {t['hip_major']}  ({t['hip_source']})")
    if t and t["problem"]:
        lines.append(f"no bundle fits:   {t['problem']}")
    return lines


def format_status(s: dict) -> str:
    def yn(b: bool) -> str:
        return "yes" if b else "no"

    lines = [*machine_lines(s["machine"])] if s.get("machine") else []
    lines += [
        f"torch:            {s['torch_version']}  ({s['torch_dir']})",
        f"HIP version:      {s['hip_version'] or '-'}" + (f"   CUDA: {s['cuda_version']}" if s["cuda_version"] else ""),
        f"ROCm build:       {yn(s['rocm_build'])}",
    ]
    if s["aotriton_needed"]:
        lines.append(f"links AOTriton:   {s['aotriton_needed']}  (DT_NEEDED of libtorch_hip.so)")
        exp = s["expected_release_for_torch"]
        lines.append(f"release line:     {s['release_line']}  (release {s['release_tag']}"
                     + (f"; table for this torch: {exp}" if exp else "") + ")")
        if s.get("build_release"):
            lines.append(f"build with:       AOTriton {s['build_release']}  (newest supported release of line "
                         f"{s['release_line']})")
        elif s.get("build_release_problem"):
            lines.append(f"build with:       none: {s['build_release_problem']}")
        f = s["aotriton_file"]
        if f and f["present"]:
            lines.append(f"library file:     {f['path']}  sha256 {f['sha256'][:16]}…")
    imgs = s["images"]
    lines.append("kernel images:    " + (", ".join(f"{a} ({n} files)" for a, n in imgs.items()) or "none"))
    if s["ours_installed"]:
        o = s["ours"]
        lines.append(f"our build:        installed for {o['arch']} ({o['prefix_library']}, {o['files']} files; "
                     f"backup {o['backup_dir']})")
        b = o.get("bundle")
        if b:
            lines.append(f"bundle:           {b.get('file')}  (AOTriton {b.get('release')}, {b.get('arch')}, HIP "
                         f"{b.get('hip_major')}; sha256 {str(b.get('sha256'))[:16]}…; {b.get('label')})")
    else:
        lines.append("our build:        not installed")
    for p in s["problems"]:
        lines.append(f"problem:          {p}")
    return "\n".join(printable(line) for line in lines) + "\n"
