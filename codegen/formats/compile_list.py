"""The lists upstream's generator writes for CMake into the build folder's `v3src/`: their names,
their line formats, and the whole-file rewrites that leave kernels and image packages out.

- the compile list (`Bare.compile`): one line per GPU kernel, `[venv_name;python;]` (0.12b) then
  `hsaco;source;kernel_name;num_warps;num_stages;waves_per_eu;arch;signature`; CMake turns each
  line into one compiler invocation;
- the cluster list (`Bare.cluster`): one line per image package, `arch;family;kernel;package`
  then the `.hsaco` files of its kernels;
- the zip list (`Bare.flatzip`, 0.13b+): one line per image zip, `arch;family;kernel` then the
  `.aks2` clusters (below `aks2/`) that become its members;
- each zip's member list (`<images>/<arch>/<family>/<kernel>.nsv`): per line the `.aks2` path
  and the member name, each ended by a NUL; each cluster's entry list (0.13b+, beside the cluster:
  `aks2/.../<package>.nsv`) the same for the `.hsaco` files and their names in the cluster.

`image_refs` says where the runtime finds each listed kernel in the installed images (the package,
the zip member, the name), as `codegen.formats.aks2` spells a dispatch table's reference.

Paths in the lists are absolute; `rel` makes them relative to the build folder they lie in.
Rewrites keep every other line byte for byte; they return bytes and write nothing. The readers
take the folder the lists are read from (`lists`, default v3src itself) apart from v3src, the
folder their paths lie in: `codegen.imagebuild.reach` plans again from the generator's lists as
it wrote them, kept beside the build folder's rewritten ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from codegen.core.errors import UpstreamError
from codegen.formats.aks2 import KernelRef, ZipRef
from codegen.upstream.releases import IMAGES_DIR

COMPILE_LIST = "Bare.compile"
CLUSTER_LIST = "Bare.cluster"
FLATZIP_LIST = "Bare.flatzip"
AKS2_DIR = "aks2"                     # 0.13b+: the .aks2 clusters before they are zipped
IMAGE_SUFFIX = ".hsaco"
_COMPILE_FIELDS = 8                   # from the image on


@dataclass(frozen=True)
class CompileLine:
    """One kernel of the compile list, its fields as the generator wrote them."""

    hsaco: str
    source: str
    kernel_name: str
    num_warps: int
    num_stages: int
    waves_per_eu: int
    arch: str
    signature: str


@dataclass(frozen=True)
class Cluster:
    """One line of the cluster list: an image package and its kernels (relative to v3src)."""

    line: str
    arch: str
    family: str
    kernel: str
    package: str
    images: tuple[str, ...]

    @property
    def aks2(self) -> str:
        """The package below the images folder: `<arch>/<family>/<kernel>/<package>.aks2`."""
        return f"{self.arch}/{self.family}/{self.kernel}/{self.package}.aks2"

    @property
    def cluster_file(self) -> str:
        """0.13b+: the package as the zip list names it before zipping, relative to v3src."""
        return f"{AKS2_DIR}/{self.aks2}"


@dataclass(frozen=True)
class ZipRewrite:
    """The zip list and member lists without some clusters: `files` by path relative to v3src,
    `stale` files of zips left with no member, `dropped` (zip below the images folder, member,
    cluster relative to v3src) in list order."""

    files: dict[str, bytes]
    stale: list[str]
    dropped: list[tuple[str, str, str]]


def rel(path: str, base: str | Path) -> str:
    """`path` relative to `base` when inside it, POSIX-spelled (string work: thousands of lines)."""
    p, prefix = os.path.normpath(path), str(base).rstrip(os.sep) + os.sep
    if p.startswith(prefix):
        p = p[len(prefix):]
    return p.replace(os.sep, "/")


def read_lines(path: Path) -> list[str]:
    """The non-blank lines of a list, each as written (what a rewrite keeps)."""
    return [ln for ln in Path(path).read_text(encoding="utf-8").split("\n") if ln.strip()]


def _text(lines) -> bytes:
    return "".join(ln + "\n" for ln in lines).encode()


def images_of(line: str) -> list[str]:
    """The `.hsaco` fields of a line of the compile or cluster list."""
    return [f for f in line.split(";") if f.endswith(IMAGE_SUFFIX)]


def parse_compile_line(line: str) -> CompileLine | None:
    """A compile-list line -> its fields (the 0.12b prefix dropped); None when it is not one."""
    fields = line.split(";")
    hs = next((i for i, f in enumerate(fields) if f.endswith(IMAGE_SUFFIX)), None)
    if hs is None or len(fields) - hs != _COMPILE_FIELDS:
        return None
    hsaco, src, kname, warps, stages, wpe, arch, sig = fields[hs:]
    try:
        return CompileLine(hsaco, src, kname, int(warps), int(stages), int(wpe), arch, sig)
    except ValueError:
        return None


def read_compile_list(path: Path) -> list[tuple[int, CompileLine]]:
    """Every kernel of a compile list with its line number; UpstreamError on a line that is not one."""
    out = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        parsed = parse_compile_line(line)
        if parsed is None:
            raise UpstreamError(f"{path}:{lineno}: unexpected compile-list line ({len(line.split(';'))} fields)")
        out.append((lineno, parsed))
    return out


def image_names(data: bytes) -> set[str]:
    """The image names (file names without .hsaco) a compile list's bytes name."""
    return {os.path.basename(f)[:-len(IMAGE_SUFFIX)] for line in data.decode().split("\n") for f in images_of(line)}


def count_compiled(v3src: Path) -> tuple[int | None, int | None]:
    """(kernels in the compile list, how many of them are already compiled); (None, None)
    without a list."""
    lst = Path(v3src) / COMPILE_LIST
    if not lst.is_file():
        return None, None
    total = done = 0
    for line in lst.read_text(encoding="utf-8", errors="replace").splitlines():
        hsaco = next(iter(images_of(line)), None)
        if hsaco is None:
            continue
        total += 1
        p = Path(hsaco)
        if p.is_file() and p.stat().st_size > 0:
            done += 1
    return total, done


def read_clusters(v3src: Path, lists: Path | None = None) -> list[Cluster]:
    """The cluster list (read from `lists`, default v3src), one entry per line, kernels relative
    to v3src (a line without kernels has none)."""
    base = str(v3src)
    out = []
    for line in read_lines(Path(lists or v3src) / CLUSTER_LIST):
        f = line.split(";")
        head = (f + ["", "", "", ""])[:4]
        out.append(Cluster(line, *head, tuple(rel(x, base) for x in f[4:] if x.endswith(IMAGE_SUFFIX))))
    return out


def clusters_without(clusters: list[Cluster], dropped: set[int]) -> bytes:
    """The cluster list without the lines at `dropped`."""
    return _text(c.line for i, c in enumerate(clusters) if i not in dropped)


def compile_list_without(v3src: Path, images: set[str], lists: Path | None = None) -> bytes:
    """The compile list without the kernels whose image (relative to v3src) is in `images`."""
    base = str(v3src)
    return _text(ln for ln in read_lines(Path(lists or v3src) / COMPILE_LIST)
                 if not any(rel(x, base) in images for x in images_of(ln)))


def member_list(arch: str, family: str, kernel: str) -> str:
    """An image zip's member list, relative to v3src."""
    return f"{IMAGES_DIR}/{arch}/{family}/{kernel}.nsv"


def zips_without(v3src: Path, clusters: set[str], lists: Path | None = None) -> ZipRewrite:
    """The zip list and each affected zip's member list without `clusters` (paths relative to
    v3src, below AKS2_DIR); a zip left with no member goes (its member list and zip are stale)."""
    base = str(v3src)
    rows, files, stale, dropped = [], {}, [], []
    for line in read_lines(Path(lists or v3src) / FLATZIP_LIST):
        f = line.split(";")
        kept = [x for x in f[3:] if rel(x, base) not in clusters]
        if len(kept) == len(f) - 3:
            rows.append(line)
            continue
        zip_rel, members = f"{f[0]}/{f[1]}/{f[2]}.zip", []
        listing = member_list(f[0], f[1], f[2])
        path = Path(lists or v3src) / listing
        for ml in (read_lines(path) if path.is_file() else []):
            aks2, _, member = ml.partition("\0")
            if rel(aks2, base) in clusters:
                dropped.append((zip_rel, member.rstrip("\0"), rel(aks2, base)))
            else:
                members.append(ml)
        if kept:
            rows.append(";".join(f[:3] + kept))
            files[listing] = _text(members)
        else:  # no member left: no zip at all
            stale += [listing, f"{IMAGES_DIR}/{zip_rel}"]
    files[FLATZIP_LIST] = _text(rows)
    return ZipRewrite(files, stale, dropped)


def _nul_pairs(path: Path, base: str) -> dict[str, str]:
    """A NUL-separated list (a member or entry list): first field relative to `base` -> second."""
    out = {}
    for line in read_lines(path) if path.is_file() else []:
        first, _, second = line.partition("\0")
        out[rel(first, base)] = second.rstrip("\0")
    return out


def entry_names(v3src: Path) -> dict[str, str]:
    """0.13b+: every image's name in its cluster, from the clusters' entry lists (`aks2/**/*.nsv`),
    by its `.hsaco` relative to v3src."""
    out: dict[str, str] = {}
    for nsv in sorted((Path(v3src) / AKS2_DIR).rglob("*.nsv")):
        out.update(_nul_pairs(nsv, str(v3src)))
    return out


def image_refs(v3src: Path) -> dict[str, KernelRef | ZipRef]:
    """Where each kernel of the cluster list lies in the installed images, by its `.hsaco` relative
    to v3src: up to 0.12.1b in the `.aks2` package of its cluster under its file name's stem; from
    0.13b in the image zip whose zip list names its cluster, as the member the zip's member list
    names, under the name the cluster's entry list gives it. A kernel whose cluster no zip holds,
    or that its entry list does not name, has none."""
    base = str(v3src)
    clusters = read_clusters(v3src)
    if not (Path(v3src) / FLATZIP_LIST).is_file():
        return {h: KernelRef(c.aks2.removesuffix(".aks2"), os.path.basename(h).removesuffix(IMAGE_SUFFIX))
                for c in clusters for h in c.images}
    where: dict[str, tuple[str, str]] = {}   # cluster relative to v3src -> (image zip, member)
    for line in read_lines(Path(v3src) / FLATZIP_LIST):
        f = line.split(";")
        zip_rel = f"{f[0]}/{f[1]}/{f[2]}.zip"
        for cluster, member in _nul_pairs(Path(v3src) / member_list(*f[:3]), base).items():
            where[cluster] = (zip_rel, member)
    names = entry_names(v3src)
    return {h: ZipRef(*where[c.cluster_file], names[h]) for c in clusters if c.cluster_file in where
            for h in c.images if h in names}
