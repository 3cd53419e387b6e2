"""`<cache>/toolchain/<name>/toolchain.json`: the key of a build venv (the Python it runs, its
Triton, the generator requirements it holds), written and read by `codegen.toolchain.venv`; its
`digest` names the venv's folder. Read as possibly hostile (a cache folder): a record that is not
this model makes the folder no venv of ours."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from codegen.models.records import Name, Record, Text

TOOLCHAIN_FORMAT = 1
TOOLCHAIN_RECORD = "toolchain.json"


class VenvKey(Record):
    """What identifies a build venv; `digest` names its directory."""

    format: Literal[1] = TOOLCHAIN_FORMAT
    python: Name                      # python_id() of the interpreter it runs
    base: Text                        # the real path of that interpreter (a venv links to it)
    triton: Name                      # the Triton version it holds
    requirements: tuple[Name, ...]    # canonical names of the generator requirements it holds

    def as_dict(self) -> dict:
        return self.model_dump(mode="json")

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()

    @property
    def dirname(self) -> str:
        return f"triton-{self.triton}-{self.python}-{self.digest[:12]}"
