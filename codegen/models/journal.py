"""The apply transaction's journal (`TREE/.mi100-codegen/txn/journal.json`, renamed
`rollback.json` when the operations are undone): the operation list, written and read by
`codegen.apply.journal` (its module doc has the protocol). Read as possibly hostile: every path
under the containment rule (`RelPath`), never inside the transaction's own folder."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, model_validator

from codegen.core.contain import RelPath
from codegen.models.records import Record, Sha256

STATE_DIR = ".mi100-codegen"
TXN_DIR = f"{STATE_DIR}/txn"

Digits = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]
PreState = Annotated[str, Field(pattern=r"^(absent|dir|link|other|[0-9a-f]{64})$")]


class JournalOp(Record):
    op: Literal["mkdir", "write", "delete", "rmdir"]
    path: RelPath
    stage: Digits | None = None      # write: txn/new/<stage>
    old: Digits | None = None        # write/delete of an existing file: txn/old/<old>
    pre: PreState = "absent"         # the path's state before the transaction
    new: Sha256 | None = None        # write: sha256 of the staged content
    mode: StrictInt | None = None    # write: permission bits (used masked: codegen.core.contain.perm_bits)

    @model_validator(mode="after")
    def _shape(self):
        if self.path == TXN_DIR or self.path.startswith(TXN_DIR + "/"):
            raise ValueError(f"{self.path!r} is inside the transaction's own folder")
        if self.op == "write" and (self.stage is None or self.new is None):
            raise ValueError("a write without its staged content")
        if self.op != "write" and (self.stage is not None or self.new is not None):
            raise ValueError(f"a {self.op} with staged content")
        if self.old is not None and self.op not in ("write", "delete"):
            raise ValueError(f"a {self.op} with an old copy")
        return self


class Journal(Record):
    version: Literal[1]
    ops: list[JournalOp]


__all__ = ["Journal", "JournalOp", "STATE_DIR", "TXN_DIR"]
