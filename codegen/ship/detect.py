"""What is in the owner's machine: the GPUs, the card family that serves the chosen one, and the
installed torch (`torch status` shows it, `torch install --bundle auto` acts on it).

- **GPUs**: the KFD topology the amdgpu driver publishes (`<sysfs>/class/kfd/kfd/topology/nodes/
  */properties`, the `gfx_target_version` line; CPU nodes say 0), no ROCm SDK needed, each file a
  bounded read; where the machine has no KFD GPU node, the torch this Python imports, asked in a
  child process (a torch with a wrong AOTriton fails at `import torch`; this process never imports
  it), gives each device's full target string (`gcnArchName`). `--arch` overrides both.
- **Card families**: the specs shipped in `rules/` (`codegen.core.resources.card_specs`) are the
  table: each serves the processor its `arch` names, so a new GPU is a new spec and nothing here.
  A processor that runs another's code objects under `HSA_OVERRIDE_GFX_VERSION`
  (`codegen.models.archs.RUNS_AS`: gfx1031–gfx1036 run gfx1030's) is served by that one's family,
  with the override said and checked in the environment.
- **torch**: its folder read as `codegen.ship.layout` reads it, the HIP major of the runtime its
  wheel ships (`codegen.ship.hip`), and whether libtorch_hip.so links AOTriton as a shared library
  (the only kind a bundle can replace), statically, or not at all (flash attention built off, as
  in AMD's per-family TheRock wheels for gfx90X/gfx103X).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

from codegen.core import processes
from codegen.core.errors import EnvironmentMissing, UserError, os_reason
from codegen.core.fsutil import read_input
from codegen.core.resources import card_specs, display_path
from codegen.core.ui import printable
from codegen.formats.spec import load_spec
from codegen.models.archs import HSA_OVERRIDE_ENV, RUNS_AS, arch_of_target_version, arch_option, hsa_version
from codegen.models.hip import HIP_MAJORS
from codegen.models.machine import CardMatch, Family, Gpu, Machine, TorchFacts
from codegen.models.target import DEVICE_TARGET_PATTERN
from codegen.ship.hip import torch_hip
from codegen.ship.layout import (TORCH_LINES, TORCH_RELEASES, TORCH_TO_AOTRITON, TorchInstall, aotriton_namespaces,
                                 build_release_for_line, unsupported_line_message)
from codegen.upstream.releases import SUPPORTED, tag_line

SYSFS = Path("/sys")
KFD_NODES = Path("class", "kfd", "kfd", "topology", "nodes")
PROPERTIES_LIMIT = 64 << 10    # bytes of one node's properties (a real one is under 2 kB)
NODES_LIMIT = 1024             # nodes read (a machine has one per CPU socket and GPU)
# pytorch.org's index of the ROCm wheels for one ROCm version ('6.4'): `pip install torch --index-url …`
PYTORCH_ROCM_INDEX = "https://download.pytorch.org/whl/rocm{rocm}"
PROBE_TIMEOUT_S = 120.0        # `import torch` and one query per device
# the child that asks torch: one JSON list of gcnArchName strings on its last line ([] when not ROCm)
_PROBE = ("import json, torch\n"
          "n = torch.cuda.device_count() if torch.version.hip else 0\n"
          "print(json.dumps([torch.cuda.get_device_properties(i).gcnArchName for i in range(n)]))\n")
_TARGET_RE = re.compile(DEVICE_TARGET_PATTERN.replace("$", r"\Z"))
_NUMBER = re.compile(r"[0-9]{1,9}")   # a node's name, a gfx_target_version (str.isdigit takes '²', which int refuses)


# --- GPUs ----------------------------------------------------------------------------------------
class KfdUnreadable(EnvironmentMissing):
    """The KFD topology is there but cannot be read (exit 3): the card must be named (--arch)."""


def kfd_gpus(sysfs: Path = SYSFS) -> list[Gpu] | None:
    """The GPU archs of the KFD topology below `sysfs`, each with its device count; None when the
    machine has no KFD topology (no amdgpu driver, or a container without /sys/class/kfd);
    KfdUnreadable when its nodes cannot be listed (an unprivileged user, a restricted container)."""
    nodes = Path(sysfs) / KFD_NODES
    try:
        if not nodes.is_dir():
            return None
        listed = os.listdir(nodes)
    except OSError as exc:
        raise KfdUnreadable(f"cannot read the KFD topology at {nodes} ({os_reason(exc)}): the GPUs of this machine "
                            "are found there", hint="name the card instead: --arch ARCH ("
                            + ", ".join(f"{f.arch} for {f.spec}" for f in families()) + ")") from None
    counts: Counter[str] = Counter()
    names = sorted((n for n in listed if _NUMBER.fullmatch(n)), key=int)[:NODES_LIMIT]
    for name in names:
        try:
            raw = read_input(nodes / name / "properties", what="KFD node properties", limit=PROPERTIES_LIMIT)
        except UserError:
            continue   # a node without readable properties is no GPU we can name
        for line in raw.decode("ascii", errors="replace").splitlines():
            key, _, value = line.partition(" ")
            if key == "gfx_target_version" and _NUMBER.fullmatch(value.strip()):
                arch = arch_of_target_version(int(value.strip()))
                if arch is not None:
                    counts[arch] += 1
                break
    where = f"KFD topology ({nodes})"
    return [Gpu(arch=a, devices=n, source=where) for a, n in sorted(counts.items())]


def torch_gpus(timeout: float = PROBE_TIMEOUT_S) -> tuple[list[Gpu], str | None]:
    """The devices the torch this Python imports sees, asked in a child process: the GPUs, and a
    note when it could not tell (torch missing or failing at import, no ROCm build)."""
    try:
        proc = processes.run([sys.executable, "-c", _PROBE], timeout=timeout, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return [], f"torch did not answer within {timeout:g} s"
    except OSError as exc:
        return [], f"cannot ask torch ({exc.strerror or exc})"
    if proc.returncode:
        tail = (proc.stderr or "").strip().splitlines()
        return [], f"import torch failed: {printable(tail[-1][:200]) if tail else f'exit {proc.returncode}'}"
    return parse_probe((proc.stdout or "").strip().splitlines()[-1:])


def parse_probe(lines: list[str]) -> tuple[list[Gpu], str | None]:
    """The probe's last line (a JSON list of target strings) as GPUs; anything else is a note."""
    try:
        targets = json.loads(lines[0]) if lines else None
    except ValueError:
        targets = None
    if not isinstance(targets, list) or not all(isinstance(t, str) and _TARGET_RE.match(t) for t in targets):
        return [], "torch's answer was not a list of GPU target strings"
    counts = Counter(targets)
    return [Gpu(arch=t.split(":")[0], devices=n, source="torch (gcnArchName)", target=t)
            for t, n in sorted(counts.items())], None


def find_gpus(sysfs: Path = SYSFS, probe: Callable[[], tuple[list[Gpu], str | None]] | None = None
              ) -> tuple[list[Gpu], list[str]]:
    """The machine's GPUs (KFD first; torch when KFD shows none, `probe` None: no torch asked) and
    notes on how they were found."""
    found = kfd_gpus(sysfs)
    if found:
        return found, []
    notes = [f"no KFD topology at {Path(sysfs) / KFD_NODES} (no amdgpu driver?)" if found is None
             else f"the KFD topology at {Path(sysfs) / KFD_NODES} lists no GPU"]
    if probe is None:
        return [], notes
    gpus, why = probe()
    if why:
        notes.append(why)
    return gpus, notes


# --- card families -------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def families() -> tuple[Family, ...]:
    """The card families: one per spec shipped in rules/ (its arch, name, description)."""
    out = []
    for path in card_specs():
        s = load_spec(path).spec
        out.append(Family(spec=s.name, arch=s.arch, description=s.description, spec_file=display_path(path),
                          path=str(path)))
    return tuple(sorted(out, key=lambda f: f.arch))


def family_of(arch: str) -> Family | None:
    """The family whose bundle serves `arch` (its own, or the one it runs as: RUNS_AS)."""
    want = RUNS_AS.get(arch, arch)
    return next((f for f in families() if f.arch == want), None)


def supported_cards() -> str:
    """One sentence: the card families and the processors each serves."""
    parts = []
    for f in families():
        also = sorted(a for a, b in RUNS_AS.items() if b == f.arch)
        extra = f"; {also[0]}–{also[-1]} with {HSA_OVERRIDE_ENV}={hsa_version(f.arch)}" if also else ""
        parts.append(f"{f.arch} ({f.spec}: {f.description}{extra})")
    return "card families mi100-codegen builds for: " + ", ".join(parts)


def _unsupported(arch: str) -> str:
    ships = [r.release for r in SUPPORTED if arch in r.shipped_archs and not r.snapshot]
    why = (f"AMD's AOTriton ships kernels for it ({ships[0]} and later): the torch wheel's own flash attention "
           "serves it" if ships else "no spec of mi100-codegen targets it")
    return f"{arch}: not a card mi100-codegen builds for ({why}); {supported_cards()}"


def match_card(gpus: list[Gpu], arch: str | None = None, env: Mapping[str, str] | None = None) -> CardMatch | None:
    """The card to serve: `arch` (--arch) when given, else the one serving family of the GPUs found
    (None: none found). Several GPUs that different bundles would serve are a problem to resolve
    with --arch: a bundle's library carries one arch's dispatch tables, so installing it takes
    flash attention away from the others."""
    env = os.environ if env is None else env
    if arch is not None:
        arch_option(arch)
    else:
        if not gpus:
            return None
        groups = sorted({RUNS_AS.get(g.arch, g.arch) for g in gpus})
        if len(groups) > 1:
            listed = ", ".join(f"{g.arch} ({g.devices} device{'s' if g.devices > 1 else ''})" for g in gpus)
            return CardMatch(arch=gpus[0].arch, problem=(
                f"GPUs of several archs: {listed}; a bundle serves one arch (its library dispatches for that "
                "one only, so the others would lose flash attention): pick one with --arch"))
        # the member that needs the override, if any, decides it
        arch = next((g.arch for g in gpus if g.arch in RUNS_AS), gpus[0].arch)
    family = family_of(arch)
    if family is None:
        return CardMatch(arch=arch, problem=_unsupported(arch))
    override = hsa_version(family.arch) if arch in RUNS_AS else None
    return CardMatch(arch=arch, family=family, override=override,
                     override_now=env.get(HSA_OVERRIDE_ENV) if override else None)


# --- torch ---------------------------------------------------------------------------------------
def wheel_lines() -> list[str]:
    """The pytorch.org ROCm wheel lines a bundle can serve, with their install command: the lines
    whose AOTriton release mi100-codegen builds, where the wheels' ROCm versions are known."""
    out = []
    for t in TORCH_LINES:
        known = [v for v in t.rocm if re.fullmatch(r"[0-9]+\.[0-9]+", v)]   # '7.x': a major, no index
        if known and build_release_for_line(tag_line(t.aotriton) or "") is not None:
            index = PYTORCH_ROCM_INDEX.format(rocm=known[-1])
            out.append(f"torch {t.torch} (ROCm {', '.join(known)}): pip install 'torch=={t.torch}.*' "
                       f"--index-url {index}")
    return out


def recipe_command(torch: TorchInstall, arch: str) -> str:
    """The `torch rebuild-recipe` call for this torch's line (the release its official wheels link,
    else the newest of that line we build) and the card's arch."""
    tag = TORCH_TO_AOTRITON.get(torch.feature_release)
    release = tag if tag in TORCH_RELEASES else build_release_for_line(tag_line(tag) or "") if tag else None
    return f"mi100-codegen torch rebuild-recipe --release {release or 'TAG'} --arch {arch}"


def torch_facts(torch: TorchInstall, arch: str | None = None) -> TorchFacts:
    """What a bundle needs to know of `torch` (module doc); `problem` says why none can go into it.
    `arch`: the card's bundle arch, named in the advice for a torch without AOTriton."""
    facts: dict = {"torch_dir": str(torch.root), "version": torch.version, "rocm": torch.is_rocm,
                   "hip_version": torch.hip}
    if not torch.is_rocm:
        kind = f"a CUDA build (CUDA {torch.cuda})" if torch.cuda else "not a ROCm build"
        return TorchFacts(**facts, problem=f"torch {torch.version} is {kind}: AOTriton serves only ROCm builds; "
                          "install a ROCm wheel: " + "; ".join(wheel_lines()[-1:]))
    hip = torch_hip(torch.lib_dir, torch.hip_dyn, torch.hip)
    if hip is not None:
        facts.update(hip_major=hip.major, hip_source=f"{hip.name}, {hip.source}")
    need = torch.aot_needed
    if need is None:
        static = torch.hip_dyn is not None and "aotriton" in aotriton_namespaces(torch.hip_dyn.defined)
        if static:
            why = (f"torch {torch.version} links AOTriton statically (libtorch_hip.so defines its symbols): no "
                   "file can replace it")
        else:
            why = (f"torch {torch.version} does not link AOTriton at all: it was built with flash and memory-"
                   "efficient attention off (AMD's per-family TheRock wheels are, for gfx90X and gfx103X), so no "
                   "drop-in can help it")
        lines = "; ".join(wheel_lines())
        return TorchFacts(**facts, aotriton="static" if static else "none", problem=(
            f"{why}. pytorch.org's ROCm wheels link AOTriton and carry gfx906, gfx908 and gfx1030 code: {lines}. "
            f"Or rebuild torch with flash attention: {recipe_command(torch, arch or 'gfx908')}"))
    facts.update(aotriton="shared", aotriton_file=need.name, release_tag=need.tag, release_line=need.line,
                 build_release=build_release_for_line(need.line))
    if facts["build_release"] is None:
        return TorchFacts(**facts, problem=unsupported_line_message(need.tag))
    if hip is None or hip.major not in HIP_MAJORS:
        have = f"HIP {hip.major}" if hip is not None and hip.major is not None else "no HIP major we can read"
        return TorchFacts(**facts, problem=f"torch {torch.version} has {have}: bundles are built for HIP "
                          f"{', '.join(map(str, HIP_MAJORS))} (the ROCm 6 and 7 wheels)")
    return TorchFacts(**facts)


# --- the machine -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class DetectOptions:
    arch: str | None = None                 # --arch
    sysfs: Path = SYSFS                     # the sysfs root (tests pass a fake one)
    ask_torch: bool = True                  # ask the torch this Python imports when KFD shows no GPU


def detect_machine(torch: TorchInstall | None, opts: DetectOptions = DetectOptions(),
                   env: Mapping[str, str] | None = None,
                   probe: Callable[[], tuple[list[Gpu], str | None]] | None = None) -> Machine:
    """The GPUs, the chosen card and its family, and the torch (module doc). `probe`: how torch is
    asked (default: `torch_gpus`, when `opts.ask_torch`)."""
    try:
        gpus, notes = find_gpus(opts.sysfs, (probe or torch_gpus) if opts.ask_torch else None)
    except KfdUnreadable as exc:
        if opts.arch is None:
            raise
        gpus, notes = [], [f"{exc} (--arch {opts.arch} names the card)"]
    card = match_card(gpus, opts.arch, env)
    fam_arch = card.family.arch if card is not None and card.family is not None else None
    facts = torch_facts(torch, fam_arch) if torch is not None else None
    return Machine(gpus=gpus, card=card, torch=facts, notes=notes)


def has_gpu(machine: Machine) -> bool:
    """A GPU of the chosen card's arch is in this machine (validate can run)."""
    return machine.card is not None and any(g.arch == machine.card.arch and g.devices > 0 for g in machine.gpus)
