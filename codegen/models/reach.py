"""The reach record: which image packages a build left out because no dispatch table selects their
kernels (below the build folder, and a copy in an install prefix: codegen.imagebuild.reach.REACH_FILE), and its summary in
`build --json` and a bundle's manifest (`built_with.reach`). `codegen.plan.reach` computes it,
`codegen.imagebuild.reach` writes and reads it (as possibly hostile: every image a clean path
inside aotriton.images/)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator

from codegen.core.contain import RelPath, rel_path
from codegen.models.records import Count, Name, Record, Text

KERNEL_MODES = ("dispatched", "all")  # build --kernels
REACH_FORMAT = 3                      # of the reach record; another: the build configures again (3: lists kept)
Functional = dict[Name, Text]
"""A fused kernel's functional as its Triton signature spells it (codegen.plan.reach.fused_functional)."""


def _image(value: str) -> str:
    try:
        return rel_path(value, (".git",))
    except ValueError as exc:
        raise ValueError(f"not a path inside aotriton.images/ ({exc})") from None


class LeftOut(Record):
    """One image package left out: `image` below aotriton.images/ (an .aks2 file, or from 0.13b
    the image zip it would be a member of), `member` (0.13b: the zip member, the functional), and
    how many kernels it would have held."""

    image: Annotated[str, AfterValidator(_image)]
    member: Text | None
    kernels: Count
    functional: Functional = {}     # fused_functional() of its kernels


class Reach(Record):
    """The reach record. A record of the first format had no `format` field (the reader reads it as 1)."""

    format: Count = REACH_FORMAT
    mode: Literal["dispatched", "all"] = "dispatched"
    proven_by: RelPath | None = None        # the op table read, relative to the build dir
    reason: Text | None = None              # why nothing was left out, when nothing was
    fused_kernels: Count = 0                # the fused backward kernels of the compile list
    kernels_left_out: Count = 0
    packages_left_out: list[LeftOut] = []
    held: Functional | None = None          # the functional of one fused package kept (None: all left out)

    def to_json(self) -> dict:
        """Every field, as the record is written."""
        return self.model_dump(mode="json")

    def summary(self) -> dict:
        """What build --json and a bundle's manifest carry (`left_out`: the packages, for bundle
        check's forced-backend probe): a `ReachSummary`."""
        return ReachSummary(mode=self.mode, proven_by=self.proven_by, reason=self.reason,
                            fused_kernels=self.fused_kernels, kernels_left_out=self.kernels_left_out,
                            packages_left_out=len(self.packages_left_out), left_out=self.packages_left_out,
                            held=self.held).model_dump(mode="json")

    def left_out_packages(self) -> set[str]:
        """aks2 packages (relative to aotriton.images/, without .aks2), as dispatch tables name them."""
        return {p.image.removesuffix(".aks2") for p in self.packages_left_out if p.member is None}

    def left_out_members(self) -> set[tuple[str, str]]:
        """(image zip, member) pairs, 0.13b+."""
        return {(p.image, p.member) for p in self.packages_left_out if p.member is not None}


class ReachSummary(Record):
    """`Reach.summary()`: a bundle manifest's `built_with.reach`."""

    mode: Literal["dispatched", "all"]
    proven_by: RelPath | None
    reason: Text | None
    fused_kernels: Count
    kernels_left_out: Count
    packages_left_out: Count
    left_out: list[LeftOut]
    held: Functional | None
