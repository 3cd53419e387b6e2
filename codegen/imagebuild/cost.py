"""What an image build costs, measured: `torch install --bundle auto` estimates a local bundle build
from the cold kernel-compile rows the release records carry (`Release.build_costs`, one per
shipped spec measured). A release without a row takes the nearest row of its line (0.12b as
0.12.1b); one whose plans are another's kernels (`Release.same_kernels_as`: main's snapshot and
0.13b) takes that release's."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.upstream.releases import RELEASES, by_release


@dataclass(frozen=True)
class Cost:
    release: str
    spec: str                  # the shipped spec's name
    kernels: int
    cpu_s: int                 # kernel compiles from an empty cache, CPU-seconds


BUILD_COST: tuple[Cost, ...] = tuple(Cost(r.release, c.spec, c.kernels, c.cpu_s) for r in RELEASES for c in r.build_costs)
# the rest of a bundle build once every kernel is cached (HIP sysroot, configure, the C++ runtime,
# packing, the checks): docs/measurements.md, "default-spec bundles", taken as CPU-seconds that
# spread over the cores like the kernels
REST_CPU_S = 450


def _planned(release: str) -> str:
    return by_release(release).same_kernels_as or release


def build_cost(release: str, spec: str) -> Cost | None:
    """The row for `release` and the shipped spec `spec`: its own, else the newest row of the same
    release line not newer than it, else the line's oldest row; None: no row for that spec or line."""
    release = _planned(release)
    line = by_release(release).version[:2]
    rows = [c for c in BUILD_COST if c.spec == spec and by_release(_planned(c.release)).version[:2] == line]
    if not rows:
        return None
    version = by_release(release).version
    older = [c for c in rows if by_release(c.release).version <= version]
    key = lambda c: by_release(c.release).version  # noqa: E731
    return max(older, key=key) if older else min(rows, key=key)


def estimate_s(cost: Cost, cores: int) -> float:
    """Wall seconds of a whole bundle build from an empty kernel cache on `cores` cores (a warm
    cache leaves about REST_CPU_S / cores)."""
    return (cost.cpu_s + REST_CPU_S) / max(cores, 1)
