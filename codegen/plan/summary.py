"""Counts of a kernel list (pure): total and by family, head dim, dtype and config."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from codegen.plan.kernel_list import KernelEntry

NO_HEAD_DIM = "none"


class PlanSummary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

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


def _sorted(counter: Counter, numeric: bool = False) -> dict[str, int]:
    def key(k: str):
        return (0, int(k), k) if numeric and k.isdigit() else (1, 0, k)

    return {k: counter[k] for k in sorted(counter, key=key)}


def summarize(entries: list[KernelEntry], gpus: list[str], release: str, build: str = "normal") -> PlanSummary:
    cfgs = [e.config for e in entries]
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
    )
