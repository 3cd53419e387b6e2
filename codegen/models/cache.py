"""A record of the kernel cache (`<cache>/kernels/<k[:2]>/<key>.json`, beside its code object
`<key>.hsaco`): written and read by `codegen.compile.cache`, whose module doc says what the cache
is keyed by and how an entry is checked. Read as possibly hostile (another user's cache folder, a
disk error): a record that is not this model is dropped and the kernel compiled again."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool

from codegen.models.kernel import Resources
from codegen.models.records import Name, Record, Sha256

CACHE_FORMAT = 5  # 2: resources read from the metadata note, waves-per-eu bound; 3: dot-instruction counts;
#                  4: sources = the kernel file's import closure; 5: Triton's metadata sidecar (what
#                  build writes beside the image), the code object's sha256, shared with build


class CacheRecord(Record):
    """One kernel's compile: its result (`ok`, the first error line), the seconds it took, its
    resources and Triton's metadata sidecar (JSON text), and the sha256 of its code object."""

    format: Literal[5]
    key: Sha256
    ok: StrictBool
    id: Name | None = None                                         # the kernel's image name
    compile_s: Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)] = 0.0
    error: Annotated[str, Field(max_length=1 << 16)] | None = None
    resources: Resources | None = None
    sidecar: Annotated[str, Field(max_length=1 << 20)] | None = None
    hsaco_sha256: Sha256 | None = None
