"""`<site-packages>/torch.mi100-codegen-backup/manifest.json`: what `torch install` replaced,
added and removed in a torch folder, and (for `--bundle`) which bundle it installed. Written by
`codegen.ship.install`, read by `torch restore` and `torch status` as possibly hostile (a backup
folder someone else can write): every path stays inside the torch folder (`RelPath`), every hash
is a sha256 and each entry has the ones its action has, the bundle's record holds what its
(validated) manifest said, bounded. Which paths install may have changed at all is restore's
rule (`codegen.ship.install`: it knows torch's layout)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from codegen.core.contain import RelPath
from codegen.models.archs import Arch
from codegen.models.hip import HipMajor
from codegen.models.records import Name, Record, Sha256

BACKUP_SCHEMA = 1


class BundleRecord(Record):
    """The installed bundle: its file name and sha256, and what its manifest said."""

    file: Name
    sha256: Sha256
    release: Name
    arch: Arch
    hip_major: HipMajor
    label: Name
    spec_sha256: Sha256 | None = None


class BackupEntry(Record):
    """One file install changed: `add` has only the sha256 after, `remove` only the one before
    (the backup copy's), `replace` both."""

    path: RelPath
    action: Literal["add", "replace", "remove"]
    sha256_before: Sha256 | None
    sha256_after: Sha256 | None

    @model_validator(mode="after")
    def _hashes(self):
        if (self.sha256_before is None) != (self.action == "add") or (self.sha256_after is None) != (self.action == "remove"):
            raise ValueError(f"{self.action!r} entries have "
                             + {"add": "only sha256_after", "remove": "only sha256_before", "replace": "both sha256s"}[self.action])
        return self


class BackupManifest(Record):
    """The backup's manifest: `entries` in the order install changed them."""

    model_config = ConfigDict(populate_by_name=True)

    schema_: Literal[1] = Field(alias="schema")
    tool: Name | None = None
    torch_version: Name | None = None
    arch: Arch | None = None
    library: RelPath | None = None            # the file torch links, relative to the torch folder
    prefix_library: Name | None = None
    bundle: BundleRecord | None = None
    created_dirs: list[RelPath] = []
    entries: list[BackupEntry]
