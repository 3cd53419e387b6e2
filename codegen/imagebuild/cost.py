"""What an image build costs, measured: the one table `torch install --bundle auto` estimates a
local bundle build from. Each row is a cold kernel compile (empty kernel cache) of one release for
one shipped spec, in CPU-seconds (user+sys), from the dated entry "image-build cost per release
and target" of docs/measurements.md (CPU, Triton 3.6.0 for gfx908/gfx1030, 3.8.0 for gfx906);
tests/test_owner_cost.py checks the two agree. Releases without a row plan exactly a listed
release's kernels (the same line's, 0.12b as 0.12.1b, main's snapshot as 0.13b), so the nearest
row of the same line serves them."""

from __future__ import annotations

from dataclasses import dataclass

from codegen.upstream.releases import by_release


@dataclass(frozen=True)
class Cost:
    release: str
    spec: str                  # the shipped spec's name
    kernels: int
    cpu_s: int                 # kernel compiles from an empty cache, CPU-seconds


BUILD_COST: tuple[Cost, ...] = (
    Cost("0.10b", "mi100", 2731, 4622), Cost("0.11b", "mi100", 2381, 2695),
    Cost("0.12.1b", "mi100", 3043, 4478), Cost("0.13b", "mi100", 3043, 4269),
    Cost("0.10b", "rdna2", 1537, 1871), Cost("0.11b", "rdna2", 1327, 1925), Cost("0.11.1b", "rdna2", 1503, 2012),
    Cost("0.12.1b", "rdna2", 1559, 1696), Cost("0.13b", "rdna2", 1559, 2122),
    Cost("0.10b", "mi50", 411, 252), Cost("0.11b", "mi50", 335, 208),
    Cost("0.12.1b", "mi50", 409, 253), Cost("0.13b", "mi50", 409, 258),
)
# the rest of a bundle build once every kernel is cached (HIP sysroot, configure, the C++ runtime,
# packing, the checks) of 0.11b gfx908 HIP 6 on 2 cores (docs/measurements.md, "default-spec
# bundles"), taken as CPU-seconds that spread over the cores like the kernels
REST_CPU_S = 450
# main's snapshot plans 0.13b's kernels (the reuse matrix: 100 %)
_SAME_AS = {"0.14.0-dev": "0.13b"}


def _line(release: str) -> tuple[int, int]:
    return by_release(_SAME_AS.get(release, release)).version[:2]


def build_cost(release: str, spec: str) -> Cost | None:
    """The row for `release` and the shipped spec `spec`: its own, else the newest row of the same
    release line not newer than it, else the line's oldest row; None: no row for that spec or line."""
    release = _SAME_AS.get(release, release)
    rows = [c for c in BUILD_COST if c.spec == spec and _line(c.release) == _line(release)]
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


__all__ = ["BUILD_COST", "Cost", "REST_CPU_S", "build_cost", "estimate_s"]
