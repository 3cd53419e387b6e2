"""Upstream's kernel identity: the name of one compiled kernel (an *image*), parsed and printed
here only.

An image is one Triton kernel (`kernel`: attn_fwd) compiled for one functional (the tuning
database's `inputs$` values, as upstream spells them), one perf choice (the `tuned_kernel$`
values, named where the spelling names them) and one set of compiler options for one arch: an
`ImageName`. A `Spelling` parses and prints it; each release record names its own
(`codegen.upstream.releases.Release.image_names`), and every reader of a name takes it from
there: plan (the compile list), formats.aks2 (dispatch tables), the bundle rows (the packed
images). `str(spelling.parse(s)) == s` for every name of every real tree (tests/test_apply_real.py;
a third spelling: tests/test_image_names.py). The spellings so far:

- `SIG` (0.10b-0.12.1b): `<kernel>-Sig-F__<functional>__P__<perf values, _>__CO__wave<W>_warp<N>_stg<S>--Arch_<arch>`,
  the image file's stem and its name in its `.aks2` package alike.
- `ENTRY` (0.13b+): `;;#F;<functional>;;#P;<name=value;...>;;#CO;waves_per_eu=W;num_warps=N;num_stages=S;;arch=<arch>`
  in its package (an .aks2 cluster in an image zip, whose name gives the kernel); the file is
  `<kernel>-<the name's SHA-256>`.

A dispatch table's comment names a kernel as its container's path, then the name without the
part the container already says (`head`: SIG's `<kernel>-Sig-F__<functional>`, ENTRY's nothing).
A release that spells names anew adds one `Spelling` here and names it in its record.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

_INT = r"(0|[1-9][0-9]*)"          # printed back as int() prints it


@dataclass(frozen=True)
class ImageName:
    kernel: str                     # the Triton kernel (a family): 'attn_fwd'
    functional: str                 # the functional, as the spelling writes it
    perf: tuple[str, ...]           # the perf values, in upstream's order
    waves_per_eu: int
    num_warps: int
    num_stages: int
    arch: str
    spelling: "Spelling"
    perf_names: tuple[str, ...] = ()   # their names, where the spelling names them

    def __str__(self) -> str:
        """The name in its package (`Spelling.parse`'s input)."""
        return self.spelling.print(self)

    @property
    def file_stem(self) -> str:
        """The image file's name without `.hsaco`."""
        return self.spelling.file_stem(self)

    @property
    def perf_text(self) -> str:
        """The perf part as spelt (KernelEntry.perf)."""
        return self.spelling.perf_text(self)

    @property
    def named_perf(self) -> dict[str, str]:
        return dict(zip(self.perf_names, self.perf))

    def with_waves(self, w: int) -> "ImageName":
        return replace(self, waves_per_eu=w)


class Spelling:
    """How a release spells its images' names (one instance per spelling; the methods that raise
    are each spelling's). `parse` takes a name as its package holds it (`kernel`: the package's,
    for a spelling whose names leave it out) and gives None for anything it does not spell;
    `print` is its inverse, `file_stem` the image file's name; `perf_text`/`perf_of` the same for
    the perf part alone (KernelEntry.perf); `functional_dtype` (the Triton type of the
    functional's first argument, '' when none) and `functional_head_dim` read the functional."""

    label: str
    digest_files: bool = False      # the file stem is a digest of the name: parse the name, not the file

    def print(self, n: ImageName) -> str: raise NotImplementedError
    def parse(self, name: str, kernel: str = "") -> ImageName | None: raise NotImplementedError
    def head(self, kernel: str, functional: str) -> str: raise NotImplementedError
    def perf_text(self, n: ImageName) -> str: raise NotImplementedError
    def perf_of(self, text: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None: raise NotImplementedError
    def functional_dtype(self, functional: str) -> str: raise NotImplementedError
    def functional_head_dim(self, functional: str) -> int | None: raise NotImplementedError

    def file_stem(self, n: ImageName) -> str:
        return self.print(n)

    def table_tail(self, n: ImageName) -> str:
        """What a dispatch table's comment writes after the container's path."""
        return self.print(n)[len(self.head(n.kernel, n.functional)):]

    def parse_table(self, tail: str, kernel: str, functional: str) -> ImageName | None:
        """`table_tail`'s parser, given the table's kernel and functional (FUNC_NAME)."""
        n = self.parse(self.head(kernel, functional) + tail, kernel)
        return n if n is not None and (n.kernel, n.functional) == (kernel, functional) else None

    def name_of(self, kernel: str, functional: str, perf: str, co: tuple[int, int, int], arch: str) -> ImageName | None:
        """The name of a compile-list kernel from its parts (KernelEntry's functional and perf)."""
        parsed = self.perf_of(perf)
        return None if parsed is None else ImageName(kernel, functional, parsed[0], *co, arch, self, parsed[1])

    def __repr__(self) -> str:
        return f"<image names: {self.label}>"


class _Sig(Spelling):
    label = "sig (0.10b-0.12.1b)"
    _NAME = re.compile(rf"([A-Za-z0-9_]+)-Sig-F__(.*?)__P__(.*?)__CO__wave{_INT}_warp{_INT}_stg{_INT}--Arch_([A-Za-z0-9_]+)")

    def print(self, n: ImageName) -> str:
        return (f"{self.head(n.kernel, n.functional)}__P__{self.perf_text(n)}__CO__wave{n.waves_per_eu}"
                f"_warp{n.num_warps}_stg{n.num_stages}--Arch_{n.arch}")

    def head(self, kernel: str, functional: str) -> str:
        return f"{kernel}-Sig-F__{functional}"

    def perf_text(self, n: ImageName) -> str:
        return "_".join(n.perf)

    def perf_of(self, text: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (tuple(text.split("_")) if text else ()), ()

    def parse(self, name: str, kernel: str = "") -> ImageName | None:
        m = self._NAME.fullmatch(name)
        if not m:
            return None
        k, f, p, w, nw, ns, arch = m.groups()
        return self.name_of(k, f, p, (int(w), int(nw), int(ns)), arch)

    def functional_dtype(self, functional: str) -> str:
        return functional.split("_")[0].replace("＊", "*").replace("@", ":")

    def functional_head_dim(self, functional: str) -> int | None:
        toks = functional.split("_")
        return int(toks[1]) if len(toks) > 1 and toks[1].isdigit() else None


class _Entry(Spelling):
    label = "entry (0.13b+)"
    digest_files = True
    _NAME = re.compile(rf";;#F;(.*?);;#P;(.*?);;#CO;waves_per_eu={_INT};num_warps={_INT};num_stages={_INT};;arch=([A-Za-z0-9_]+)")

    def print(self, n: ImageName) -> str:
        return (f";;#F;{n.functional};;#P;{self.perf_text(n)};;#CO;waves_per_eu={n.waves_per_eu};"
                f"num_warps={n.num_warps};num_stages={n.num_stages};;arch={n.arch}")

    def head(self, kernel: str, functional: str) -> str:
        return ""

    def file_stem(self, n: ImageName) -> str:
        return f"{n.kernel}-{hashlib.sha256(self.print(n).encode()).hexdigest()}"

    def perf_text(self, n: ImageName) -> str:
        return ";".join(f"{k}={v}" for k, v in zip(n.perf_names, n.perf))

    def perf_of(self, text: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        pairs = [kv.split("=", 1) for kv in text.split(";")] if text else []
        if any(len(kv) != 2 for kv in pairs):
            return None
        return tuple(v for _, v in pairs), tuple(k for k, _ in pairs)

    def parse(self, name: str, kernel: str = "") -> ImageName | None:
        m = self._NAME.fullmatch(name)
        if not m or not kernel:
            return None
        f, p, w, nw, ns, arch = m.groups()
        return self.name_of(kernel, f, p, (int(w), int(nw), int(ns)), arch)

    def functional_dtype(self, functional: str) -> str:
        value = functional.split(";")[0].partition("=")[2]
        return value.strip("'") if value.startswith("'") else ""

    def functional_head_dim(self, functional: str) -> int | None:
        dims = [v for k, _, v in (f.partition("=") for f in functional.split(";"))
                if k in ("BLOCK_DMODEL", "D_HEAD") and v.isdigit()]
        return int(dims[0]) if dims else None


SIG = _Sig()
ENTRY = _Entry()

__all__ = ["ENTRY", "SIG", "ImageName", "Spelling"]
