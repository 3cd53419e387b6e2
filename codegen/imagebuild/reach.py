"""Builds only what dispatch can reach (issue 24, item 6): the fused backward kernels whose
functional the backward op table never routes to the fused backend are left out of the build.

How, in a CMake build: upstream's CMake runs the tree's generator (`python -m v3python.generate`,
`aotriton.generate` from 0.13b) at configure time and then reads its lists. The build venv's
Python carries the compile service's client (`compile_client.py`); when `build` asks for it
(the environment knob `REACH_ENV`, the path of mi100-codegen's own interpreter), the client runs
`python -m codegen.imagebuild.reach V3SRC` (the module `build` installs it with,
`configure.REACH_MODULE`) after the generator has exited successfully, before CMake reads the lists. This module then

1. plans what to leave out (`codegen.plan.reach`: the backward op table the generator has just
   written is the proof, per functional, and the only one used; a package is left out only when
   every one of its kernels is unreachable);
2. writes the lists CMake reads without those kernels and packages, as planned
   (`codegen.formats.compile_list`: the compile list, the cluster list, from 0.13b the zip list
   and each zip's member list), each file whole or not at all; an image of a left-out package
   that an earlier build left in the build folder is removed;
3. keeps the lists it rewrites as the generator wrote them (`KEPT_DIR` below the build folder),
   and records what it left out in the reach record below the build folder (`REACH_FILE`,
   `Reach`): `build` reports it, the install check (`codegen.imagebuild.verify`) does not count
   those packages as missing, and `build` removes them from the install prefix where an earlier
   install put them.

The record is never believed: `proven_reach` computes it again from the generator's output
(`unreachable`: the kept lists, the op table, the tree's kernel sources) and refuses a record
that differs; `confirm_left_out` proves an install prefix's record the same way against the
build folder of `bundle build --images`.

The generated C++ is not changed: a caller that forces the fused backend
(`attn_options.force_backend_index`) for a left-out functional finds no image and gets an error
from the launch, as upstream's own builds do for a kernel that failed to compile (docs/build.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from codegen.core.contain import inside
from codegen.core.errors import UpstreamError, UserError
from codegen.core.fsutil import atomic_copy, atomic_write
from codegen.formats.compile_list import CLUSTER_LIST, COMPILE_LIST
from codegen.models.reach import REACH_FORMAT, LeftOut, Reach
from codegen.models.records import read_record, write_json
from codegen.plan.reach import plan_reach
from codegen.upstream.releases import IMAGES_DIR

REACH_FILE = "mi100-codegen/reach.json"  # below the build dir, and below an install prefix
KEPT_DIR = "mi100-codegen/generated"     # below the build dir: the lists prune rewrote, as the generator wrote them


def read_reach(build_dir: Path) -> Reach | None:
    """What the last configure left out (None: no record, everything was built). The record is
    read as possibly hostile (codegen.models.records.read_record: a bounded regular file, one typed
    model, every image a clean relative path)."""
    path = Path(build_dir) / REACH_FILE
    if not path.exists() and not path.is_symlink():
        return None
    return read_record(Reach, path, what="reach record",
                       hint="re-run the same mi100-codegen build command with --reconfigure", defaults={"format": 1})


def prune(v3src: Path, tree: Path) -> Reach:
    """Plan, keep the generator's lists, then write them (each whole), remove stale images, write
    the reach record."""
    v3src = Path(v3src).resolve()
    reach, files, stale = plan_reach(v3src, tree)
    _forget_kept(v3src.parent)  # an earlier configure's copies
    # every path checked (codegen.core.contain: names from the generator's lists) before anything is written
    writes = [(inside(v3src, rel), data) for rel, data in sorted(files.items(), key=lambda kv: kv[0] == COMPILE_LIST)]
    kept = [(inside(v3src, rel), inside(v3src.parent, f"{KEPT_DIR}/{rel}")) for rel in sorted(files)]
    removals = [inside(v3src, rel, final_link=True) for rel in stale]
    for src, dest in kept:      # before any list is rewritten: an interrupted run keeps the originals
        if src.is_file():
            dest.parent.mkdir(parents=True, exist_ok=True)
            atomic_copy(src, dest)
    for path, data in writes:   # the compile list last
        atomic_write(path, data)
    for path in removals:
        if path.is_file() or path.is_symlink():
            path.unlink()
    _write(v3src.parent, reach)
    return reach


def _write(folder: Path, reach: Reach) -> None:
    path = Path(folder) / REACH_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, write_json(reach))


def is_current(build_dir: Path) -> bool:
    """A record of this format (else the configure that wrote it runs again)."""
    try:
        reach = read_reach(build_dir)
    except UserError:
        return False
    return reach is not None and reach.format == REACH_FORMAT


def forget(build_dir: Path) -> None:
    """A configure that builds every kernel (or a prefix whose images lack nothing): no record
    (read_reach then returns None) and no kept lists."""
    with contextlib.suppress(FileNotFoundError):
        (Path(build_dir) / REACH_FILE).unlink()
    _forget_kept(build_dir)


def _forget_kept(build_dir: Path) -> None:
    path = inside(Path(build_dir), KEPT_DIR, final_link=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def unreachable(build_dir: Path, tree: Path) -> Reach:
    """What no dispatch table of a build folder's generator output selects, computed again
    (codegen.plan.reach.plan_reach, nothing believed): from the lists as the generator wrote them
    (the copies prune kept; without them, v3src's own lists, which then were never rewritten),
    the op table in v3src/flash and the tree's kernel sources."""
    build_dir = Path(build_dir).resolve()
    kept = inside(build_dir, KEPT_DIR)
    lists = kept if (kept / CLUSTER_LIST).is_file() else None
    return plan_reach(build_dir / "v3src", tree, lists)[0]


def _package(p: LeftOut) -> str:
    return p.image + (f" member {p.member}" if p.member else "")


def disagreement(record: Reach, proof: Reach) -> str | None:
    """How a reach record differs from the proof (`unreachable`), in words; None: it does not."""
    proven = {(p.image, p.member): p for p in proof.packages_left_out}
    listed = {(p.image, p.member): p for p in record.packages_left_out}
    extra = [p for k, p in listed.items() if proven.get(k) != p]
    if extra:
        return (f"it lists {_package(extra[0])} as left out"
                + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                + ", which the generator's output does not prove unreachable")
    lacking = [p for k, p in proven.items() if k not in listed]
    if lacking:
        return f"it does not list {_package(lacking[0])}, which the generator's output leaves out"
    mine, theirs = record.to_json(), proof.to_json()
    if mine != theirs:
        fields = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        return f"its {', '.join(fields)} differ from the generator's output"
    return None


def proven_reach(build_dir: Path, tree: Path) -> Reach | None:
    """The build folder's reach record (None: none), never believed: computed again
    (`unreachable`) and refused, one message (exit 2), where the record differs; the computed
    one is returned."""
    record = read_reach(build_dir)
    if record is None:
        return None
    proof = unreachable(build_dir, tree)
    why = disagreement(record, proof)
    if why is not None:
        raise UserError(f"{Path(build_dir) / REACH_FILE}: {why}; the record is not believed",
                        hint="re-run with --reconfigure (the generator runs again and the record is written anew)")
    return proof


def record_in_prefix(prefix: Path, reach: Reach | None) -> None:
    """The install prefix says what its images lack (`bundle build --images PREFIX` checks it
    again against its own op table); a build that left nothing out removes the record."""
    if reach is None or not reach.packages_left_out:
        forget(prefix)
    else:
        _write(prefix, reach)


def read_prefix_reach(prefix: Path) -> Reach | None:
    """What an install prefix's images lack (None: nothing), read as hostile (read_reach)."""
    return read_reach(Path(prefix))


def confirm_left_out(reach: Reach, build_dir: Path, tree: Path) -> list[str]:
    """Each package an install prefix's record says its images lack, proven again from the
    generator's output of `build_dir` (a build folder of the same tree and spec: `unreachable`):
    the ones it does not prove unreachable, as it records them, a problem each."""
    proven = {(p.image, p.member): p for p in unreachable(build_dir, tree).packages_left_out}
    return [f"{_package(p)}: the generator's output in {build_dir} does not prove it unreachable"
            for p in reach.packages_left_out if proven.get((p.image, p.member)) != p]


def remove_from_prefix(prefix: Path, reach: Reach | None) -> int:
    """Images of left-out aks2 packages an earlier install put into PREFIX/lib/aotriton.images
    (install copies the build's images folder and never deletes): removed. Zips are rebuilt whole."""
    if reach is None:
        return 0
    root = Path(prefix) / "lib" / IMAGES_DIR
    n = 0
    for p in reach.packages_left_out:
        if p.member is not None or not root.is_dir():
            continue
        path = inside(root, p.image, final_link=True)
        if path.is_file() or path.is_symlink():
            path.unlink()
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    """`python -m codegen.imagebuild.reach V3SRC [TREE]`, run by the generator hook (compile_client)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2):
        sys.stderr.write("usage: python -m codegen.imagebuild.reach V3SRC [TREE]\n")
        return 2
    v3src, tree = Path(args[0]), Path(args[1] if len(args) == 2 else os.getcwd())
    try:
        reach = prune(v3src, tree)
    except (UserError, UpstreamError) as exc:
        sys.stderr.write(f"mi100-codegen: leaving out unreachable kernels failed: {exc}\n")
        return 1
    if reach.kernels_left_out:
        print(f"mi100-codegen: left out {reach.kernels_left_out} of {reach.fused_kernels} fused backward kernels "
              f"({len(reach.packages_left_out)} image packages): the backward op table never selects them")
    else:
        print(f"mi100-codegen: every kernel kept ({reach.reason})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
