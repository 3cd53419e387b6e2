"""The journal of a transaction on a folder we do not own (`TREE/.mi100-codegen/txn/journal.json`,
renamed `rollback.json` when the operations are undone): the operation list, written and read by
`codegen.apply.journal` (its module doc has the protocol), for `apply`/`revert` on an AOTriton
tree and `torch install`/`torch restore` on a torch folder. Read as possibly hostile: every path
under the containment rule (`RelPath`) of its root, never inside the transaction's own folder;
a root other than the tree (`roots`: the folder that holds torch's backup) is only ever the one
the command itself names (the journal's copy is compared with it, never believed)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StrictInt, model_validator

from codegen.core.contain import RelPath
from codegen.models.records import Name, Record, Sha256

STATE_DIR = ".mi100-codegen"
TXN_DIR = f"{STATE_DIR}/txn"
MAX_ROOTS = 2   # folders besides the tree a transaction may change

Digits = Annotated[str, Field(pattern=r"^[0-9]{1,9}$")]
PreState = Annotated[str, Field(pattern=r"^(absent|dir|link|other|[0-9a-f]{64})$")]


def _absolute(value: str) -> str:
    if not value.startswith("/") or len(value) > 4096 or not value.isprintable() or "\\" in value:
        raise ValueError(f"{value[:80]!r} is not an absolute path")
    if {"", ".", ".."} & set(value.split("/")[1:]) and value != "/":
        raise ValueError(f"{value[:80]!r} is not a normalized absolute path")
    return value


AbsPath = Annotated[str, AfterValidator(_absolute)]


class JournalOp(Record):
    op: Literal["mkdir", "write", "delete", "rmdir", "rename", "check"]
    path: RelPath
    root: Annotated[StrictInt, Field(ge=0, le=MAX_ROOTS)] = 0   # 0: the tree; n: the journal's roots[n-1]
    stage: Digits | None = None      # write: txn/new/<stage>
    old: Digits | None = None        # write/delete of an existing file: txn/old/<old>
    pre: PreState = "absent"         # the path's state before the transaction
    new: Sha256 | None = None        # write: sha256 of the staged content; check: the content wanted (None: absent)
    mode: StrictInt | None = None    # write: permission bits (used masked: codegen.core.contain.perm_bits)
    to: RelPath | None = None        # rename: the new name, in the same root

    @model_validator(mode="after")
    def _shape(self):
        if self.root == 0 and (self.path == TXN_DIR or self.path.startswith(TXN_DIR + "/")
                               or self.to is not None and (self.to == TXN_DIR or self.to.startswith(TXN_DIR + "/"))):
            raise ValueError(f"{self.path!r} is inside the transaction's own folder")
        if self.op == "write" and (self.stage is None or self.new is None):
            raise ValueError("a write without its staged content")
        if self.op != "write" and self.stage is not None:
            raise ValueError(f"a {self.op} with staged content")
        if self.new is not None and self.op not in ("write", "check"):
            raise ValueError(f"a {self.op} with a content hash")
        if self.old is not None and self.op not in ("write", "delete"):
            raise ValueError(f"a {self.op} with an old copy")
        if (self.to is not None) != (self.op == "rename"):
            raise ValueError("a rename names its new name, nothing else does")
        return self


class Journal(Record):
    version: Literal[1]
    label: Name | None = None                 # the command that wrote it ("torch install"), said by recovery
    roots: Annotated[list[AbsPath], Field(max_length=MAX_ROOTS)] = []
    ops: list[JournalOp]

    @model_validator(mode="after")
    def _roots(self):
        for n, op in enumerate(self.ops):
            if op.root > len(self.roots):
                raise ValueError(f"ops.{n}: root {op.root} is not one of the journal's")
        return self
