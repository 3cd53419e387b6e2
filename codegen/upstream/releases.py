"""One frozen record per AOTriton release: the only place that knows a release.

A record holds the release's identity (name, version, tag commit and tree ids), its layout traits
(where the generator, the tuning databases, the kernels and the C++ runtime live: everything the
stages read through the adapter), what it ships (archs), which PyTorch lines link it, the Triton
it pins and its library file name. Stages receive the record (`detect(tree)` returns it; it is
the "adapter"), never a release name to look up again.

Adding a release whose layout matches an existing one is one `Release(...)` line in `RELEASES`
(plus its tests: docs/howto/add-release.md). A new layout is one more `_traits` preset.

Releases known only because a PyTorch line links them (0.9.2b for 2.7) have a record with
`supported=False`: no layout traits, refused by `detect`, listed by the torch-lines table.

`0.14.0-dev` is not a release: it is upstream's main at commit 30ae967 (2026-08-19), whose CMake
says 0.14.0; it is recognised by its layout traits and its API markers, not by the version alone,
so a later 0.14 tag (0.14b) that also says 0.14.0 is refused until its own record is added
(docs/releases.md says what 0.14b is expected to change).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from codegen.models.image_name import ENTRY, SIG, Spelling
from codegen.upstream.knobs import COMMIT_ENV, TREE_SHA_ENV

Version = tuple[int, int, int]

# Where every release installs its kernel images, below the library's folder (lib/): one
# folder per GPU, `amd-<arch>/`, each holding .aks2 packages (0.13b+: image zips).
IMAGES_DIR = "aotriton.images"

# Every database in a tree is one sqlite file in a tar in xz, named after it: `<name>.sqlite3.tar.xz`
# (the kernel tuning database, the op database, each shard; codegen.formats.tuning_db reads and
# writes them). The generator reads the composed kernel tuning database by its file name.
DB_ARCHIVE_SUFFIX = ".sqlite3.tar.xz"
TUNING_DB_FILE = "tuning_database.sqlite3"
OP_DB_FILE = "op_database.sqlite3"


def db_archive(folder: str, db_file: str) -> str:
    """The archive of database `db_file` in a tree folder: 'v3python/rules/op_database.sqlite3.tar.xz'."""
    return f"{folder}/{db_file}.tar.xz"


# The Triton submodule every release so far pins (.gitmodules): AMD's fork, one branch; the
# submodule's commit is not part of a `git archive`, so no version is known from the tree.
ROCM_TRITON_FORK = "ROCmSoftwarePlatform/triton, branch aotriton-hyperjump (third_party/triton submodule)"


def release_name(version: Version) -> str:
    """(0, 11, 0) -> '0.11b'; (0, 11, 1) -> '0.11.1b' (upstream's tag spelling)."""
    major, minor, patch = version
    return f"{major}.{minor}b" if patch == 0 else f"{major}.{minor}.{patch}b"


_TAG_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?b")


def parse_tag(tag: str) -> Version | None:
    """`release_name`'s parser: '0.12b' -> (0, 12, 0), '0.12.1b' -> (0, 12, 1); None for anything
    else (a snapshot's '0.14.0-dev', a name no tag has)."""
    m = _TAG_RE.fullmatch(tag)
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def release_line(major: int, minor: int) -> str:
    """A release line, '0.12': the releases of one line (0.12b, 0.12.1b) are ABI-compatible."""
    return f"{major}.{minor}"


def tag_line(tag: str) -> str | None:
    """'0.12.1b' -> '0.12' (the release line of a tag); None for anything `parse_tag` refuses."""
    v = parse_tag(tag)
    return release_line(v[0], v[1]) if v else None


def version_text(version: Version) -> str:
    """(0, 14, 0) -> '0.14.0': a version as the tree's CMakeLists.txt says it."""
    return ".".join(map(str, version))


@dataclass(frozen=True)
class TorchLine:
    """A PyTorch feature release whose official wheels link a release, the PyTorch branch a
    from-source rebuild uses, and the ROCm versions of its wheels on download.pytorch.org
    (`rocm`: '6.4'; '7.x' where only the major is known, not checked here): their majors are the
    HIP majors a bundle for this line is built for."""

    torch: str   # '2.13'
    branch: str  # 'release/2.13'
    note: str = ""
    rocm: tuple[str, ...] = ()

    @property
    def hip_majors(self) -> tuple[int, ...]:
        """(6,) for ROCm 6.3 and 6.4 wheels: a ROCm wheel ships the HIP runtime of its ROCm major."""
        return tuple(sorted({int(v.split(".")[0]) for v in self.rocm}))


@dataclass(frozen=True)
class BuildCost:
    """A cold kernel compile (empty kernel cache) of a release for one shipped spec, in CPU-seconds
    (user+sys): the dated entry "image-build cost per release and target" of docs/measurements.md,
    which tests/test_owner_cost.py checks the records against (codegen.imagebuild.cost estimates a
    local bundle build from them)."""

    spec: str       # the shipped spec's name: 'mi100'
    kernels: int
    cpu_s: int


def _costs(**by_spec: tuple[int, int]) -> tuple[BuildCost, ...]:
    return tuple(BuildCost(spec, kernels, cpu_s) for spec, (kernels, cpu_s) in by_spec.items())


@dataclass(frozen=True)
class Release:
    # --- identity -------------------------------------------------------------------------------
    release: str                     # the name users see: '0.13b', or '0.14.0-dev' for a snapshot
    version: Version                 # what CMakeLists.txt says: (0, 13, 0)
    commit: str | None = None        # the tag's (snapshot's) commit on github.com/ROCm/aotriton
    tree: str | None = None          # that commit's tree id (for builds of trees without .git)
    date: str = ""                   # commit date
    snapshot: bool = False           # True: a commit of main, not a release tag
    supported: bool = True           # False: known (a torch line links it), no adapter
    # --- what it ships and who links it ---------------------------------------------------------
    shipped_archs: tuple[str, ...] = ()   # keys of AOTRITON_ARCH_TO_PACK at the tag
    torch_lines: tuple[TorchLine, ...] = ()
    triton: str = ROCM_TRITON_FORK
    # --- what building it costs (measured; a release without a row takes its line's) ---------------
    build_costs: tuple[BuildCost, ...] = ()
    same_kernels_as: str | None = None    # a release whose plans are exactly this other's kernels
    # --- layout traits (the adapter) ------------------------------------------------------------
    id: str = ""                     # layout family id: 'v3python-central-db', 'aotriton-modular', …
    layout: str = ""                 # edit-path family (codegen.upstream.layouts)
    tuning_db_layout: str = ""       # 'central' | 'sharded'
    tuning_db: str = ""              # central DB (sharded: the schema-only one beside the shards)
    op_db: str | None = None         # op-DB tarball; None for 0.10b
    shard_root: str | None = None    # '<...>/database/amd' (sharded) or None
    # shard file under shard_root: '{arch}/{family}/{kernel}' (0.11.1b–0.13b) or '{arch}/{kernel}'
    # (main: one database folder per family, modules/<family>/database)
    shard_pattern: str = "{arch}/{family}/{kernel}"
    generator_module: str = "v3python.generate"
    db_compose_module: str | None = None
    build_db_dir: str = "."          # where the generator reads the DB, relative to --build_dir
    required_files: tuple[str, ...] = field(default_factory=tuple)
    foreign_paths: tuple[str, ...] = ()   # present: another layout (refused)
    # (file, text): text that must be in / must not be in a file (API markers)
    markers: tuple[tuple[str, str], ...] = ()
    foreign_markers: tuple[tuple[str, str], ...] = ()
    commit_knobs: tuple[str, ...] = ()    # env knobs its CMake reads for a tree without .git
    inherits_site_triton: bool = True     # CMake option AOTRITON_INHERIT_SYSTEM_SITE_TRITON (0.11b+)
    builds_own_triton: bool = False       # image builds compile third_party/triton (0.10b)
    exports_v3_api: bool = True           # aotriton::v3::flash entry points (0.11b+)
    exports_v2_attn: bool = True          # aotriton::v2::flash::attn_fwd/attn_bwd (gone in 0.13b)
    # PyTorch's backward goes through the v3 attn_bwd and so the backward op table (0.11b+, whose
    # torch lines set AOTRITON_ALWAYS_V3_API); with 0.10b it calls the v2 attn_bwd_fused itself, so
    # the op table proves nothing unreachable (codegen.imagebuild.reach)
    torch_bwd_via_op_table: bool = True
    clones_aiter: bool = False            # CMake clones ROCm/aiter at configure time (0.12b+)
    # the archs aiter's prebuilt kernels serve (0.12b's SUPPORTED_ARCH, 0.13b's @ati.affine.arch; a
    # real-tree test reads them): a build for any other arch reads nothing from the clone
    aiter_archs: tuple[str, ...] = ()
    aiter_tag_file: str = "third_party/aiter.txt"  # the tag CMake clones
    min_clang: int | None = None          # oldest Clang for the C++ runtime (0.12b+: 16)
    package_dir: str | None = None        # tree folder imported as the generator package ('python')
    kernel_dir: str = "tritonsrc"         # the Triton kernels (tune, validate --kernels)
    image_format: str = "aks2"            # 'aks2' or 'zip' (0.13b+)
    image_names: Spelling = SIG           # how its images are named (codegen.models.image_name; 0.13b+: ENTRY)

    @property
    def commit_ids(self) -> tuple[str, str | None] | None:
        """(commit, tree id) of the tag or snapshot; the tree id None where it is not known."""
        return (self.commit, self.tree) if self.commit else None

    @property
    def library(self) -> str:
        """The file `libtorch_hip.so` needs: 'libaotriton_v2.so.0.13.0' (VERSION, no SOVERSION)."""
        return f"libaotriton_v2.so.{version_text(self.version)}"

    @property
    def label(self) -> str:
        """How messages name it: '0.13b', or '0.14.0-dev (main at 30ae967, not a release)'."""
        if self.snapshot and self.commit:
            return f"{self.release} (main at {self.commit[:7]}, not a release)"
        return self.release

    def shard_path(self, arch: str, kernel: str, family: str = "flash") -> str:
        if self.shard_root is None:
            raise ValueError(f"release {self.release} has no sharded tuning database")
        rel = self.shard_pattern.format(arch=arch, family=family, kernel=kernel)
        return f"{self.shard_root}/{rel}{DB_ARCHIVE_SUFFIX}"


# --- layout presets ------------------------------------------------------------------------------
def _commit_knobs(version: Version) -> tuple[str, ...]:
    """0.10b reads no commit knob (always `git log`); 0.11b+ the commit (fatal when missing
    from 0.11.1b); 0.12b+ also the tree id (fatal when missing)."""
    if version < (0, 11, 0):
        return ()
    return (COMMIT_ENV,) if version < (0, 12, 0) else (COMMIT_ENV, TREE_SHA_ENV)


AITER_ARCHS = ("gfx942", "gfx950")  # the archs of the aiter kernels 0.12b … main pack

V3PYTHON_FILES = (
    "CMakeLists.txt",
    "include/aotriton/util.h",
    "v3src/util.cc",
    "v3python/gpu_targets.py",
    "v3python/compile.py",
    "v3python/generate.py",
    "v3python/kernel/kdesc.py",
    "v3python/rules/flash/op_attn_fwd.py",
)
PYTHON_FILES = (
    "CMakeLists.txt",
    "include/aotriton/util.h",
    "v3src/util.cc",
    "python/__init__.py",
    "python/gpu_targets.py",
    "python/compile.py",
    "python/generate.py",
    "python/database_compose.py",
    "python/autotune/__init__.py",
    "python/template_instantiation/ir/kdesc.py",
    "modules/flash/aot/_common.py",
)


def _traits(family: str, version: Version) -> dict:
    """The layout traits of a layout family, for a release of that version (the few traits that
    changed inside a family, by version)."""
    common = dict(commit_knobs=_commit_knobs(version))
    if family == "v3python-central-db":  # 0.10b, 0.11b
        tdb = db_archive("v3python/rules", TUNING_DB_FILE)
        odb = db_archive("v3python/rules", OP_DB_FILE) if version >= (0, 11, 0) else None
        return dict(common, id=family, layout="v3python", tuning_db_layout="central", tuning_db=tdb, op_db=odb,
                    required_files=V3PYTHON_FILES + (tdb,) + ((odb,) if odb else ()),
                    foreign_paths=("python/generate.py", "modules"),
                    inherits_site_triton=version >= (0, 11, 0), builds_own_triton=version < (0, 11, 0),
                    exports_v3_api=version >= (0, 11, 0), torch_bwd_via_op_table=version >= (0, 11, 0))
    if family == "v3python-sharded-db":  # 0.11.1b … 0.12.1b
        tdb, odb = db_archive("v3python/database", TUNING_DB_FILE), db_archive("v3python/database", OP_DB_FILE)
        return dict(common, id=family, layout="v3python", tuning_db_layout="sharded", tuning_db=tdb, op_db=odb,
                    shard_root="v3python/database/amd", db_compose_module="v3python.database_compose",
                    build_db_dir="database",
                    required_files=V3PYTHON_FILES + (tdb, odb, "v3python/database_compose.py"),
                    foreign_paths=("python/generate.py", "modules"),
                    clones_aiter=version >= (0, 12, 0), min_clang=16 if version >= (0, 12, 0) else None,
                    aiter_archs=AITER_ARCHS if version >= (0, 12, 0) else ())
    if family in ("aotriton-python", "aotriton-modular"):
        # aotriton-python (0.13b): the package `aotriton` (source python/), kernels and rules under
        # modules/flash/, one DB folder modules/database/amd/<arch>/flash/<kernel>.
        # aotriton-modular (main after 0.13b, the 0.14 line): one DB folder per family,
        # modules/<family>/database/amd/<arch>/<kernel>, composed into <build>/<family>/database;
        # C++ in modules/flash/csrc, no v3python/ or tritonsrc/ (docs/releases.md).
        modular = family == "aotriton-modular"
        db = "modules/flash/database" if modular else "modules/database"
        tdb, odb = db_archive(db, TUNING_DB_FILE), db_archive(db, OP_DB_FILE)
        own = ("modules/flash/csrc/attn_fwd.cc",) if modular else ()
        return dict(common, id=family, layout="aotriton-python", tuning_db_layout="sharded", tuning_db=tdb,
                    op_db=odb, shard_root=f"{db}/amd",
                    shard_pattern="{arch}/{kernel}" if modular else "{arch}/{family}/{kernel}",
                    generator_module="aotriton.generate", db_compose_module="aotriton.database_compose",
                    build_db_dir="flash/database" if modular else "database",
                    required_files=PYTHON_FILES + (tdb, odb) + own, package_dir="python",
                    kernel_dir="modules/flash/kernel", image_format="zip", image_names=ENTRY, exports_v2_attn=False,
                    foreign_paths=("v3python/generate.py",)
                    + (("modules/database", "tritonsrc") if modular else ("modules/flash/database",)),
                    clones_aiter=True, min_clang=16, aiter_archs=AITER_ARCHS)
    raise ValueError(f"unknown layout family {family}")


def _release(name: str, version: Version, family: str, **fields) -> Release:
    return Release(release=name, version=version, **_traits(family, version), **fields)


_BASE = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1150", "gfx1151", "gfx1200", "gfx1201", "gfx1250")
_RDNA3_PLUS = _BASE + ("gfx1102", "gfx1103", "gfx1152", "gfx1153")


def _torch(*lines: tuple) -> tuple[TorchLine, ...]:
    return tuple(TorchLine(*t) for t in lines)


# The table. Commit, tree and date: the tags on github.com/ROCm/aotriton (the shared archive's
# TAGS). Torch lines: docs/torch.md and docs/releases.md list the sources; their ROCm versions:
# PyTorch's release posts and install matrix (docs/bundles.md), '7.x' where the minor is not checked.
RELEASES: tuple[Release, ...] = (
    Release("0.9.2b", (0, 9, 2), supported=False, torch_lines=_torch(("2.7", "release/2.7", "", ("6.2.4", "6.3")))),
    _release("0.10b", (0, 10, 0), "v3python-central-db",
             commit="6fca155f4deeb8d9529326f7b69f350aeeb93477", tree="f2c099e3dc10d6458c7c74c9e272541632743439",
             date="2025-06-17", shipped_archs=_BASE, torch_lines=_torch(("2.8", "release/2.8", "", ("6.3", "6.4"))),
             build_costs=_costs(mi100=(2731, 4622), rdna2=(1537, 1871), mi50=(411, 252))),
    _release("0.11b", (0, 11, 0), "v3python-central-db",
             commit="972223c501ffc22068bb035ac5d64cf54318d895", tree="c0bd86c32752dadf9aa64e65a3a554b7990c3d66",
             date="2025-08-28", shipped_archs=_BASE + ("gfx1102",), torch_lines=_torch(("2.9", "release/2.9", "", ("6.3", "6.4"))),
             build_costs=_costs(mi100=(2381, 2695), rdna2=(1327, 1925), mi50=(335, 208))),
    _release("0.11.1b", (0, 11, 1), "v3python-sharded-db",
             commit="98371989e8a23267e284c94e95156a139e4b33c4", tree="0b316c47ac37c46065bb72f66e4f4b7200e29517",
             date="2025-11-11", shipped_archs=_BASE + ("gfx1102", "gfx1103"),
             torch_lines=_torch(("2.10", "release/2.10", "", ("7.0", "7.1"))), build_costs=_costs(rdna2=(1503, 2012))),
    _release("0.11.2b", (0, 11, 2), "v3python-sharded-db",
             commit="dd1b68b604b5258ee7a9f7b66ad95e7a82c18065", tree="d4b4bf094ce2701afd1bfb099358e8103b733f1a",
             date="2026-01-28", shipped_archs=_RDNA3_PLUS,
             torch_lines=_torch(("2.11", "release/2.11", "AMD's own ROCm/pytorch builds of 2.11 link 0.13b", ("7.x",)),
                                ("2.12", "release/2.12", "AMD's own ROCm/pytorch builds of 2.12 link 0.13b", ("7.x",)))),
    _release("0.12b", (0, 12, 0), "v3python-sharded-db",
             commit="269036897bcee4292f4e928767df1e3dd0e3c8bd", tree="35bfbd0ebe2fd774e97cdc12421592c23f59abfe",
             date="2026-05-18", shipped_archs=_RDNA3_PLUS,
             torch_lines=_torch(("2.13", "release/2.13", "0.12.1b is its ABI-compatible point release", ("7.x",)))),
    # point release of 0.12b: same layout (docs/releases.md)
    _release("0.12.1b", (0, 12, 1), "v3python-sharded-db",
             commit="8fdb4a4353f95b88c9542f5e5637efc1e1e0e530", tree="d912dfe9683287670a30fef0ba8a72ff557c5a35",
             date="2026-06-29", shipped_archs=_RDNA3_PLUS,
             build_costs=_costs(mi100=(3043, 4478), rdna2=(1559, 1696), mi50=(409, 253))),
    _release("0.13b", (0, 13, 0), "aotriton-python",
             commit="6e00ef3e335b45dfb49065259533b59c68995bfe", tree="0a9c220761603465c794bc6522564452d43ebc23",
             date="2026-07-07", shipped_archs=_RDNA3_PLUS,
             torch_lines=_torch(("2.14", "main", "PyTorch main (next: 2.14)", ("7.x",))),
             build_costs=_costs(mi100=(3043, 4269), rdna2=(1559, 2122), mi50=(409, 258))),
    # main, not a release: recognised by its layout and by the varlen API it still has (0.14b
    # replaces `VarlenType` by `VarlenBits`, pytorch#197747). Its tree id is not known (the
    # snapshot is a git archive): builds of an extract without .git need AOTRITON_GIT_TREESHA1.
    _release("0.14.0-dev", (0, 14, 0), "aotriton-modular",
             commit="30ae96716b3e7a1bf0d7892ce3b8288244f8ebec", date="2026-08-19", snapshot=True,
             shipped_archs=_RDNA3_PLUS, same_kernels_as="0.13b",   # the reuse matrix: 100 %
             markers=(("include/aotriton/flash.h", "struct AOTRITON_API VarlenType"),),
             foreign_markers=(("include/aotriton/flash.h", "VarlenBits"),)),
)

SUPPORTED: tuple[Release, ...] = tuple(r for r in RELEASES if r.supported)
SUPPORTED_RELEASES: tuple[str, ...] = tuple(r.release for r in SUPPORTED)


def by_release(name: str) -> Release:
    """The record of a release name ('0.11b', '0.14.0-dev'); KeyError otherwise. For tests and
    tools that name a release; stages receive the record from `detect`."""
    for r in RELEASES:
        if r.release == name:
            return r
    raise KeyError(name)


@dataclass(frozen=True)
class TorchLink(TorchLine):
    """One row of the torch-lines table, derived from the records: a record's `TorchLine` and the
    release it links (`aotriton`)."""

    aotriton: str = ""


def _torch_key(line: str) -> tuple[int, ...]:
    return tuple(int(x) for x in line.split("."))


TORCH_LINES: tuple[TorchLink, ...] = tuple(sorted(
    (TorchLink(t.torch, t.branch, t.note, t.rocm, aotriton=r.release) for r in RELEASES for t in r.torch_lines),
    key=lambda t: _torch_key(t.torch)))
