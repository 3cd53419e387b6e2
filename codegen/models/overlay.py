"""`aotriton_overlay/MANIFEST.json`: every file of a rendered overlay and every edit record, with
their sha256 (`codegen.render.overlay` writes it; `codegen.render.overlay_dir` reads the previous
render's to know which files in the output folder are ours). Read as possibly hostile (a folder
someone handed over): every path clean and relative; a manifest that is not this model, or not
mi100-codegen's, makes the folder's files not ours."""

from __future__ import annotations

from codegen.core.contain import RelPath
from codegen.models.records import Name, Record, Sha256, Text

OVERLAY_TOOLKIT = "mi100-codegen"


class OverlayOutput(Record):
    id: Name
    path: RelPath
    sha256: Sha256
    template: Text


class OverlayEdit(Record):
    id: Name
    path: RelPath            # the upstream file the edit changes, relative to the tree
    op: Name
    sha256: Sha256


class OverlayManifest(Record):
    toolkit: Name
    toolkit_version: Name
    spec_name: Name
    spec_sha256: Sha256
    layout: Name
    outputs: list[OverlayOutput]
    edits: list[OverlayEdit]
