"""One kernel of an AOTriton tree's plan on the emulator: compiled by this Python's Triton the way
the tree's compile.py asks it to (codegen.compile.worker.compile_kernel), and its arguments packed
by name from the compile list's signature (`pack`). The instruction-level tests of real attention
kernels and the emulator's benchmark use it; a built library's launches (codegen.ship) come with
their arguments already packed by the library itself."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from codegen.compile.worker import compile_kernel
from codegen.formats.elf import read_code_object
from codegen.models.kernel import KernelEntry
from codegen.plan.kernel_list import kernel_arg_names
from codegen.upstream import signature_constant

# a runtime argument's Triton type -> struct format
_FORMATS = {"i1": "<?", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u8": "<B", "u16": "<H", "u32": "<I",
            "u64": "<Q", "fp16": "<e", "fp32": "<f", "fp64": "<d"}


@dataclass(frozen=True)
class Kernel:
    """A compiled kernel of the plan and the runtime arguments it takes, in order."""

    entry: KernelEntry
    code_object: bytes
    name: str
    shared: int                           # dynamic LDS bytes the launch gives
    args: tuple[tuple[str, str], ...]     # (parameter name, Triton type) of every runtime argument

    def pack(self, values: dict[str, int | float]) -> bytes:
        """The explicit kernel arguments: each runtime argument from `values` by name (a pointer
        or integer as an int, a float as a float; a name left out is 0), at the offset the code
        object's metadata gives; Triton's own trailing arguments (scratch pointers) are 0."""
        meta = read_code_object(self.code_object).kernels[self.name][".args"]
        explicit = [a for a in meta if not str(a.get(".value_kind", "")).startswith("hidden_")]
        if len(explicit) < len(self.args):
            raise ValueError(f"{self.name}: the code object takes {len(explicit)} arguments, the signature {len(self.args)}")
        out = bytearray(max(int(a[".offset"]) + int(a[".size"]) for a in explicit))
        for (name, typ), a in zip(self.args, explicit):
            fmt = "<Q" if typ.startswith("*") else _FORMATS[typ]
            if struct.calcsize(fmt) != int(a[".size"]):
                raise ValueError(f"{self.name}: argument {name} is {typ}, the code object gives it {a['.size']} bytes")
            value = values.get(name, 0)
            struct.pack_into(fmt, out, int(a[".offset"]), float(value) if fmt in ("<e", "<f", "<d") else int(value))
        unknown = sorted(set(values) - {n for n, _ in self.args})
        if unknown:
            raise ValueError(f"{self.name}: no runtime argument {', '.join(unknown)} (constants of this signature?)")
        return bytes(out)


def runtime_args(tree: Path, entry: KernelEntry) -> tuple[tuple[str, str], ...]:
    """(name, type) of the arguments `entry`'s compiled kernel takes: the signature's entries that
    are not constants, named by the kernel's parameters."""
    names = kernel_arg_names(str(Path(tree) / entry.source), entry.kernel_name)
    sig = [s.strip() for s in entry.signature.split(",")]
    if names is None or len(names) != len(sig):
        raise ValueError(f"{entry.id}: cannot name the {len(sig)} entries of its signature")
    return tuple((n, s.split(":")[0]) for n, s in zip(names, sig) if signature_constant(s) is None)


def compile_entry(tree: Path, entry: KernelEntry, warp_size: int = 64) -> Kernel:
    """`entry` of `tree`'s plan compiled by this Python's Triton (needs it: the tests' venv)."""
    c = entry.config
    res = compile_kernel({"source": str(Path(tree) / entry.source), "kernel_name": entry.kernel_name,
                          "signature": entry.signature, "arch": c.arch, "warp_size": warp_size,
                          "num_warps": c.num_warps, "num_stages": c.num_stages, "waves_per_eu": c.waves_per_eu})
    co = res["hsaco"]
    names = list(read_code_object(co).kernels)
    return Kernel(entry=entry, code_object=co, name=names[0] if len(names) == 1 else entry.kernel_name,
                  shared=res["shared"], args=runtime_args(tree, entry))
