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
3. the lists CMake reads are planned without those kernels and packages: the compile list, the
   cluster list, and from 0.13b the zip list (the .aks2 members of each image zip) and each
   zip's member list (per line the .aks2 path and the member name, each ended by a NUL).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from codegen.core.contain import Escape
from codegen.core.errors import UpstreamError, UserError
from codegen.models.dtypes import DTYPE_INFO
from codegen.models.reach import KERNEL_MODES, LeftOut, Reach
from codegen.models.records import describe
from codegen.plan.kernel_list import COMPILE_LIST, KernelEntry, kernel_arg_names, parse_compile_list
from codegen.upstream import detect
from codegen.upstream.releases import IMAGES_DIR
from codegen.formats.op_table import FUSED_FAMILY, FUSED_FUNCTIONAL, IFACE, BwdOpTable, read_bwd_op_table

CLUSTER_LIST = "Bare.cluster"
FLATZIP_LIST = "Bare.flatzip"
AKS2_DIR = "aks2"                     # 0.13b+: the .aks2 clusters before they are zipped
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
    counts = dict(proven_by=proven, fused_kernels=len(functional), kernels_left_out=len(drop_kernels),
                  held=min(held, key=lambda d: sorted(d.items())) if held else None)
    if not left:
        return Reach(reason="the backward op table can select every fused kernel", **counts), {}, []
    out = {CLUSTER_LIST: "".join(ln + "\n" for i, ln in enumerate(clusters) if i not in drop_lines).encode()}
    compile_lines = _lines(v3src / COMPILE_LIST)
    out[COMPILE_LIST] = "".join(
        ln + "\n" for ln in compile_lines
        if not any(x.endswith(".hsaco") and _key(x, base) in drop_kernels for x in ln.split(";"))).encode()
    stale: list[str] = []
    packages: list[LeftOut] = []
    if (v3src / FLATZIP_LIST).is_file():
        _plan_zips(v3src, left, packages, out, stale)
    else:
        for arch, family, kernel, name, n, func in left:
            image = f"{arch}/{family}/{kernel}/{name}.aks2"
            packages.append(_left_out(v3src, image, None, n, func))
            stale.append(f"{IMAGES_DIR}/{image}")
    return Reach(packages_left_out=packages, **counts), out, stale


def _left_out(v3src: Path, image: str, member: str | None, kernels: int, functional: dict) -> LeftOut:
    try:
        return LeftOut(image=image, member=member, kernels=kernels, functional=functional)
    except ValidationError as exc:   # a path out of the images folder (the containment rule), or a huge name
        raise Escape(f"{v3src}: the generator's lists name an image package the reach record cannot hold "
                     f"({describe(exc.errors()[0])})") from None


def _plan_zips(v3src: Path, left, packages: list[LeftOut], out: dict[str, bytes], stale: list[str]) -> None:
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
                n, func = gone[_key(aks2, base)]
                packages.append(_left_out(v3src, zip_rel, member.rstrip("\0"), n, func))
            else:
                members.append(ml)
        if kept:
            rows.append(";".join(f[:3] + kept))
            out[manifest] = "".join(m + "\n" for m in members).encode()
        else:  # no member left: no zip at all
            stale += [manifest, f"{IMAGES_DIR}/{zip_rel}"]
    out[FLATZIP_LIST] = "".join(r + "\n" for r in rows).encode()
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
    kept = {os.path.basename(f)[:-len(".hsaco")] for line in files[COMPILE_LIST].decode().split("\n")
            for f in line.split(";") if f.endswith(".hsaco")}
    return [e for e in entries if e.id in kept], reach
