"""What dispatch can reach: which fused backward kernels of a generator's output the backward
op table never selects, computed from the generated tables alone (a pure function over
`codegen.formats`; nothing is written). `build --kernels dispatched` leaves those out
(`codegen.imagebuild.reach` rewrites the lists CMake reads); `plan`/`precompile --kernels
dispatched` list the same kernels (`dispatched_entries`).

1. the backward op table the generator wrote (`codegen.formats.op_table`) is the proof, per
   functional, and the only one used;
2. each fused kernel of the compile list is placed on its functional through its Triton
   signature, and each image package of the cluster list (one line per functional, its kernels
   after the package name) on its kernels. A package is left out only when every one of its
   kernels is unreachable; anything that cannot be placed stays in;
3. the lists CMake reads (`codegen.formats.compile_list`) are planned without those kernels and
   packages: the compile list, the cluster list, and from 0.13b the zip list and each zip's
   member list.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from codegen.core.contain import Escape
from codegen.core.errors import UpstreamError, UserError
from codegen.models.dtypes import DTYPE_INFO
from codegen.models.image_name import Spelling
from codegen.models.reach import KERNEL_MODES, LeftOut, Reach
from codegen.models.records import describe
from codegen.formats.compile_list import (CLUSTER_LIST, COMPILE_LIST, FLATZIP_LIST, Cluster,
                                          clusters_without, compile_list_without, image_names, read_clusters,
                                          zips_without)
from codegen.formats.op_table import FUSED_FAMILY, FUSED_FUNCTIONAL, IFACE, BwdOpTable, read_bwd_op_table
from codegen.plan.kernel_list import KernelEntry, kernel_arg_names, parse_compile_list
from codegen.upstream import detect
from codegen.upstream.releases import IMAGES_DIR

_BOOL = {"True": "true", "False": "false", "1": "true", "0": "false"}


def check_mode(kernels: str) -> None:
    """--kernels: one of KERNEL_MODES, else the one message (before any work)."""
    if kernels not in KERNEL_MODES:
        raise UserError(f"--kernels {kernels!r}: one of {', '.join(KERNEL_MODES)}")


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


def _fused_kernels(v3src: Path, lists: Path, tree: Path, table: BwdOpTable, spelling: Spelling
                   ) -> tuple[dict[str, dict], set[str]]:
    """(functional of each fused kernel, the ones the table never selects), by path relative to v3src."""
    names: dict = {}
    functional, never = {}, set()
    for e in parse_compile_list(lists / COMPILE_LIST, tree, v3src, spelling):
        if e.config.family != FUSED_FAMILY:
            continue
        sig = _signature(e, tree, names)
        functional[e.hsaco] = fused_functional(e, sig or {})
        values = None if sig is None else op_values(e.config.dtype, sig, table)
        if values is not None and not table.can_pick_fused(values):
            never.add(e.hsaco)
    return functional, never


def plan_reach(v3src: Path, tree: Path, lists: Path | None = None) -> tuple[Reach, dict[str, bytes], list[str]]:
    """What to leave out: (the record, the rewritten lists by path relative to v3src, stale
    images below v3src to remove). `lists`: the folder the generator's lists are read from (default
    v3src; codegen.imagebuild.reach proves a record from the copies it kept). Reads only."""
    v3src, tree = Path(v3src).resolve(), Path(tree).resolve()
    lists = Path(lists).resolve() if lists is not None else v3src
    adapter = detect(tree)
    if not adapter.torch_bwd_via_op_table:
        return Reach(reason=f"with AOTriton {adapter.release} PyTorch calls the fused backward kernel itself "
                            f"(v2 attn_bwd_fused), not through the op table: every kernel is kept"), {}, []
    table = read_bwd_op_table(v3src / "flash")
    proven = f"v3src/flash/{IFACE}"
    if table is None:
        return Reach(reason="the generator wrote no backward op table: every kernel is kept"), {}, []
    if not (lists / COMPILE_LIST).is_file() or not (lists / CLUSTER_LIST).is_file():
        return Reach(proven_by=proven, reason="the generator wrote no kernel lists"), {}, []
    functional, never = _fused_kernels(v3src, lists, tree, table, adapter.image_names)
    clusters = read_clusters(v3src, lists)
    drop_lines, left, drop_kernels, held = set(), [], set(), []
    for i, c in enumerate(clusters):
        if not c.images or not all(h in never for h in c.images):
            held += [functional[h] for h in c.images[:1] if h in functional]
            continue
        drop_lines.add(i)
        drop_kernels.update(c.images)
        left.append(c)
    counts = dict(proven_by=proven, fused_kernels=len(functional), kernels_left_out=len(drop_kernels),
                  held=min(held, key=lambda d: sorted(d.items())) if held else None)
    if not left:
        return Reach(reason="the backward op table can select every fused kernel", **counts), {}, []
    out = {CLUSTER_LIST: clusters_without(clusters, drop_lines),
           COMPILE_LIST: compile_list_without(v3src, drop_kernels, lists)}
    stale: list[str] = []
    packages: list[LeftOut] = []
    if (lists / FLATZIP_LIST).is_file():
        _plan_zips(v3src, lists, left, functional, packages, out, stale)
    else:
        for c in left:
            packages.append(_left_out(v3src, c.aks2, None, len(c.images), functional[c.images[0]]))
            stale.append(f"{IMAGES_DIR}/{c.aks2}")
    return Reach(packages_left_out=packages, **counts), out, stale


def _left_out(v3src: Path, image: str, member: str | None, kernels: int, functional: dict) -> LeftOut:
    try:
        return LeftOut(image=image, member=member, kernels=kernels, functional=functional)
    except ValidationError as exc:   # a path out of the images folder (the containment rule), or a huge name
        raise Escape(f"{v3src}: the generator's lists name an image package the reach record cannot hold "
                     f"({describe(exc.errors()[0])})") from None


def _plan_zips(v3src: Path, lists: Path, left: list[Cluster], functional: dict[str, dict],
               packages: list[LeftOut], out: dict[str, bytes], stale: list[str]) -> None:
    """0.13b+: drop the left-out .aks2 clusters from each zip's inputs and member list."""
    gone = {c.cluster_file: (len(c.images), functional[c.images[0]]) for c in left}
    rewrite = zips_without(v3src, set(gone), lists)
    for zip_rel, member, cluster in rewrite.dropped:
        packages.append(_left_out(v3src, zip_rel, member, *gone[cluster]))
    out.update(rewrite.files)
    stale += rewrite.stale
    named = {p.member for p in packages}
    if len(named) != len(gone):
        raise UpstreamError(f"{v3src}: {len(gone)} image packages to leave out, but the zip member lists "
                            f"name {len(named)} of them (unknown generator output)")


def dispatched_entries(entries: list, v3src: Path, tree: Path) -> tuple[list, Reach]:
    """The kernels of a generator's output (`entries` of its `v3src`) that `build --kernels
    dispatched` compiles, and the record of what it leaves out; nothing is written."""
    reach, files, _ = plan_reach(v3src, tree)
    if COMPILE_LIST not in files:
        return list(entries), reach
    kept = image_names(files[COMPILE_LIST])
    return [e for e in entries if e.id in kept], reach
