"""One GPU kernel of a tree's compile list (`KernelEntry`): its config, every axis parsed once,
and what upstream's compiler needs besides. `codegen.plan.kernel_list` builds it from the
generator's compile list (codegen.formats.compile_list); in JSON the config is its procedural name. Its two paths are
relative and clean (`RelPath`): the image below the build dir, the source below the tree.

`Resources`: what one compiled kernel uses (registers, LDS, scratch, spills, its dot
instructions), read from its code object by `codegen.compile.resources` and kept in the
kernel cache's records (`codegen.models.cache`)."""

from __future__ import annotations

import posixpath
from typing import Annotated

from pydantic import ConfigDict, Field, field_serializer, field_validator

from codegen.core.contain import RelPath
from codegen.models.image_name import ImageName, Spelling
from codegen.models.records import Count, Name, Record, Text
from codegen.models.space import KernelConfig


class KernelEntry(Record):
    """One GPU kernel of the compile list: its config (every axis, parsed once) and what
    upstream's compiler needs besides. In JSON the config is its procedural name."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    id: Name                 # the image's file name without suffix (codegen.models.image_name): unique
    config: KernelConfig     # family (= Triton kernel name), arch, dtype, head dim, tile, waves_per_eu,
                             # num_warps, num_stages, pre_load_v; e.g. attn_fwd.gfx908.fp16.d64.M64N32.wpe2.w4.s1.plv0
    hsaco: RelPath           # path of the image relative to the build dir (v3src/ of a CMake build)
    source: RelPath          # Triton source relative to the tree root (e.g. tritonsrc/flash.py)
    kernel_name: Name
    signature: Annotated[str, Field(max_length=1 << 16)]  # Triton AOT signature, as the tree's compile.py takes it
    perf: Text               # the perf part of the image's name, as spelt ('' when plan could not name it)
    functional: Text         # the functional part of the image's name, as spelt

    @field_validator("config", mode="before")
    @classmethod
    def _parse_config(cls, value):
        return KernelConfig.parse(value) if isinstance(value, str) else value

    @field_serializer("config")
    def _config_name(self, config: KernelConfig) -> str:
        return config.name

    def image_name(self, names: Spelling) -> ImageName | None:
        """Its image's name as the release spells `names`; None when plan could not name it."""
        c = self.config
        name = names.name_of(self.kernel_name, self.functional, self.perf, (c.waves_per_eu, c.num_warps, c.num_stages),
                             c.arch)
        return name if name is not None and name.file_stem == self.id else None

    def with_waves(self, w: int, names: Spelling) -> "KernelEntry":
        """The same kernel compiled with another waves_per_eu: config and image name follow (the
        name stays where plan could not name the image)."""
        name = self.image_name(names)
        new = name.with_waves(w).file_stem if name is not None else self.id
        return self.model_copy(update={"config": self.config.with_waves(w), "id": new,
                                       "hsaco": posixpath.join(posixpath.dirname(self.hsaco), new + ".hsaco")})


DOT_KINDS = ("mfma", "wmma", "dot2", "fma")   # the instructions tl.dot lowers to, matrix cores first


class Resources(Record):
    vgprs: Count
    agprs: Count
    sgprs: Count
    lds_bytes: Count
    scratch_bytes: Count
    vgpr_spills: Count
    sgpr_spills: Count
    mfma: Count
    code_bytes: Count
    wmma: Count = 0
    dot2: Count = 0
    fma: Count = 0
    llvm_occupancy: Count | None = None
    # the upper bound of the kernel's `amdgpu-waves-per-eu` attribute (None: no upper bound)
    max_waves_per_eu: Count | None = None
    wavefront_size: Count | None = None

    @property
    def dot_instruction(self) -> str:
        """The instruction kind the kernel's products run on: the first of mfma, wmma, dot2, fma
        it uses (matrix cores first), or 'none'."""
        return next((k for k in DOT_KINDS if getattr(self, k)), "none")
