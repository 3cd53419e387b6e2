"""Upstream adapters: everything that depends on which AOTriton release a tree is.

`detect(tree)` reads the release of an AOTriton source tree and returns the adapter for it, or
raises `UnsupportedTree` (a `UserError`: exit code 2, one message) *before anything is written*.

Stable API (other stages call it; keep it compatible):

    adapter = detect(tree)          # -> Adapter (frozen)
    adapter.release                 # '0.10b', '0.11b', '0.11.1b', '0.11.2b', '0.12b', '0.12.1b' or '0.13b'
    adapter.version                 # (0, 11, 1)
    adapter.id                      # 'v3python-central-db' | 'v3python-sharded-db' | 'aotriton-python'
    adapter.layout                  # 'v3python' | 'aotriton-python' (codegen.upstream.layouts: module
                                    # path, Config import, edit paths)
    adapter.tuning_db_layout        # 'central' (0.10b, 0.11b) | 'sharded' (0.11.1b and later)
    adapter.tuning_db               # 'v3python/rules/tuning_database.sqlite3.tar.xz' (central)
                                    # or the schema-only central DB of a sharded release
    adapter.op_db                   # op-DB tarball path, None for 0.10b
    adapter.shard_root              # 'v3python/database/amd' (sharded) or None
    adapter.shard_path(arch, kernel)   # 'v3python/database/amd/gfx908/flash/attn_fwd.sqlite3.tar.xz'
    adapter.generator_module        # 'v3python.generate' / 'aotriton.generate' (run from the tree root)
    adapter.db_compose_module       # 'v3python.database_compose' (sharded) or None
    adapter.package_dir             # None: the generator's package is a folder of the tree root
                                    # (v3python/); 'python': the tree folder that is imported as
                                    # the package (0.13b: python/ -> aotriton), made importable by
                                    # `codegen.upstream.generator.importable`, never installed
    adapter.build_db_dir            # where the generator reads the DB, relative to --build_dir:
                                    # '.' (central) or 'database' (sharded)
    adapter.kernel_dir              # the Triton kernels, imported flat by tune/validate:
                                    # 'tritonsrc' or 'modules/flash/kernel' (0.13b); their
                                    # parameters, by name, in `kernel_args`
    adapter.image_format            # how an install lays out kernel images: 'aks2' (one file per
                                    # kernel) or 'zip' (0.13b: flash/<kernel>.zip per arch folder)
    adapter.required_files          # files whose presence identifies the layout
    adapter.foreign_paths           # paths whose presence means another layout (refused)

Release knowledge beside the adapter table, one module each: `layouts` (where a layout family
keeps its files), `edits` (the anchored edits as typed records), `tuning_db` (table and column
names, winner -> row), `database` (composing the DB as CMake does), `generator` (the
environment the tree's own Python tools run in), `registration` (is the target registered; may a
spec be applied to this release), `kernel_args` (importing the tree's Triton kernels and passing
their parameters by name, for tune and validate --kernels).

How detection works: the top CMakeLists.txt's `set(AOTRITON_VERSION_{MAJOR,MINOR,PATCH}_INT n)`
lines give the version (there is no `project(... VERSION ...)`); the version picks the adapter
from an explicit table; then every file the adapter relies on must exist, otherwise the tree is
"modified beyond recognition". Trees in the newer layout (0.13b and later: `python/` +
`modules/`) are refused with the list of supported releases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from .knobs import COMMIT_ENV, TREE_SHA_ENV

VERSION_RE = {
    k: re.compile(rf"^\s*set\(AOTRITON_VERSION_{k}_INT\s+(\d+)\s*\)", re.M)
    for k in ("MAJOR", "MINOR", "PATCH")
}

COMMON_FILES = (
    "CMakeLists.txt",
    "include/aotriton/util.h",
    "v3src/util.cc",
    "v3python/gpu_targets.py",
    "v3python/compile.py",
    "v3python/generate.py",
    "v3python/kernel/kdesc.py",
    "v3python/rules/flash/op_attn_fwd.py",
)


def release_name(version: tuple[int, int, int]) -> str:
    """(0, 11, 0) -> '0.11b'; (0, 11, 1) -> '0.11.1b' (upstream's tag spelling)."""
    major, minor, patch = version
    return f"{major}.{minor}b" if patch == 0 else f"{major}.{minor}.{patch}b"


@dataclass(frozen=True)
class Adapter:
    id: str
    release: str
    version: tuple[int, int, int]
    layout: str
    tuning_db_layout: str  # 'central' | 'sharded'
    tuning_db: str
    op_db: str | None
    shard_root: str | None
    generator_module: str = "v3python.generate"
    db_compose_module: str | None = None
    build_db_dir: str = "."
    required_files: tuple[str, ...] = field(default_factory=tuple)
    # Which environment knobs its CMake reads to learn the commit of a tree without .git, and the
    # tag's own commit and tree ids (github.com/ROCm/aotriton) to give them.
    commit_knobs: tuple[str, ...] = ()
    commit_ids: tuple[str, str] | None = None
    # CMake option AOTRITON_INHERIT_SYSTEM_SITE_TRITON exists (0.11b+; 0.10b always builds its
    # own Triton into its venv)
    inherits_site_triton: bool = True
    # The build compiles Triton from the third_party/triton submodule (0.10b)
    builds_own_triton: bool = False
    # The library exports aotriton::v3::flash entry points too (0.11b+)
    exports_v3_api: bool = True
    # ... and the deprecated aotriton::v2::flash::attn_fwd/attn_bwd (gone in 0.13b, whose v2
    # namespace keeps only check_gpu; PyTorch's 0.13 line calls the v3 ones)
    exports_v2_attn: bool = True
    # CMake clones ROCm/aiter at configure time (0.12b+: network needed for image builds)
    clones_aiter: bool = False
    # The oldest Clang that compiles the C++ runtime (0.12b+: lambdas capture structured bindings,
    # a C++20 feature Clang has from 16; GCC rejects its `[[deprecated]] AOTRITON_API` class
    # heads). None: GCC or any Clang (0.10b-0.11.2b, built here with both).
    min_clang: int | None = None
    package_dir: str | None = None
    kernel_dir: str = "tritonsrc"
    image_format: str = "aks2"
    foreign_paths: tuple[str, ...] = ("python/generate.py", "modules")

    def shard_path(self, arch: str, kernel: str, family: str = "flash") -> str:
        if self.shard_root is None:
            raise ValueError(f"release {self.release} has no sharded tuning database")
        return f"{self.shard_root}/{arch}/{family}/{kernel}.sqlite3.tar.xz"


# Commit and tree ids of each release tag (for trees without .git).
RELEASE_IDS: dict[tuple[int, int, int], tuple[str, str]] = {
    (0, 10, 0): ("6fca155f4deeb8d9529326f7b69f350aeeb93477", "f2c099e3dc10d6458c7c74c9e272541632743439"),
    (0, 11, 0): ("972223c501ffc22068bb035ac5d64cf54318d895", "c0bd86c32752dadf9aa64e65a3a554b7990c3d66"),
    (0, 11, 1): ("98371989e8a23267e284c94e95156a139e4b33c4", "0b316c47ac37c46065bb72f66e4f4b7200e29517"),
    (0, 11, 2): ("dd1b68b604b5258ee7a9f7b66ad95e7a82c18065", "d4b4bf094ce2701afd1bfb099358e8103b733f1a"),
    (0, 12, 0): ("269036897bcee4292f4e928767df1e3dd0e3c8bd", "35bfbd0ebe2fd774e97cdc12421592c23f59abfe"),
    (0, 12, 1): ("8fdb4a4353f95b88c9542f5e5637efc1e1e0e530", "d912dfe9683287670a30fef0ba8a72ff557c5a35"),
    (0, 13, 0): ("6e00ef3e335b45dfb49065259533b59c68995bfe", "0a9c220761603465c794bc6522564452d43ebc23"),
}


def _commit_knobs(version: tuple[int, int, int]) -> tuple[str, ...]:
    """0.10b reads no commit knob (always `git log`); 0.11b+ the commit (fatal when missing
    from 0.11.1b); 0.12b+ also the tree id (fatal when missing)."""
    if version < (0, 11, 0):
        return ()
    return (COMMIT_ENV,) if version < (0, 12, 0) else (COMMIT_ENV, TREE_SHA_ENV)


def _central(version: tuple[int, int, int], op_db: bool) -> Adapter:
    tdb = "v3python/rules/tuning_database.sqlite3.tar.xz"
    odb = "v3python/rules/op_database.sqlite3.tar.xz" if op_db else None
    return Adapter(
        id="v3python-central-db", release=release_name(version), version=version,
        layout="v3python", tuning_db_layout="central", tuning_db=tdb, op_db=odb, shard_root=None,
        build_db_dir=".",
        required_files=COMMON_FILES + (tdb,) + ((odb,) if odb else ()),
        commit_knobs=_commit_knobs(version), commit_ids=RELEASE_IDS.get(version),
        inherits_site_triton=version >= (0, 11, 0), builds_own_triton=version < (0, 11, 0),
        exports_v3_api=version >= (0, 11, 0),
    )


def _sharded(version: tuple[int, int, int]) -> Adapter:
    tdb = "v3python/database/tuning_database.sqlite3.tar.xz"
    odb = "v3python/database/op_database.sqlite3.tar.xz"
    return Adapter(
        id="v3python-sharded-db", release=release_name(version), version=version,
        layout="v3python", tuning_db_layout="sharded", tuning_db=tdb, op_db=odb,
        shard_root="v3python/database/amd", db_compose_module="v3python.database_compose",
        build_db_dir="database",
        required_files=COMMON_FILES + (tdb, odb, "v3python/database_compose.py"),
        commit_knobs=_commit_knobs(version), commit_ids=RELEASE_IDS.get(version),
        clones_aiter=version >= (0, 12, 0),
        min_clang=16 if version >= (0, 12, 0) else None,
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


def _python_pkg(version: tuple[int, int, int]) -> Adapter:
    """0.13b: the generator is the package `aotriton` (source python/), kernels and rules under
    modules/, per-arch DB shards under modules/database/amd (docs/releases.md, data sheet)."""
    tdb = "modules/database/tuning_database.sqlite3.tar.xz"
    odb = "modules/database/op_database.sqlite3.tar.xz"
    return Adapter(
        id="aotriton-python", release=release_name(version), version=version,
        layout="aotriton-python", tuning_db_layout="sharded", tuning_db=tdb, op_db=odb,
        shard_root="modules/database/amd", generator_module="aotriton.generate",
        db_compose_module="aotriton.database_compose", build_db_dir="database",
        required_files=PYTHON_FILES + (tdb, odb), package_dir="python", kernel_dir="modules/flash/kernel",
        image_format="zip", exports_v2_attn=False,
        foreign_paths=("v3python/generate.py",),
        commit_knobs=_commit_knobs(version), commit_ids=RELEASE_IDS.get(version),
        clones_aiter=True,
        min_clang=16,
    )


# The explicit table: version -> adapter. Nothing is guessed for versions not listed here.
ADAPTERS: dict[tuple[int, int, int], Adapter] = {
    (0, 10, 0): _central((0, 10, 0), op_db=False),
    (0, 11, 0): _central((0, 11, 0), op_db=True),
    (0, 11, 1): _sharded((0, 11, 1)),
    (0, 11, 2): _sharded((0, 11, 2)),
    (0, 12, 0): _sharded((0, 12, 0)),
    (0, 12, 1): _sharded((0, 12, 1)),  # point release of 0.12b: same layout (docs/releases.md)
    (0, 13, 0): _python_pkg((0, 13, 0)),
}
SUPPORTED_RELEASES: tuple[str, ...] = tuple(a.release for a in ADAPTERS.values())


def by_release(tag: str) -> Adapter:
    """The adapter of a supported release tag ('0.11b'); KeyError otherwise."""
    for a in ADAPTERS.values():
        if a.release == tag:
            return a
    raise KeyError(tag)


class UnsupportedTree(UserError):
    """A tree that is not one of the supported AOTriton releases (or not recognisable)."""


def read_version(tree: Path) -> tuple[int, int, int] | None:
    cm = Path(tree) / "CMakeLists.txt"
    try:
        text = cm.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = []
    for k in ("MAJOR", "MINOR", "PATCH"):
        hits = VERSION_RE[k].findall(text)
        if len(hits) != 1:
            return None
        found.append(int(hits[0]))
    return (found[0], found[1], found[2])


def _supported() -> str:
    return ", ".join(SUPPORTED_RELEASES)


def detect(tree: Path | str) -> Adapter:
    """Detect the AOTriton release of `tree` and return its adapter.

    Raises UnsupportedTree (exit 2) for: a path that is not a directory; a tree without the
    three CMake version lines; a release not in the table; a known version whose expected files
    are missing or that holds files of another layout. Reads only; never writes."""
    root = Path(tree)
    if not root.is_dir():
        raise UnsupportedTree(f"{tree}: not a directory")
    version = read_version(root)
    if version is None:
        raise UnsupportedTree(
            f"{tree}: not an AOTriton source tree (no AOTRITON_VERSION_{{MAJOR,MINOR,PATCH}}_INT "
            f"in CMakeLists.txt); supported releases: {_supported()}"
        )
    rel = release_name(version)
    adapter = ADAPTERS.get(version)
    if adapter is None:
        raise UnsupportedTree(f"{tree}: AOTriton {rel} is not supported; supported releases: {_supported()}")
    missing = [p for p in adapter.required_files if not (root / p).is_file()]
    missing += [f"(has {p}: another layout)" for p in adapter.foreign_paths if (root / p).exists()]
    if missing:
        raise UnsupportedTree(
            f"{tree}: says AOTriton {rel} but does not look like it (missing: {', '.join(missing)}); "
            f"modified beyond recognition?"
        )
    return adapter


KERNEL_DIRS: tuple[str, ...] = tuple(dict.fromkeys(a.kernel_dir for a in ADAPTERS.values()))


def kernel_source_dir(tree: Path | str) -> Path | None:
    """The folder of the tree's Triton kernels (tune and validate import them flat from there):
    the detected release's `kernel_dir`; for a tree `detect` refuses (e.g. a bare kernel
    checkout), the first known kernel folder that holds flash.py; None when there is none."""
    root = Path(tree)
    try:
        return root / detect(root).kernel_dir
    except UnsupportedTree:
        pass
    return next((root / d for d in KERNEL_DIRS if (root / d / "flash.py").is_file()), None)


def kernel_dirs_text() -> str:
    """'tritonsrc/flash.py nor modules/flash/kernel/flash.py', for messages."""
    return " nor ".join(f"{d}/flash.py" for d in KERNEL_DIRS)


__all__ = ["ADAPTERS", "Adapter", "KERNEL_DIRS", "RELEASE_IDS", "SUPPORTED_RELEASES", "UnsupportedTree", "by_release",
           "detect", "kernel_dirs_text", "kernel_source_dir", "read_version", "release_name"]


def parse_constexpr(text: str):
    """A constant from a kernel signature of upstream's compile list ('64', '0.5', 'True'),
    or None when the entry is not a constant (e.g. '*fp16:16')."""
    text = text.strip()
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text)
