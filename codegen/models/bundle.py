"""A bundle's `manifest.json`: one model for everything that writes or reads it (`bundle build`
writes it, `bundle check`, `torch install --bundle`, `torch status` and `torch restore` read what
it says). The bundle zip's reader (`codegen.formats.bundle_zip`) validates it through
`codegen.models.records` before anything else looks at it.

A bundle travels, so every field is checked as hostile input: `arch` one of the AMDGPU
processors LLVM knows (`codegen.models.archs`), never a path; `release` one of the releases the
reader knows (given by the reader in the validation context as `{"releases": {name: version}}`,
since only `codegen.upstream` knows releases; `version`, when present, that release's);
`hip_major` one of the majors of `codegen.models.hip.HIP_SOURCES`, an integer; every count a
bounded integer; every string bounded (a label at most 200 printable characters); the library's
GLIBC/GLIBCXX needs parsed strictly (`GLIBC_2.34`, at most four numbers of at most four
digits); every path relative and clean (`RelPath`), the library and the spec among `files`.

Fields the writer added over time (`version`, `torch_lines`, `device_target`, `built_with` and
its `project` and `builder`, `kernels`, `compile_report`, `verified`, `rows_added`) are optional; a manifest is written with
exactly the fields it was made with (`Record.to_json`), so the writer's bytes do not change."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (AfterValidator, Field, StrictBool, StrictInt, ValidationInfo, field_validator,
                      model_validator)

from codegen.core.contain import RelPath
from codegen.models.archs import Arch
from codegen.models.hip import HipMajor
from codegen.models.reach import ReachSummary
from codegen.models.records import Count, Name, Record, Sha256, Text, clip
from codegen.models.target import DEVICE_TARGET_PATTERN

MANIFEST_FORMAT = 1
MANIFEST_LIMIT = 16 << 20   # bytes of manifest.json: a real one is a few hundred kB at most

GlibcNode = Annotated[str, Field(max_length=40, pattern=r"^GLIBC_[0-9]{1,4}(\.[0-9]{1,4}){0,3}$")]
GlibcxxNode = Annotated[str, Field(max_length=40, pattern=r"^GLIBCXX_[0-9]{1,4}(\.[0-9]{1,4}){0,3}$")]
Signed = Annotated[StrictInt, Field(ge=-(1 << 31), le=(1 << 31) - 1)]   # a return code, a hipError_t
VersionText = Annotated[str, Field(pattern=r"^[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}$")]
TorchLine = Annotated[str, Field(pattern=r"^[0-9]{1,4}\.[0-9]{1,4}$")]


def _release(value: str, info: ValidationInfo) -> str:
    known = (info.context or {}).get("releases")
    if known is None:
        raise ValueError("no table of known releases to check it against (the reader gives one)")
    if value not in known:
        raise ValueError(f"'{clip(value)}' is not a release mi100-codegen knows ({', '.join(known)})")
    return value


Release = Annotated[Name, AfterValidator(_release)]


class FileRecord(Record):
    sha256: Sha256
    size: Count


class SpecRecord(Record):
    """The spec the bundle was built from (the member `file`, its sha256, its name)."""

    name: Name | None = None
    sha256: Sha256
    file: RelPath | None = None


class Needs(Record):
    """The highest GLIBC/GLIBCXX version nodes the library needs (the baseline `torch install` checks)."""

    glibc: GlibcNode | None = None
    glibcxx: GlibcxxNode | None = None


class Library(Record):
    """The AOTriton library's ELF facts as the writer read them (`bundle check` reads them again)."""

    file: RelPath
    soname: Name | None = None
    needed: list[Name] = []
    rpath: list[Text] = []
    runpath: list[Text] = []
    hip_runtime: list[Name] = []
    needs: Needs | None = None
    hip_imports: dict[Name, Name] = {}


class Project(Record):
    """The mi100-codegen that built the bundle: its version, and the commit of the checkout it ran
    from (None: not a git checkout, e.g. an installed wheel; `modified`: the checkout had changes
    to tracked files)."""

    version: Name
    commit: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")] | None = None
    modified: StrictBool | None = None


class BuiltWith(Record):
    """What the bundle was built with and how this run got its kernels; `project` and `builder`
    (who ran the build: `$MI100_CODEGEN_BUILDER`, e.g. the release workflow's run, else 'local')
    are its provenance, which the bundle index lists."""

    project: Project | None = None
    builder: Name | None = None
    hip_headers: dict[Name, Name] = {}
    hip_suite: Name | None = None
    toolchain: dict[Name, Text | None] = {}
    machine: Name | None = None
    build_log: Text | None = None
    kernels_compiled: Count = 0
    kernels_cached: Count = 0
    aiter: Text | None = None
    kernels: Literal["dispatched", "all"] | None = None
    reach: ReachSummary | None = None
    images: Text | None = None


class KernelCounts(Record):
    """The build's verification of its images (codegen.imagebuild.verify)."""

    kernels_referenced: Count | None = None
    kernels_packed: Count | None = None
    kernels_left_out: Count | None = None
    missing_count: Count | None = None
    empty_count: Count | None = None
    packages: Count | None = None
    kernels_by_family: dict[Name, Count] | None = None


class CompileReportSummary(Record):
    """The compile report the overlay was rendered with, summarised."""

    sha256: Sha256
    arch: Name | None = None
    gpu: Name | None = None
    release: Name | None = None
    triton: Name | None = None
    configs: Count
    verdicts: dict[Name, Count] = {}
    kernels: Count


class ForcedCase(Record):
    """One forced backward as the driver ran it (codegen.ship.check.check_forced): the functional,
    its case, the HIP code the backward returned (None: never reported), its launches, the fused
    kernels among them, the stub runtime's violations."""

    functional: dict[Name, Text]
    case: Text
    backward: Signed | None
    launches: Count
    fused_launches: Count
    violations: list[Text]


class ForcedObservation(Record):
    """What the forced-backend probe observed: the driver's exit, the held and the left-out half."""

    driver_exit: Signed
    held: ForcedCase | None
    left_out: ForcedCase


class ClaimRecord(Record):
    """One check's result and where it ran (codegen.ship.check.Claim.as_json); `observed`: the
    facts the verdict was made from, where a check records them (the forced-backend probe)."""

    claim: Text
    ok: StrictBool
    detail: Annotated[str, Field(max_length=1 << 16)]
    verified: Text
    observed: ForcedObservation | None = None


class DispatchSummary(Record):
    """The emulated dispatch's totals (codegen.ship.dispatch.DispatchReport.summary)."""

    label: Name
    target: Name
    hip_major: HipMajor
    check_gpu: Signed | None
    cases: Count
    cases_ok: Count
    code_objects_loaded: Count
    launches: Count
    ok: StrictBool
    violations_outside_cases: list[Text]
    returncode: Signed


class Verified(Record):
    where: Text
    link_identity: list[ClaimRecord]
    dispatch: DispatchSummary | None
    negative_controls: list[ClaimRecord]
    tuning_rows: ClaimRecord | None
    forced_fused: ClaimRecord | None
    coverage: list[ClaimRecord] | None = None   # codegen.ship.coverage: axes, packages loaded


class RowsAdded(Record):
    to: Name
    from_tree: Name


class BundleManifest(Record):
    """`manifest.json` of a bundle (see the module doc)."""

    format: Literal[1]
    label: Name
    release: Release
    version: VersionText | None = None
    torch_lines: list[TorchLine] = []
    arch: Arch
    device_target: Annotated[str, Field(max_length=64, pattern=DEVICE_TARGET_PATTERN)] | None = None
    hip_major: HipMajor
    spec: SpecRecord
    library: Library
    built_with: BuiltWith | None = None
    kernels: KernelCounts | None = None
    compile_report: CompileReportSummary | None = None
    verified: Verified | None = None
    rows_added: RowsAdded | None = None
    files: dict[RelPath, FileRecord]

    @field_validator("version")
    @classmethod
    def _version_of_release(cls, v: str | None, info: ValidationInfo) -> str | None:
        want = ((info.context or {}).get("releases") or {}).get(info.data.get("release"))
        if v is not None and want is not None and v != want:
            raise ValueError(f"{v} is not the version of release {info.data['release']} ({want})")
        return v

    @model_validator(mode="after")
    def _members(self):
        for what, rel in (("library.file", self.library.file), ("spec.file", self.spec.file)):
            if rel is not None and rel not in self.files:
                raise ValueError(f"{what}: {rel!r} is not among the files the manifest lists")
        return self
