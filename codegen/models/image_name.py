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

- `SIG` (0.10b-0.12.1b): the image file's stem and its name in its `.aks2` package alike.
- `ENTRY` (0.13b+): the name in its package (an .aks2 cluster in an image zip, whose name gives
  the kernel); the file is `<kernel>-<the name's SHA-256>`.

A dispatch table's comment names a kernel as its container's path, then the name without the
part the container already says (`head`). A release that spells names anew adds one `Spelling`
here and names it in its record.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace

_FIELD = re.compile(r"\{(\w+)\}")
_GROUP = {"kernel": r"[A-Za-z0-9_]+", "arch": r"[A-Za-z0-9_]+", "functional": r".*?", "perf": r".*?",
          "waves_per_eu": r"0|[1-9][0-9]*", "num_warps": r"0|[1-9][0-9]*", "num_stages": r"0|[1-9][0-9]*"}


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
        s = self.spelling
        return f"{self.kernel}-{hashlib.sha256(str(self).encode()).hexdigest()}" if s.digest_files else str(self)

    @property
    def perf_text(self) -> str:
        """The perf part as spelt (KernelEntry.perf)."""
        sep = self.spelling.sep
        return sep.join(f"{k}={v}" for k, v in zip(self.perf_names, self.perf)) if self.spelling.named else sep.join(self.perf)

    @property
    def named_perf(self) -> dict[str, str]:
        return dict(zip(self.perf_names, self.perf))

    def with_waves(self, w: int) -> "ImageName":
        return replace(self, waves_per_eu=w)


@dataclass(frozen=True)
class Spelling:
    """How a release spells its images' names: `template`, whose fields are ImageName's (`perf`:
    its values joined by `sep`, each `name=value` where `named`, as the functional's fields are
    then); a template without `{kernel}` leaves it to the package. `head`: the part of a name a
    dispatch table's comment leaves to its container's path. `digest_files`: the image file is
    named by the name's SHA-256."""

    label: str
    template: str
    head: str = ""
    sep: str = "_"
    named: bool = False
    digest_files: bool = False
    _re: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        parts = _FIELD.split(self.template)   # literal, field, literal, field, ...
        pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_GROUP[p]})" for i, p in enumerate(parts))
        object.__setattr__(self, "_re", re.compile(pattern))

    def print(self, n: ImageName) -> str:
        return self.template.format(kernel=n.kernel, functional=n.functional, perf=n.perf_text, arch=n.arch,
                                    waves_per_eu=n.waves_per_eu, num_warps=n.num_warps, num_stages=n.num_stages)

    def parse(self, name: str, kernel: str = "") -> ImageName | None:
        """A name as its package holds it -> ImageName; None for anything this spelling does not
        spell (`kernel`: the package's, for a template without it)."""
        m = self._re.fullmatch(name)
        if m is None or not m.groupdict().get("kernel", kernel):
            return None
        return self.name_of(m.groupdict().get("kernel", kernel), m["functional"], m["perf"],
                            (int(m["waves_per_eu"]), int(m["num_warps"]), int(m["num_stages"])), m["arch"])

    def name_of(self, kernel: str, functional: str, perf: str, co: tuple[int, int, int], arch: str) -> ImageName | None:
        """The name of a compile-list kernel from its parts (KernelEntry's functional and perf)."""
        values = perf.split(self.sep) if perf else []
        pairs = [v.split("=", 1) for v in values] if self.named else [("", v) for v in values]
        if any(len(kv) != 2 for kv in pairs):
            return None
        names = tuple(k for k, _ in pairs) if self.named else ()
        return ImageName(kernel, functional, tuple(v for _, v in pairs), *co, arch, self, names)

    def table_tail(self, n: ImageName) -> str:
        """What a dispatch table's comment writes after the container's path."""
        return str(n)[len(self.head.format(kernel=n.kernel, functional=n.functional)):]

    def parse_table(self, tail: str, kernel: str, functional: str) -> ImageName | None:
        """`table_tail`'s parser, given the table's kernel and functional (FUNC_NAME)."""
        n = self.parse(self.head.format(kernel=kernel, functional=functional) + tail, kernel)
        return n if n is not None and (n.kernel, n.functional) == (kernel, functional) else None

    def functional_dtype(self, functional: str) -> str:
        """The Triton type of the functional's first argument ('*fp16:16'), '' when it names none."""
        first = functional.split(self.sep)[0]
        if self.named:
            first = first.partition("=")[2]
            return first.strip("'") if first.startswith("'") else ""
        return first.replace("＊", "*").replace("@", ":")   # how the compact signature spells '*' and ':'

    def functional_head_dim(self, functional: str) -> int | None:
        fields = functional.split(self.sep)
        if self.named:
            fields = [v for k, _, v in (f.partition("=") for f in fields) if k in ("BLOCK_DMODEL", "D_HEAD")]
        else:
            fields = fields[1:2]
        return int(fields[0]) if fields and fields[0].isdigit() else None


SIG = Spelling("sig (0.10b-0.12.1b)",
               "{kernel}-Sig-F__{functional}__P__{perf}__CO__wave{waves_per_eu}_warp{num_warps}_stg{num_stages}"
               "--Arch_{arch}", head="{kernel}-Sig-F__{functional}")
ENTRY = Spelling("entry (0.13b+)", ";;#F;{functional};;#P;{perf};;#CO;waves_per_eu={waves_per_eu};"
                 "num_warps={num_warps};num_stages={num_stages};;arch={arch}", sep=";", named=True, digest_files=True)
