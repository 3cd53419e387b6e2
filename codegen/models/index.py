"""The bundle index, `index.json`: what bundles a folder or a release holds, one entry per bundle
file, every field derived from that bundle's own manifest (`mi100-codegen bundle index DIR`
writes it: codegen.ship.index, the one owner of reading, writing and choosing from it).

    {"format": 1, "bundles": [{"file": "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip",
      "url": "aotriton-0.11b-gfx908-hip6.mi100-bundle.zip", "size": 13812345, "sha256": "…",
      "release": "0.11b", "version": "0.11.0", "arch": "gfx908", "target": "gfx908:sramecc+:xnack-",
      "hip_major": 6, "torch_lines": ["2.9", "2.10", "2.11", "2.12"], "glibc": "GLIBC_2.34",
      "glibcxx": "GLIBCXX_3.4.29", "label": "…", "spec": {"name": "rules/mi100.yaml", "sha256": "…"},
      "provenance": {"project_version": "0.1.0", "project_commit": "…", "triton": "3.6.0",
                     "builder": "…"}}, …]}

An index is fetched from the network: hostile input. Every field is bounded and typed; `url` is
either a clean relative path of URL-safe characters (resolved against the index's own location,
never above it: no `..`, no absolute path, no scheme, query or fragment) or an absolute `https://`
URL without credentials; `file` a plain file name; no two entries share a file or a (release,
arch, HIP major). Releases, archs and HIP majors this version does not know are still read (an
index written by a newer mi100-codegen lists what an older one cannot use, and nothing chooses
them): each is a bounded name of its own spelling. An unknown `format` is refused as one message
saying to upgrade."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, ConfigDict, Field, StrictBool, StrictInt, model_validator

from codegen.core.contain import rel_path
from codegen.models.bundle import GlibcNode, GlibcxxNode, TorchLine, VersionText
from codegen.models.records import Count, Name, Record, Sha256, clip
from codegen.models.target import DEVICE_TARGET_PATTERN

INDEX_FORMAT = 1
INDEX_FILE = "index.json"
INDEX_LIMIT = 4 << 20      # bytes of index.json: an entry is ~700 bytes, so a few thousand bundles
INDEX_ENTRIES = 4096       # entries of one index
URL_LIMIT = 2048           # characters of one URL

_SEGMENT = r"[A-Za-z0-9._~+-]+"


def _url(value: str) -> str:
    """A relative path of URL-safe segments, or an https URL with a host and no credentials."""
    if len(value) > URL_LIMIT:
        raise ValueError(f"a URL longer than {URL_LIMIT} characters")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise ValueError(f"'{clip(value)}' holds a space or a control character")
    if "://" in value or value.startswith("//") or ":" in value.split("/", 1)[0]:
        parts = urlsplit(value)
        if parts.scheme != "https":
            raise ValueError(f"'{clip(value)}': an absolute URL must be https://")
        try:
            parts.port
        except ValueError:
            raise ValueError(f"'{clip(value)}': not a valid port") from None
        if not parts.hostname or "@" in parts.netloc or "\\" in value:
            raise ValueError(f"'{clip(value)}': an https URL names a host and no user or password")
        return value
    try:
        rel_path(value)
    except ValueError as exc:
        raise ValueError(f"a relative URL must stay below the index's folder: {exc}") from None
    if not all(re.fullmatch(_SEGMENT, seg) for seg in value.split("/")):
        raise ValueError(f"'{clip(value)}': a relative URL is made of letters, digits and ._~+- only")
    return value


BundleUrl = Annotated[str, Field(min_length=1), AfterValidator(_url)]
"""Where an entry's bundle is: relative to the index (`aotriton-….zip`, `bundles/aotriton-….zip`)
or an absolute https URL."""
FileName = Annotated[str, Field(max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.mi100-bundle\.zip$")]
ReleaseName = Annotated[str, Field(max_length=40, pattern=r"^[0-9][0-9A-Za-z.+-]*$")]
ArchName = Annotated[str, Field(max_length=16, pattern=r"^gfx[0-9]{2,4}[a-z]?$")]
HipNumber = Annotated[StrictInt, Field(ge=1, le=999)]


class IndexSpec(Record):
    """The spec the bundle was built from: its manifest's `spec` (`name`: as `bundle build` was
    given it, e.g. `rules/mi100.yaml`; `sha256`: of its meaning, codegen.formats.spec.spec_sha256)."""

    name: Name | None = None
    sha256: Sha256


class Provenance(Record):
    """Who built the bundle from what: the mi100-codegen version and checkout commit (None where
    the manifest records none: a bundle built before bundles recorded it, or from an installed
    wheel), the spec's sha256, the Triton that compiled the kernels, the builder."""

    project_version: Name | None = None
    project_commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None
    project_modified: StrictBool | None = None
    spec_sha256: Sha256
    triton: Name | None = None
    builder: Name | None = None


class IndexEntry(Record):
    """One bundle file of the index."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    file: FileName
    """The bundle's file name, `aotriton-<release>-<arch>-hip<N>.mi100-bundle.zip`."""
    url: BundleUrl
    """Where it is: relative to the index (below its folder), or an absolute https URL."""
    size: Count
    """Bytes of the file (checked before it is opened)."""
    sha256: Sha256
    """sha256 of the file (checked before it is opened)."""
    release: ReleaseName
    """The AOTriton release it was built from."""
    version: VersionText | None = None
    """That release's version (`0.11.0`)."""
    arch: ArchName
    """The GPU arch of its kernel images."""
    target: Annotated[str, Field(max_length=64, pattern=DEVICE_TARGET_PATTERN)] | None = None
    """The spec's full target string (`gfx908:sramecc+:xnack-`)."""
    hip_major: HipNumber
    """The HIP major its library links (the torch wheel's ROCm major)."""
    torch_lines: Annotated[list[TorchLine], Field(max_length=64)] = []
    """The PyTorch lines whose wheels link its release line."""
    glibc: GlibcNode | None = None
    """The newest GLIBC version node its library needs: the oldest glibc it runs on."""
    glibcxx: GlibcxxNode | None = None
    """The same for libstdc++."""
    label: Name
    """What was verified, and where."""
    spec: IndexSpec
    """The spec it was built from."""
    provenance: Provenance
    """Who built it from what."""

    @property
    def key(self) -> tuple[str, str, int]:
        """(release, arch, HIP major): no two entries of an index share it."""
        return (self.release, self.arch, self.hip_major)


class BundleIndex(Record):
    """`index.json`: what bundles a folder or a release holds, sorted by (release, arch, HIP major)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    format: Literal[1]
    """1; a reader refuses another format as one message."""
    bundles: Annotated[list[IndexEntry], Field(max_length=INDEX_ENTRIES)]
    """One entry per bundle file; no two share a file or a (release, arch, HIP major)."""

    @model_validator(mode="after")
    def _unique(self):
        files, keys = set(), set()
        for e in self.bundles:
            if e.file in files:
                raise ValueError(f"bundles: {e.file} is listed twice")
            if e.key in keys:
                raise ValueError(f"bundles: two entries for AOTriton {e.release}, {e.arch}, HIP {e.hip_major}")
            files.add(e.file)
            keys.add(e.key)
        return self
