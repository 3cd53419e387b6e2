"""Counts of a kernel list (pure): total and by family, head dim, dtype and config."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from .kernel_list import KernelEntry

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
    hd = Counter(str(e.head_dim) if e.head_dim is not None else NO_HEAD_DIM for e in entries)
    archs = sorted({e.arch for e in entries})
    return PlanSummary(
        gpu=gpus[0],
        gpus=list(gpus),
        arch=archs[0] if len(archs) == 1 else ",".join(archs),
        release=release,
        build=build,
        total=len(entries),
        head_dims=sorted({e.head_dim for e in entries if e.head_dim is not None}),
        by_family=_sorted(Counter(e.family for e in entries)),
        by_head_dim=_sorted(hd, numeric=True),
        by_dtype=_sorted(Counter(e.dtype for e in entries)),
        by_config=_sorted(Counter(e.config for e in entries)),
    )
