"""Counts of a kernel list (pure): total and by family, head dim, dtype and config, and which
configs lie outside the spec's tuning space (in a normal build: rows seeded from the donor GPU,
whose configs the spec's ranges never chose, e.g. waves_per_eu 4 or 2 warps)."""

from __future__ import annotations

from collections import Counter

from codegen.models.records import Record
from codegen.models.space import outside_space
from codegen.models.target import TargetSpec
from codegen.plan.kernel_list import KernelEntry

NO_HEAD_DIM = "none"


class PlanSummary(Record):
    gpu: str
    gpus: list[str]
    arch: str
    release: str
    build: str               # "normal" or "tuning"
    total: int
    head_dims: list[int]
    by_family: dict[str, int]
    by_head_dim: dict[str, int]
    by_dtype: dict[str, int]
    by_config: dict[str, int]
    # configs of by_config outside the spec's tuning space -> the parts of the name outside it
    outside_space: dict[str, list[str]] = {}
    seeded_from: str | None = None        # the donor GPU (rows.donor_gpu) the target's rows start from
    measured_outside: list[str] = []      # of outside_space, the configs of measured winners (not seeded)


def _sorted(counter: Counter, numeric: bool = False) -> dict[str, int]:
    def key(k: str):
        return (0, int(k), k) if numeric and k.isdigit() else (1, 0, k)

    return {k: counter[k] for k in sorted(counter, key=key)}


def summarize(entries: list[KernelEntry], gpus: list[str], release: str, build: str = "normal",
              spec: TargetSpec | None = None, measured: frozenset[str] = frozenset()) -> PlanSummary:
    """`spec`: the tunable configs outside its tuning space are listed; `measured`: the config names
    of its measured winners (the target's rows that were not seeded)."""
    cfgs = [e.config for e in entries]
    outside = {name: parts for name, c in {c.name: c for c in cfgs}.items() if spec is not None and c.tunable
               and (parts := outside_space(spec, c))}
    hd = Counter(str(c.head_dim) if c.head_dim is not None else NO_HEAD_DIM for c in cfgs)
    archs = sorted({c.arch for c in cfgs})
    return PlanSummary(
        gpu=gpus[0],
        gpus=list(gpus),
        arch=archs[0] if len(archs) == 1 else ",".join(archs),
        release=release,
        build=build,
        total=len(entries),
        head_dims=sorted({c.head_dim for c in cfgs if c.head_dim is not None}),
        by_family=_sorted(Counter(c.family for c in cfgs)),
        by_head_dim=_sorted(hd, numeric=True),
        by_dtype=_sorted(Counter(c.dtype for c in cfgs)),
        by_config=_sorted(Counter(c.name for c in cfgs)),
        outside_space=dict(sorted(outside.items())),
        seeded_from=spec.rows.donor_gpu if spec is not None else None,
        measured_outside=sorted(n for n in outside if n in measured),
    )
