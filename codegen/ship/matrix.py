"""The release matrix: which bundles a release publishes, the one owner of that table. The
release workflow (.github/workflows/bundles.yml) reads it from `mi100-codegen bundle matrix
--json` and `scripts/release_bundles.py` from `release_matrix`, so neither holds a copy.

One row per (AOTriton release, spec, HIP major), each fact from its owner:

- the releases: those a PyTorch line's official wheels link (`TORCH_LINES`, codegen.upstream)
  that mi100-codegen builds for torch (`TORCH_RELEASES`: a release, not a snapshot of main), and
  that the spec names (`upstream.releases`); not a release whose image build compiles the Triton
  of its own submodule (`builds_own_triton`: 0.10b, for torch 2.8), which no bundle has been built
  from yet;
- the spec of each card: every spec at the top of `rules/` (`codegen.core.resources.card_specs`:
  `mi100.yaml` for gfx908, `mi50.yaml` for gfx906, `rdna2.yaml` for gfx1030), its arch read from
  the spec itself; or the specs given (the smoke specs in a test);
- the HIP majors: those of the ROCm versions the linking torch lines' wheels are built for
  (`TorchLine.rocm`), that mi100-codegen builds against (`HIP_MAJORS`).

Two specs of one arch would make two bundles of one name: refused (exit 2).

`kernel_groups`: the rows grouped by (release, arch): their kernels are the same whatever the HIP
major, so the workflow compiles them once per group and carries the kernel cache to the group's
bundle jobs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codegen.core.errors import UserError
from codegen.core.resources import card_specs, display_path
from codegen.formats.bundle_zip import bundle_name
from codegen.formats.spec import load_spec, spec_sha256
from codegen.models.hip import HIP_MAJORS
from codegen.ship.layout import TORCH_RELEASES
from codegen.upstream.releases import TORCH_LINES, by_release, parse_tag


@dataclass(frozen=True)
class MatrixRow:
    """One bundle to build: AOTriton `release` with `spec` (for `arch`) against HIP `hip`, for the
    torch lines `torch`."""

    release: str
    arch: str
    hip: int
    spec: Path
    spec_name: str
    spec_sha256: str
    torch: tuple[str, ...]

    @property
    def bundle(self) -> str:
        return bundle_name(self.release, self.arch, self.hip)

    @property
    def id(self) -> str:
        """`0.11b-gfx908-hip6`: a name for a job, an artifact, a cache key."""
        return f"{self.release}-{self.arch}-hip{self.hip}"

    def as_json(self) -> dict:
        return {"id": self.id, "release": self.release, "arch": self.arch, "hip": self.hip,
                "spec": display_path(self.spec), "spec_name": self.spec_name, "spec_sha256": self.spec_sha256,
                "torch": ", ".join(self.torch), "bundle": self.bundle}


def release_matrix(specs: list[Path] | None = None) -> list[MatrixRow]:
    """Every bundle a release publishes (module doc), sorted by release, arch and HIP major."""
    rows: list[MatrixRow] = []
    arch_of: dict[str, Path] = {}
    for path in specs or card_specs():
        loaded = load_spec(path)
        spec = loaded.spec
        if spec.arch in arch_of:
            raise UserError(f"{display_path(path)} and {display_path(arch_of[spec.arch])} are both specs for "
                            f"{spec.arch}: a release has one bundle per (release, arch, HIP major)",
                            hint="give one spec per arch")
        arch_of[spec.arch] = path
        for release in sorted({t.aotriton for t in TORCH_LINES}, key=lambda r: parse_tag(r) or (0, 0, 0)):
            if (release not in TORCH_RELEASES or release not in spec.upstream.releases
                    or by_release(release).builds_own_triton):
                continue
            lines = [t for t in TORCH_LINES if t.aotriton == release]
            for hip in sorted({m for t in lines for m in t.hip_majors} & set(HIP_MAJORS)):
                rows.append(MatrixRow(release, spec.arch, hip, Path(path), spec.name, spec_sha256(spec),
                                      tuple(t.torch for t in lines if hip in t.hip_majors)))
    return sorted(rows, key=lambda r: (parse_tag(r.release), r.arch, r.hip))


def kernel_groups(rows: list[MatrixRow]) -> list[dict]:
    """One entry per (release, arch) of `rows`: `id` (`0.11b-gfx908`, also the kernel cache
    artifact's name), the release, arch and spec, and `row`, the id of the group's first row (what
    `scripts/release_bundles.py --only` takes)."""
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        out.setdefault((r.release, r.arch), {"id": f"{r.release}-{r.arch}", "release": r.release, "arch": r.arch,
                                             "spec": display_path(r.spec), "row": r.id})
    return list(out.values())


def matrix_json(rows: list[MatrixRow]) -> dict:
    """What `bundle matrix --json` prints: `bundles` (one per row) and `kernels` (one per group)."""
    return {"bundles": [r.as_json() for r in rows], "kernels": kernel_groups(rows)}
