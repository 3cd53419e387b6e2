"""The backward op's dispatch table as a tree's generator writes it (0.11b and later): which
functionals can ever launch the fused backward kernel.

The generator writes, into its build dir's `flash/`:

- `iface.op_attn_bwd.h`: the backends, `enum BackendEnum { …, kShim_BwdKernelFuse = 1, … }`;
- `iface.op_attn_bwd.cc`: `godel_number()`, which numbers a functional from its fields (for each
  field, `if (args.F == V) number = D ;` then `sum += number * W;`), and
  `optune_table[][N]`, one block of N entries per arch. An entry is either a trivial function
  named after the one backend it sets for every input (`optune_op_attn_bwd__Trivial_<backend>`)
  or a tuned function whose file in `optune.op_attn_bwd/` holds a lookup table of backend
  indices per sequence-length bin (`lut[…] = {…}` up to `// End of GPU …`).

A functional whose entry never names the fused backend, in any arch block, never launches the fused
kernels through the table; the launcher's own fallback is the first backend (the split kernels),
so it does not reach them either. What the table cannot rule out: callers that force a backend
(`attn_options.force_backend_index`, a debugging option) and, in 0.10b-0.12.1b, the v2
`attn_bwd_fused` function (docs/build.md). A tree whose generator writes no backward op (0.10b) has
no table: `read_bwd_op_table` returns None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from codegen.core.errors import UpstreamError

IFACE = "iface.op_attn_bwd.cc"
HEADER = "iface.op_attn_bwd.h"
TUNED_DIR = "optune.op_attn_bwd"
FUSED_BACKEND = "kShim_BwdKernelFuse"
FUSED_FAMILY = "bwd_kernel_fuse"   # the Triton kernel (and image folder) of that backend
FUSED_BACKEND_INDEX = 1            # its BackendEnum value in 0.11b-main (read_bwd_op_table reads the header)
# the arguments that make the fused kernel's functional (its image package), in 0.11b-main
FUSED_FUNCTIONAL = ("Q", "BLOCK_DMODEL", "CAUSAL_TYPE", "ENABLE_DROPOUT", "PADDED_HEAD", "BIAS_TYPE")

_FIELD_RE = re.compile(r"if \(args\.(\w+)(?:->dtype\(\))? == (?:DType::)?(\w+)\) number = (\d+)")
_MULT_RE = re.compile(r"sum \+= number \* (\d+)")
_ENTRY_RE = re.compile(r"&([\w:]+)")
_SIZE_RE = re.compile(r"optune_table\[\]\[\s*(\d+)\s*\]")
_ENUM_RE = re.compile(r"\b(\w+)\s*=\s*(-?\d+)")
_LUT_VALUE_RE = re.compile(r"(?<![\w\[])(-?\d+)(?=\s*[,}])")


@dataclass(frozen=True)
class BwdOpTable:
    """Per functional number, whether any arch's entry can name the fused backend; and the fields
    that number a functional: (argument name, value -> digit, weight)."""

    fields: tuple[tuple[str, dict[str, int], int], ...]
    fused: tuple[bool, ...]

    def number(self, values: dict[str, str]) -> int | None:
        """The functional number of these field values, None when a value is not in the table."""
        total = 0
        for name, digits, weight in self.fields:
            if values.get(name) not in digits:
                return None
            total += digits[values[name]] * weight
        return total

    def can_pick_fused(self, values: dict[str, str]) -> bool:
        """False only where the table proves it: a functional it numbers, whose entries never name
        the fused backend. A functional it cannot number counts as reachable."""
        n = self.number(values)
        return n is None or n >= len(self.fused) or self.fused[n]


def _fail(path: Path, what: str) -> UpstreamError:
    return UpstreamError(f"{path}: {what}: the backward op table is not in the form this tool reads "
                         f"(codegen/formats/op_table.py)")


def _backend_index(header: Path) -> int:
    text = header.read_text(encoding="utf-8", errors="replace")
    start = text.find("enum BackendEnum")
    if start < 0:
        raise _fail(header, "no BackendEnum")
    values = dict(_ENUM_RE.findall(text[start:text.find("}", start)]))
    if values.get(FUSED_BACKEND) != str(FUSED_BACKEND_INDEX):
        raise _fail(header, f"{FUSED_BACKEND} is not backend {FUSED_BACKEND_INDEX}")
    return FUSED_BACKEND_INDEX


def _fields(iface: Path, text: str) -> tuple[tuple[str, dict[str, int], int], ...]:
    start = text.find("godel_number() const")
    end = text.find("\n}\n", start)
    if start < 0 or end < 0:
        raise _fail(iface, "no godel_number()")
    fields = []
    for block in text[start:end].split("int64_t number = -1;")[1:]:
        found, mult = _FIELD_RE.findall(block), _MULT_RE.search(block)
        if not found or mult is None or len({f for f, _, _ in found}) != 1:
            raise _fail(iface, "a godel_number() field without its values or weight")
        fields.append((found[0][0], {v: int(n) for _, v, n in found}, int(mult.group(1))))
    if not fields:
        raise _fail(iface, "godel_number() has no fields")
    return tuple(fields)


def _tuned(flash: Path, fused_index: int) -> dict[str, bool]:
    """Tuned entry name -> whether its lookup table holds the fused backend's index."""
    out = {}
    for path in sorted((flash / TUNED_DIR).glob("*.cc")):
        text = path.read_text(encoding="utf-8", errors="replace")
        m = re.search(r"#define CURRENT_ENTRY_PUBLIC (\w+)", text)
        start, end = text.find("lut["), text.rfind("End of GPU")
        if m is None or start < 0 or end < start:
            raise _fail(path, "a tuned entry without its lookup table")
        lut = text[start:end].split("=", 1)[1]
        out[m.group(1)] = str(fused_index) in set(_LUT_VALUE_RE.findall(lut))
    return out


def read_bwd_op_table(flash: Path) -> BwdOpTable | None:
    """The backward op table of a generator's `flash/` output; None when it wrote none (0.10b)."""
    flash = Path(flash)
    iface = flash / IFACE
    if not iface.is_file():
        return None
    fused_index = _backend_index(flash / HEADER)
    text = iface.read_text(encoding="utf-8", errors="replace")
    fields = _fields(iface, text)
    size = _SIZE_RE.search(text)
    if size is None:
        raise _fail(iface, "no optune_table")
    n = int(size.group(1))
    body = text[size.end():]
    body = body[:body.find("};")]
    entries = _ENTRY_RE.findall(body)
    if not entries or len(entries) % n:
        raise _fail(iface, f"{len(entries)} table entries for {n} functionals per arch")
    tuned = _tuned(flash, fused_index)
    can = []
    for e in entries:
        name = e.split("::")[-1]
        if "__Trivial_" in name:
            can.append(name.endswith("_" + FUSED_BACKEND))
        elif name in tuned:
            can.append(tuned[name])
        else:
            raise _fail(iface, f"entry {name} has no lookup table in {TUNED_DIR}/")
    fused = tuple(any(can[a * n + i] for a in range(len(can) // n)) for i in range(n))
    return BwdOpTable(fields, fused)
