"""Builds only what dispatch can reach (issue 24, item 6): the fused backward kernels whose
functional the backward op table never routes to the fused backend are left out of the build.

How, in a CMake build: upstream's CMake runs the tree's generator (`python -m v3python.generate`,
`aotriton.generate` from 0.13b) at configure time and then reads its lists. The build venv's
Python carries the compile service's client (`compile_client.py`); when `build` asks for it
(the environment knob `REACH_ENV`, the path of mi100-codegen's own interpreter), the client runs
`python -m codegen.build.reach V3SRC` after the generator has exited successfully, before CMake
reads the lists. This module then

1. reads the backward op table the generator has just written (`codegen.upstream.op_table`): that
   is the proof, per functional, and the only one used;
2. maps each fused kernel of the compile list (`Bare.compile`) to its functional through its
   Triton signature, and each image package of the cluster list (`Bare.cluster`: one line per
   functional, its kernels after the package name) to its kernels. A package is left out only
   when every one of its kernels is unreachable; anything it cannot place stays in;
3. rewrites the lists CMake reads without those kernels and packages: `Bare.compile`,
   `Bare.cluster`, and from 0.13b `Bare.flatzip` (the .aks2 members of each image zip) and each
   zip's member list (`aotriton.images/<arch>/<family>/<kernel>.nsv`: per line the .aks2 path and
   the member name, each ended by a NUL), each file whole or not at
   all; an image of a left-out package that an earlier build left in the build folder is removed;
4. records what it left out in `BUILD/mi100-codegen/reach.json` (`Reach`): `build` reports it,
   the install check (`codegen.build.verify`) does not count those packages as missing, and
   `build` removes them from the install prefix where an earlier install put them.

The generated C++ is not changed: a caller that forces the fused backend
(`attn_options.force_backend_index`) for a left-out functional finds no image and gets an error
from the launch, as upstream's own builds do for a kernel that failed to compile (docs/build.md).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from ..contain import RelPath, inside
from ..errors import UpstreamError, UserError
from ..fsutil import atomic_write, read_input
from ..models.dtypes import DTYPE_INFO
from ..plan.kernel_list import COMPILE_LIST, KernelEntry, kernel_arg_names, parse_compile_list
from ..upstream import detect
from ..upstream.op_table import FUSED_FAMILY, FUSED_FUNCTIONAL, IFACE, BwdOpTable, read_bwd_op_table
from .compile_client import REACH_ENV  # noqa: F401  (the knob; its owner is the stdlib-only client)

REACH_FILE = "mi100-codegen/reach.json"  # below the build dir
KERNEL_MODES = ("dispatched", "all")  # build --kernels
REACH_FORMAT = 2                      # of reach.json; another: the build configures again
RECORD_LIMIT = 16 << 20               # bytes: a reach record is a few kB
CLUSTER_LIST = "Bare.cluster"
FLATZIP_LIST = "Bare.flatzip"
IMAGES_DIR = "aotriton.images"
AKS2_DIR = "aks2"                     # 0.13b+: the .aks2 clusters before they are zipped
_BOOL = {"True": "true", "False": "false", "1": "true", "0": "false"}


@dataclass
class LeftOut:
    """One image package left out: `image` below aotriton.images/ (an .aks2 file, or from 0.13b
    the image zip it would be a member of), `member` (0.13b: the zip member, the functional), and
    how many kernels it would have held."""

    image: RelPath                          # checked when read (codegen.contain): hostile-input rule
    member: str | None
    kernels: int
    functional: dict[str, str] = field(default_factory=dict)  # fused_functional() of its kernels


@dataclass
class Reach:
    """`reach.json`, one typed model: validated by pydantic when read (`read_reach`, as possibly
    hostile), plain when this module makes one."""

    format: int = REACH_FORMAT              # records of the first format had no such field (read_reach)
    mode: str = "dispatched"
    proven_by: str | None = None            # the op table read, relative to the build dir
    reason: str | None = None               # why nothing was left out, when nothing was
    fused_kernels: int = 0                  # the fused backward kernels of the compile list
    kernels_left_out: int = 0
    packages_left_out: list[LeftOut] = field(default_factory=list)
    held: dict[str, str] | None = None      # the functional of one fused package kept (None: all left out)

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> dict:
        """What build --json and a bundle's manifest carry (`left_out`: the packages, for bundle
        check's forced-backend probe)."""
        return {"mode": self.mode, "proven_by": self.proven_by, "reason": self.reason,
                "fused_kernels": self.fused_kernels, "kernels_left_out": self.kernels_left_out,
                "packages_left_out": len(self.packages_left_out),
                "left_out": [asdict(p) for p in self.packages_left_out], "held": self.held}

    def left_out_packages(self) -> set[str]:
        """aks2 packages (relative to aotriton.images/, without .aks2), as dispatch tables name them."""
        return {p.image.removesuffix(".aks2") for p in self.packages_left_out if p.member is None}

    def left_out_members(self) -> set[tuple[str, str]]:
        """(image zip, member) pairs, 0.13b+."""
        return {(p.image, p.member) for p in self.packages_left_out if p.member is not None}


_RECORD = TypeAdapter(Reach)


def check_mode(kernels: str) -> None:
    """--kernels: one of KERNEL_MODES, else the one message (before any work)."""
    if kernels not in KERNEL_MODES:
        raise UserError(f"--kernels {kernels!r}: one of {', '.join(KERNEL_MODES)}")


def read_reach(build_dir: Path, rel: str = REACH_FILE) -> Reach | None:
    """What the last configure left out (None: no record, everything was built). The record is
    read as possibly hostile: a bounded regular file (codegen.fsutil.read_input), one typed model,
    every image a clean relative path (codegen.contain.RelPath)."""
    path = Path(build_dir) / rel
    if not path.exists() and not path.is_symlink():
        return None
    hint = "re-run `mi100-codegen build` with --reconfigure"
    try:
        data = json.loads(read_input(path, what="reach record", limit=RECORD_LIMIT))
    except ValueError as exc:
        raise UserError(f"{path}: unreadable ({exc})", hint=hint) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a reach record", hint=hint)
    try:
        return _RECORD.validate_python({"format": 1, **data})
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["loc"][-1:] == ("image",):
            raise UserError(f"{path}: image {err.get('input')!r} is not a path inside aotriton.images/",
                            hint=hint) from None
        raise UserError(f"{path}: not a reach record ({'.'.join(map(str, err['loc']))}: {err['msg']})",
                        hint=hint) from None


def _signature(entry: KernelEntry, tree: Path, names_cache: dict) -> dict[str, str] | None:
    """A kernel's Triton signature by argument name (None: its arguments cannot be read)."""
    key = (entry.source, entry.kernel_name)
    if key not in names_cache:
        names_cache[key] = kernel_arg_names(str(tree / entry.source), entry.kernel_name)
    names = names_cache[key]
    if names is None:
        return None
    return dict(zip(names, (v.strip() for v in entry.signature.split(","))))


def op_values(dtype: str, sig: dict[str, str], table: BwdOpTable) -> dict[str, str] | None:
    """The op table's field values of a fused kernel (its dtype's short name, its Triton signature
    by argument name, or a recorded functional), None when it cannot be placed."""
    info = DTYPE_INFO.get(dtype)
    if info is None:
        return None
    values = {}
    for name, digits, _ in table.fields:
        if name == "Q":
            values[name] = info.aotriton_enum
        elif name not in sig:
            return None
        else:
            values[name] = _BOOL.get(str(sig[name]), str(sig[name])) if "false" in digits else str(sig[name])
    return values


def fused_functional(entry: KernelEntry, sig: dict[str, str]) -> dict[str, str]:
    """The fused kernel's functional (FUSED_FUNCTIONAL) as its signature spells it, Q as the dtype's
    short name: what bundle check needs to call the backward for it."""
    return {name: entry.config.dtype if name == "Q" else sig.get(name, "") for name in FUSED_FUNCTIONAL}


def _key(field_: str, v3src: str) -> str:
    p = os.path.normpath(field_)
    return p[len(v3src) + 1:] if p.startswith(v3src + os.sep) else p


def _lines(path: Path) -> list[str]:
    return [ln for ln in path.read_text(encoding="utf-8").split("\n") if ln.strip()]


def _fused_kernels(v3src: Path, tree: Path, table: BwdOpTable) -> tuple[dict[str, dict], set[str]]:
    """(functional of each fused kernel, the ones the table never selects), by path relative to v3src."""
    names: dict = {}
    functional, never = {}, set()
    for e in parse_compile_list(v3src / COMPILE_LIST, tree, v3src):
        if e.config.family != FUSED_FAMILY:
            continue
        sig = _signature(e, tree, names)
        functional[e.hsaco] = fused_functional(e, sig or {})
        values = None if sig is None else op_values(e.config.dtype, sig, table)
        if values is not None and not table.can_pick_fused(values):
            never.add(e.hsaco)
    return functional, never


def plan_reach(v3src: Path, tree: Path) -> tuple[Reach, dict[str, bytes], list[str]]:
    """What to leave out: (the record, the rewritten lists by path relative to v3src, stale
    images below v3src to remove). Reads only; nothing is written."""
    v3src, tree = Path(v3src).resolve(), Path(tree).resolve()
    adapter = detect(tree)
    if not adapter.torch_bwd_via_op_table:
        return Reach(reason=f"with AOTriton {adapter.release} PyTorch calls the fused backward kernel itself "
                            f"(v2 attn_bwd_fused), not through the op table: every kernel is kept"), {}, []
    table = read_bwd_op_table(v3src / "flash")
    proven = f"v3src/flash/{IFACE}"
    if table is None:
        return Reach(reason="the generator wrote no backward op table: every kernel is kept"), {}, []
    if not (v3src / COMPILE_LIST).is_file() or not (v3src / CLUSTER_LIST).is_file():
        return Reach(proven_by=proven, reason="the generator wrote no kernel lists"), {}, []
    functional, never = _fused_kernels(v3src, tree, table)
    base = str(v3src)
    clusters = _lines(v3src / CLUSTER_LIST)
    drop_lines, left, drop_kernels, held = set(), [], set(), []
    for i, line in enumerate(clusters):
        f = line.split(";")
        hsacos = [_key(x, base) for x in f[4:] if x.endswith(".hsaco")]
        if len(f) < 5 or not hsacos or not all(h in never for h in hsacos):
            held += [functional[h] for h in hsacos[:1] if h in functional]
            continue
        drop_lines.add(i)
        drop_kernels.update(hsacos)
        left.append((f[0], f[1], f[2], f[3], len(hsacos), functional[hsacos[0]]))
    reach = Reach(proven_by=proven, fused_kernels=len(functional), kernels_left_out=len(drop_kernels),
                  held=min(held, key=lambda d: sorted(d.items())) if held else None)
    if not left:
        reach.reason = "the backward op table can select every fused kernel"
        return reach, {}, []
    out = {CLUSTER_LIST: "".join(ln + "\n" for i, ln in enumerate(clusters) if i not in drop_lines).encode()}
    compile_lines = _lines(v3src / COMPILE_LIST)
    out[COMPILE_LIST] = "".join(
        ln + "\n" for ln in compile_lines
        if not any(x.endswith(".hsaco") and _key(x, base) in drop_kernels for x in ln.split(";"))).encode()
    stale: list[str] = []
    if (v3src / FLATZIP_LIST).is_file():
        _plan_zips(v3src, left, reach, out, stale)
    else:
        for arch, family, kernel, name, n, func in left:
            image = f"{arch}/{family}/{kernel}/{name}.aks2"
            reach.packages_left_out.append(LeftOut(image, None, n, func))
            stale.append(f"{IMAGES_DIR}/{image}")
    return reach, out, stale


def _plan_zips(v3src: Path, left, reach: Reach, out: dict[str, bytes], stale: list[str]) -> None:
    """0.13b+: drop the left-out .aks2 clusters from each zip's inputs and member list."""
    base = str(v3src)
    gone = {f"{AKS2_DIR}/{a}/{fam}/{k}/{name}.aks2": (n, func) for a, fam, k, name, n, func in left}
    rows = []
    for line in _lines(v3src / FLATZIP_LIST):
        f = line.split(";")
        kept = [x for x in f[3:] if _key(x, base) not in gone]
        zip_rel = f"{f[0]}/{f[1]}/{f[2]}.zip"
        manifest = f"{IMAGES_DIR}/{f[0]}/{f[1]}/{f[2]}.nsv"
        if len(kept) == len(f) - 3:
            rows.append(line)
            continue
        members = []
        path = v3src / manifest
        for ml in (_lines(path) if path.is_file() else []):
            aks2, _, member = ml.partition("\0")  # NUL-separated: the .aks2 path, the member name
            if _key(aks2, base) in gone:
                reach.packages_left_out.append(LeftOut(zip_rel, member.rstrip("\0"), *gone[_key(aks2, base)]))
            else:
                members.append(ml)
        if kept:
            rows.append(";".join(f[:3] + kept))
            out[manifest] = "".join(m + "\n" for m in members).encode()
        else:  # no member left: no zip at all
            stale += [manifest, f"{IMAGES_DIR}/{zip_rel}"]
    out[FLATZIP_LIST] = "".join(r + "\n" for r in rows).encode()
    named = {p.member for p in reach.packages_left_out}
    if len(named) != len(gone):
        raise UpstreamError(f"{v3src}: {len(gone)} image packages to leave out, but the zip member lists "
                            f"name {len(named)} of them (unknown generator output)")


def dispatched_entries(entries: list, v3src: Path, tree: Path) -> tuple[list, Reach]:
    """The kernels of a generator's output (`entries` of its `v3src`) that `build --kernels
    dispatched` compiles, and the record of what it leaves out; nothing is written."""
    reach, files, _ = plan_reach(v3src, tree)
    if COMPILE_LIST not in files:
        return list(entries), reach
    kept = {os.path.basename(f)[:-len(".hsaco")] for line in files[COMPILE_LIST].decode().split("\n")
            for f in line.split(";") if f.endswith(".hsaco")}
    return [e for e in entries if e.id in kept], reach


def prune(v3src: Path, tree: Path) -> Reach:
    """Plan, then write the lists (each whole), remove stale images, record `reach.json`."""
    v3src = Path(v3src).resolve()
    reach, files, stale = plan_reach(v3src, tree)
    # every path checked (codegen.contain: names from the generator's lists) before anything is written
    writes = [(inside(v3src, rel), data) for rel, data in sorted(files.items(), key=lambda kv: kv[0] == COMPILE_LIST)]
    removals = [inside(v3src, rel, final_link=True) for rel in stale]
    for path, data in writes:   # the compile list last
        atomic_write(path, data)
    for path in removals:
        if path.is_file() or path.is_symlink():
            path.unlink()
    record = v3src.parent / REACH_FILE
    record.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(record, (json.dumps(reach.to_json(), indent=2, sort_keys=True) + "\n").encode())
    return reach


def is_current(build_dir: Path) -> bool:
    """A record of this format (else the configure that wrote it runs again)."""
    try:
        reach = read_reach(build_dir)
    except UserError:
        return False
    return reach is not None and reach.format == REACH_FORMAT


def forget(build_dir: Path) -> None:
    """A configure that builds every kernel: no record (read_reach then returns None)."""
    try:
        (Path(build_dir) / REACH_FILE).unlink()
    except FileNotFoundError:
        pass


PREFIX_RECORD = "mi100-codegen/reach.json"  # below an install prefix: what its images lack


def record_in_prefix(prefix: Path, reach: Reach | None) -> None:
    """The install prefix says what its images lack (`bundle build --images PREFIX` checks it
    again against its own op table); a build that left nothing out removes the record."""
    path = Path(prefix) / PREFIX_RECORD
    if reach is None or not reach.packages_left_out:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(reach.to_json(), indent=2, sort_keys=True) + "\n").encode())


def read_prefix_reach(prefix: Path) -> Reach | None:
    """What an install prefix's images lack (None: nothing), read as hostile (read_reach)."""
    return read_reach(Path(prefix), PREFIX_RECORD)


def confirm_left_out(reach: Reach, flash: Path) -> list[str]:
    """Each left-out package's functional checked again against the op table in `flash` (a build
    folder's generator output): the ones the table can select (a problem each)."""
    table = read_bwd_op_table(flash)
    if table is None:
        return [f"{flash}: no backward op table to check the {len(reach.packages_left_out)} left-out packages with"]
    problems = []
    for p in reach.packages_left_out:
        values = op_values(p.functional.get("Q", ""), p.functional, table)
        if values is None or table.number(values) is None or table.can_pick_fused(values):
            problems.append(f"{p.image}{' ' + p.member if p.member else ''}: the op table can select it")
    return problems


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
    """`python -m codegen.build.reach V3SRC [TREE]`, run by the generator hook (compile_client)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (1, 2):
        sys.stderr.write("usage: python -m codegen.build.reach V3SRC [TREE]\n")
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
