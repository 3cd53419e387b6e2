"""The bundle index (`index.json`, the model: codegen.models.index): writing it from a folder of
bundles, reading it, finding where an index and its bundles are, choosing the bundle for a torch
and a card. The one owner of all four: `bundle index DIR` and `torch install --bundle auto` call
these functions.

Where the index is: `--index` (a folder, a URL of a folder holding `index.json`, or the URL of the
file itself), else `$MI100_CODEGEN_INDEX` (the same forms), else `DEFAULT_INDEX_URL`, the index
the release workflow (.github/workflows/bundles.yml) publishes with the project's release assets.
URLs are https; plain http only to this machine (127.0.0.1, ::1, localhost: a test server).

Writing (`write_index`): every `*.mi100-bundle.zip` of DIR is opened by the bundle's one reader
(codegen.formats.bundle_zip.open_bundle: every member against the manifest, the manifest one
model), accepted by the bundle's verdict (codegen.ship.verdict: the one `bundle check` and `torch
install --bundle` make; HIP version nodes are left to `bundle check`, which has the runtime to read
them from), the checks its build recorded passed, and its file name the one `bundle build` gives
it. A bundle failing any of these is refused, all of them in one message, and no index is
written; other files of DIR are not looked at. The entries are
sorted by (release, arch, HIP major), their URLs the file names (relative to the index: the folder
can be served as it is), and `DIR/index.json` is replaced atomically, only when it changes.

Reading (`read_index`): bounded bytes (`INDEX_LIMIT`), the records' one reader
(codegen.models.records: UTF-8, nesting bounded by the parser, one located message, exit 2); a
`format` other than 1 is one message naming it. Choosing (`select_bundle`): the entry for a
release or release line, an arch and a HIP major; an exact release first, else the newest release
of the same line (point releases of a line are ABI-compatible)."""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from codegen.core.contain import inside
from codegen.core.errors import UserError, os_failure, os_reason
from codegen.core.fsutil import read_input, write_if_changed
from codegen.core.ui import printable
from codegen.formats.bundle_zip import Bundle, BundleError, bundle_name, extract, open_bundle
from codegen.formats.elf import ElfError
from codegen.models.index import INDEX_FILE, INDEX_FORMAT, INDEX_LIMIT, BundleIndex, IndexEntry
from codegen.models.records import RecordError, clip, parse_json, validate_record, write_json
from codegen.ship.fetch import check_url
from codegen.ship.verdict import bundle_verdict
from codegen.upstream.releases import parse_tag, tag_line

DEFAULT_INDEX_URL = "https://github.com/mi100-codegen/mi100-codegen/releases/latest/download/index.json"
"""The published index: the release workflow uploads `index.json` beside the bundles."""
INDEX_ENV = "MI100_CODEGEN_INDEX"
"""Environment variable naming the index (a folder or a URL) when `--index` is not given."""
BUNDLE_SUFFIX = ".mi100-bundle.zip"

_HINT = "the index is not one mi100-codegen wrote (`mi100-codegen bundle index DIR`), or was changed"


# --- where an index is ---------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexLocation:
    """Where an index document is (`document`: a URL, or `folder`/index.json) and how its entries'
    relative URLs resolve; `origin`: which setting named it (for messages)."""

    document: str
    folder: Path | None
    origin: str

    @property
    def is_url(self) -> bool:
        return self.folder is None

    def bundle(self, entry: IndexEntry) -> str | Path:
        """Where `entry`'s bundle is: its absolute https URL, the URL relative to the index's, or
        the file below the index's folder (never above it: codegen.core.contain.inside)."""
        if "://" in entry.url:
            return entry.url
        if self.folder is None:
            return urljoin(self.document, entry.url)
        return inside(self.folder, entry.url)


def index_source(option: str | None = None) -> tuple[str, str]:
    """(the index named, which setting named it): `option` (`--index`), else $MI100_CODEGEN_INDEX,
    else the published one."""
    if option:
        return option, "--index"
    if os.environ.get(INDEX_ENV):
        return os.environ[INDEX_ENV], f"${INDEX_ENV}"
    return DEFAULT_INDEX_URL, "the published index"


def index_location(source: str, origin: str = "--index") -> IndexLocation:
    """An index named as a folder, a URL of a folder or the URL of `index.json` itself (https;
    http only to this machine), else one message (exit 2)."""
    if "://" in source:
        check_url(source, what=origin, hint="or name a folder holding index.json")   # the fetcher's one rule
        parts = urlsplit(source)
        if parts.query or parts.fragment:
            raise UserError(f"{origin} {clip(source)}: an index URL has no query or fragment")
        doc = source if parts.path.endswith(".json") else source.rstrip("/") + "/" + INDEX_FILE
        return IndexLocation(doc, None, origin)
    path = Path(source).expanduser()
    if path.is_dir():
        folder = path.resolve()
        return IndexLocation(str(folder / INDEX_FILE), folder, origin)
    return IndexLocation(str(path), path.parent.resolve(), origin)


# --- reading -------------------------------------------------------------------------------------
def read_index(raw: bytes, where: str) -> BundleIndex:
    """An index document's bytes as the model, else RecordError (exit 2): one located message."""
    if len(raw) > INDEX_LIMIT:
        raise RecordError(where, f"this bundle index is larger than {INDEX_LIMIT:,} bytes", kind="read", hint=_HINT)
    data = parse_json(raw, where=where, what="bundle index", hint=_HINT)
    fmt = data.get("format") if isinstance(data, dict) else None
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt != INDEX_FORMAT:
        raise RecordError(where, f"bundle index format {fmt}: this mi100-codegen reads format {INDEX_FORMAT}",
                          kind="shape", hint="a newer mi100-codegen wrote it: pip install -U mi100-codegen")
    return validate_record(BundleIndex, data, where=where, what="bundle index", hint=_HINT)


def read_index_file(path: Path) -> BundleIndex:
    """The index at `path` (a bounded regular file), else one message (exit 2)."""
    try:
        raw = read_input(path, what="bundle index", limit=INDEX_LIMIT)
    except UserError as exc:
        raise RecordError(str(path), str(exc).removeprefix(f"{path}: "), kind="read") from None
    return read_index(raw, str(path))


# --- an entry, from its bundle -------------------------------------------------------------------
def entry_of(bundle: Bundle, url: str | None = None) -> IndexEntry:
    """The index entry of an opened bundle: every field from its manifest and the file's own size
    and sha256; `url` defaults to the file name (the bundle beside the index)."""
    m = bundle.manifest
    bw = m.built_with
    project = bw.project if bw is not None else None
    needs = m.library.needs
    data = {
        "file": bundle.path.name, "url": url or bundle.path.name, "size": bundle.size, "sha256": bundle.sha256,
        "release": m.release, "version": m.version, "arch": m.arch, "target": m.device_target,
        "hip_major": m.hip_major, "torch_lines": list(m.torch_lines),
        "glibc": needs.glibc if needs else None, "glibcxx": needs.glibcxx if needs else None,
        "label": m.label, "spec": {"name": m.spec.name, "sha256": m.spec.sha256},
        "provenance": {
            "project_version": project.version if project else None,
            "project_commit": project.commit if project else None,
            "project_modified": project.modified if project else None,
            "spec_sha256": m.spec.sha256,
            "triton": (bw.toolchain.get("triton") if bw is not None else None) or None,
            "builder": bw.builder if bw is not None else None,
        },
    }
    return validate_record(IndexEntry, {k: v for k, v in data.items() if v is not None} | {
        "provenance": {k: v for k, v in data["provenance"].items() if v is not None}},
        where=f"{bundle.path}: manifest.json", what="bundle index entry")


def entry_differences(bundle: Bundle, entry: IndexEntry) -> list[str]:
    """What the index says of a bundle that the bundle itself does not (empty: the entry is the
    bundle's own, as `bundle index` would write it): for a downloaded bundle, after it is opened."""
    try:
        own = entry_of(bundle, entry.url).to_json()
    except RecordError as exc:
        return [exc.problem]
    theirs = entry.to_json()
    return [f"{k}: the index says {clip(str(theirs.get(k)))}, the bundle {clip(str(own.get(k)))}"
            for k in sorted(set(own) | set(theirs)) if own.get(k) != theirs.get(k)]


def bundle_problems(bundle: Bundle) -> list[str]:
    """Why `bundle` cannot be listed (empty: it can): its file name, the bundle's verdict
    (codegen.ship.verdict: what `bundle check` and `torch install --bundle` accept), the checks its
    build recorded."""
    m = bundle.manifest
    out = []
    want = bundle_name(m.release, m.arch, m.hip_major)
    if bundle.path.name != want:
        out.append(f"its manifest says AOTriton {m.release}, {m.arch}, HIP {m.hip_major}: the file is {want}")
    with tempfile.TemporaryDirectory(prefix="mi100-index-") as work:
        try:
            claims = bundle_verdict(extract(bundle, Path(work) / "bundle"), m, None)
        except ElfError as exc:
            return out + [str(exc).replace(f"{work}/bundle/", "", 1)]
    out += [f"{c.name} ({c.detail})" for c in claims if not c.ok]
    v = m.verified
    if v is not None:
        recorded = [*v.link_identity, *v.negative_controls, *(c for c in (v.tuning_rows, v.forced_fused) if c)]
        out += [f"its build recorded a failed check: {c.claim}" for c in recorded if not c.ok]
        if v.dispatch is not None and not v.dispatch.ok:
            out.append("its build recorded a failed emulated dispatch")
    return out


# --- writing -------------------------------------------------------------------------------------
def _bundle_files(folder: Path) -> list[Path]:
    out = []
    for p in sorted(folder.iterdir()):
        if not p.name.endswith(BUNDLE_SUFFIX):
            continue
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{p}: not a regular file (a link or a folder); an index lists the files of its folder",
                            hint="copy the bundle itself into the folder")
        out.append(p)
    return out


def build_index(folder: Path, *, progress=lambda line: None) -> BundleIndex:
    """The index of the bundles in `folder` (module doc), else one message (exit 2) naming every
    bundle refused."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"{folder}: not a folder of bundles")
    try:
        files = _bundle_files(folder.resolve())
    except OSError as exc:
        raise os_failure(f"{folder}: cannot list its bundles ({os_reason(exc)})", exc) from None
    if not files:
        raise UserError(f"{folder}: no *{BUNDLE_SUFFIX} files to index",
                        hint="build some: mi100-codegen bundle build TREE --hip N --out DIR")
    entries, refused = [], []
    for path in files:
        progress(f"reading {path.name}")
        try:
            bundle = open_bundle(path)
        except (BundleError, UserError) as exc:
            refused.append(str(exc))
            continue
        problems = bundle_problems(bundle)
        if problems:
            refused.append(f"{path}: " + "; ".join(problems))
            continue
        entries.append(entry_of(bundle))
    if refused:
        raise UserError(f"{folder}: {len(refused)} of {len(files)} bundles cannot be listed, no index written:\n"
                        + "\n".join(f"  {printable(r)}" for r in refused),
                        hint="build those again (mi100-codegen bundle build TREE --hip N) or move them out of the folder")
    entries.sort(key=lambda e: (parse_tag(e.release) or (999, 999, 999), e.release, e.arch, e.hip_major))
    return validate_record(BundleIndex, {"format": INDEX_FORMAT, "bundles": [e.to_json() for e in entries]},
                           where=str(folder / INDEX_FILE), what="bundle index")


def write_index(folder: Path, *, progress=lambda line: None) -> tuple[Path, BundleIndex, bool]:
    """`folder/index.json` from the bundles in `folder`, replaced atomically when it changes.
    Returns (its path, the index, whether it changed)."""
    index = build_index(folder, progress=progress)
    dest = Path(folder) / INDEX_FILE
    try:
        changed = write_if_changed(dest, write_json(index))
    except OSError as exc:
        raise os_failure(f"{dest}: cannot write it ({os_reason(exc)}); the old index, if any, is unchanged",
                         exc) from None
    return dest, index, changed


# --- choosing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """`entry`: the bundle for the request, None when the index has none; `exact`: its release is
    the one asked for (not only its line); `others`: the index's entries for the same arch (what
    a message can name instead)."""

    entry: IndexEntry | None
    exact: bool
    others: tuple[IndexEntry, ...]


def _line(release: str) -> str | None:
    """'0.11.1b' -> '0.11'; a line ('0.11') is itself; None for anything else."""
    if tag_line(release):
        return tag_line(release)
    parts = release.split(".")
    return release if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def select_bundle(index: BundleIndex, *, release: str, arch: str, hip_major: int) -> Choice:
    """The entry for AOTriton `release` (a tag such as '0.11.1b', or a line such as '0.11'), `arch`
    (the bundle's arch: gfx1030 for the RDNA2 cards that run its code) and `hip_major`: the same
    release first, else the newest release of its line."""
    same = [e for e in index.bundles if e.arch == arch and e.hip_major == hip_major]
    others = tuple(e for e in index.bundles if e.arch == arch and e not in same)
    for e in same:
        if e.release == release:
            return Choice(e, True, others)
    line = _line(release)
    fits = [e for e in same if line is not None and tag_line(e.release) == line]
    best = max(fits, key=lambda e: parse_tag(e.release), default=None)
    return Choice(best, False, others + tuple(e for e in same if e is not best))


def index_json_schema() -> dict:
    """The JSON Schema of `index.json` (the reference page shows it)."""
    return BundleIndex.model_json_schema()
