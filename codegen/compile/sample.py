"""Deterministic stratified sample of a kernel list (pure).

Strata are (family, head dim, dtype). The sample first takes one kernel from enough strata to
cover every family, head dim and dtype present, then fills all strata level by level (each stratum's k-th kernel before any (k+1)-th); inside a
stratum the configs take turns, each config's kernels in sha256 order of their image names. The
same list, size and seed always give the same sample; another seed orders each stratum's configs
and kernels by other hashes (seed 0: the order precompile has always used)."""

from __future__ import annotations

import hashlib
from collections import defaultdict, deque

from codegen.plan.kernel_list import KernelEntry, sort_key


def _h(text: str, seed: int = 0) -> str:
    return hashlib.sha256((f"{seed}:{text}" if seed else text).encode()).hexdigest()


def _stratum_queue(entries: list[KernelEntry], seed: int) -> deque:
    by_config: dict[str, list[KernelEntry]] = defaultdict(list)
    for e in entries:
        by_config[e.config.name].append(e)
    queues = [deque(sorted(v, key=lambda e: _h(e.id, seed)))
              for _, v in sorted(by_config.items(), key=lambda kv: _h(kv[0], seed))]
    out: deque = deque()
    while any(queues):
        for q in queues:
            if q:
                out.append(q.popleft())
    return out


def stratified_sample(entries: list[KernelEntry], n: int, seed: int = 0) -> list[KernelEntry]:
    if n <= 0 or n >= len(entries):
        return sorted(entries, key=sort_key)
    strata: dict[tuple, list[KernelEntry]] = defaultdict(list)
    for e in entries:
        strata[(e.config.family, e.config.head_dim or 0, e.config.dtype)].append(e)
    keys = sorted(strata)
    queues = {k: _stratum_queue(strata[k], seed) for k in keys}
    picked: list[KernelEntry] = []

    # coverage pass: every family, head dim and dtype at least once
    uncovered = {("family", k[0]) for k in keys} | {("hd", k[1]) for k in keys} | {("dtype", k[2]) for k in keys}
    while uncovered and len(picked) < n:
        def gain(k):
            return len({("family", k[0]), ("hd", k[1]), ("dtype", k[2])} & uncovered)
        best = None
        for k in keys:  # first stratum (in sorted order) with the largest gain
            if queues[k] and (best is None or gain(k) > gain(best)):
                best = k
        if best is None or gain(best) == 0:
            break
        picked.append(queues[best].popleft())
        uncovered -= {("family", best[0]), ("hd", best[1]), ("dtype", best[2])}

    # then level by level: every stratum gets its k-th kernel before any gets its (k+1)-th
    taken = defaultdict(int)
    for e in picked:
        taken[(e.config.family, e.config.head_dim or 0, e.config.dtype)] += 1
    level = 1
    while len(picked) < n and any(queues.values()):
        for k in keys:
            if len(picked) >= n:
                break
            if taken[k] < level and queues[k]:
                picked.append(queues[k].popleft())
                taken[k] += 1
        level += 1
    return sorted(picked, key=sort_key)
