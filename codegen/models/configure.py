"""`BUILD/mi100-codegen/configure.json`: what the last configure of a build folder was made from
(the fingerprint of its CMake cache entries, environment knobs, tree inputs and support files,
and those entries themselves), written and read by `codegen.imagebuild.configure`. A record that
is not this model means "configure again"."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from codegen.models.records import Name, Record, Sha256

Value = Annotated[str, Field(max_length=1 << 16)]   # a cache entry's value may be a long list of paths


class ConfigureRecord(Record):
    fingerprint: Sha256
    release: Name
    cache: list[tuple[Name, Name, Value]]    # (name, type, value), sorted by name
    knobs: list[tuple[Name, Value]]          # environment knobs, sorted
