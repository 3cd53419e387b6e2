"""What plan needs to know about an AOTriton tree: its release, whether the target GPUs are
registered (the overlay applied: `codegen.upstream.registration`), and the generator's
environment. Composing the tuning database is `codegen.plan.database`. Everything here
reads the tree; nothing writes to it.

Which release a tree is, and where its databases live, comes from `codegen.upstream.detect`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from codegen.core.errors import UpstreamError, UserError
from codegen.upstream import Adapter, detect
from codegen.upstream.layouts import layout_of
from codegen.upstream.registration import registration_gaps
from codegen.upstream.knobs import ENABLE_FP32_ENV


@dataclass(frozen=True)
class TreeInfo:
    root: Path
    adapter: Adapter

    @property
    def release(self) -> str:
        return self.adapter.release

    @property
    def gpu_targets(self) -> Path:
        return self.root / layout_of(self.adapter.layout).edit_paths.gpu_targets

    @property
    def compiler(self) -> Path:
        return self.root / layout_of(self.adapter.layout).edit_paths.compile


def release_of(tree: Path) -> TreeInfo:
    """Identify the release of an AOTriton tree (codegen.upstream.detect), refusing others."""
    return TreeInfo(root=Path(tree), adapter=detect(tree))


def check_registered(info: TreeInfo, gpus: list[str], arch: str) -> None:
    """Refuse a tree whose tables do not know the target (the overlay is not applied)."""
    gaps = registration_gaps(info.root, info.adapter.layout, gpus, arch)
    if any(name == "(the table itself)" for _, name in gaps):
        raise UpstreamError(f"{info.gpu_targets}: no AOTRITON_SUPPORTED_GPUS table found")
    missing = [name for table, name in gaps if table == "AOTRITON_SUPPORTED_GPUS"]
    if missing:
        raise UserError(
            f"{info.root}: AOTriton {info.release} does not know {', '.join(missing)}: "
            "the mi100-codegen overlay is not applied to this tree",
            hint=f"run: mi100-codegen apply {info.root}",
        )
    if gaps:
        raise UserError(
            f"{info.root}: {arch} is in AOTRITON_SUPPORTED_GPUS but not in AOTRITON_ARCH_TO_PACK "
            "(partially applied overlay)",
            hint=f"run: mi100-codegen apply {info.root}",
        )


def generator_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment CMake gives the generator, plus determinism and a hands-off tree:
    PYTHONHASHSEED=0 (0.11b orders #includes by set iteration) and no __pycache__ writes."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update({
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        ENABLE_FP32_ENV: env.get(ENABLE_FP32_ENV, "1"),  # CMake default ON
    })
    env.update(extra or {})
    return env
