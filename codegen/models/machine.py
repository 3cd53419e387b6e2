"""What `torch status` and `torch install --bundle auto` find on an owner's machine
(`codegen.ship.detect` fills them): the GPUs, the card family whose spec serves the chosen one,
and the installed torch. Pure data; `to_json` is what `torch status --json` prints under `machine`."""

from __future__ import annotations

from typing import Literal

from codegen.models.records import Record


class Gpu(Record):
    """One GPU arch found on the machine, with how many devices have it."""

    arch: str                       # the processor name: 'gfx908', 'gfx1031' (possibly one LLVM does not know)
    devices: int
    source: str                     # how we know: 'KFD topology (/sys/…)', 'torch (gcnArchName)', '--arch'
    target: str | None = None       # the full target string where torch reported it: 'gfx908:sramecc+:xnack-'


class Family(Record):
    """A card family mi100-codegen builds for: a shipped spec and the processor it targets."""

    spec: str                       # the spec's name: 'mi100'
    arch: str                       # the spec's arch, the bundle's: 'gfx908'
    description: str
    spec_file: str                  # how messages name the spec file: 'rules/mi100.yaml'
    path: str                       # the shipped spec file


class CardMatch(Record):
    """The chosen GPU and what serves it."""

    arch: str                       # the card's own arch
    family: Family | None = None    # None: no family serves it
    # for a card that runs its family's code only under the HSA override (gfx1031 for gfx1030):
    # the value it needs ('10.3.0') and what the environment holds now (None: unset)
    override: str | None = None
    override_now: str | None = None
    problem: str | None = None      # why there is no match (an unsupported card, several archs, none found)

    @property
    def override_ok(self) -> bool:
        return self.override is None or self.override_now == self.override


class TorchFacts(Record):
    """The installed torch, read from its folder (never imported)."""

    torch_dir: str
    version: str
    rocm: bool                      # a ROCm build: lib/libtorch_hip.so and torch.version.hip
    hip_version: str | None = None
    hip_major: int | None = None    # from the HIP runtime the wheel ships (its SONAME), else torch.version.hip
    hip_source: str | None = None
    aotriton: Literal["shared", "static", "none"] | None = None   # None: not a ROCm build
    aotriton_file: str | None = None       # the file libtorch_hip.so needs: 'libaotriton_v2.so.0.11.0'
    release_tag: str | None = None         # the release that file is: '0.11b'
    release_line: str | None = None        # '0.11'
    build_release: str | None = None       # what mi100-codegen builds for that line ('0.11.2b'); None: none
    problem: str | None = None             # why no bundle can go into this torch


class Machine(Record):
    """Everything detection found: every GPU arch, the chosen card and its match, the torch."""

    gpus: list[Gpu]
    card: CardMatch | None = None   # None: no GPU found and no --arch
    torch: TorchFacts | None = None
    notes: list[str] = []
