"""What crosses the emulator's edge (codegen.emulate): one kernel launch, what executing it did,
and why it stopped when it did not end. Pure frozen models, no I/O; the Machine's child process
sends `Execution` and `Fault` back as JSON, read through these models (the child ran a kernel we
did not write: its answer is validated like any input)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_U64 = (1 << 64) - 1


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Launch(_Frozen):
    """One hipModuleLaunchKernel as the emulator runs it."""

    kernel: str = Field(min_length=1, max_length=4096)
    """The kernel's symbol (its `.name` in the code object's metadata)."""
    grid: tuple[int, int, int]
    """Workgroups in x, y, z (HIP's gridDim, not work-items)."""
    block: tuple[int, int, int]
    """Work-items per workgroup in x, y, z (HIP's blockDim)."""
    dynamic_lds: int = Field(default=0, ge=0, le=1 << 20)
    """Bytes of dynamic LDS (hipModuleLaunchKernel's sharedMemBytes)."""
    kernarg: bytes = Field(default=b"", max_length=1 << 16)
    """The explicit kernel arguments exactly as HIP passes them in the `extra`
    HIP_LAUNCH_PARAM_BUFFER_POINTER buffer; hidden arguments are laid out by the emulator from the
    code object's metadata."""

    def model_post_init(self, _ctx) -> None:
        for name, dims in (("grid", self.grid), ("block", self.block)):
            if any(d < 1 or d > 1 << 31 for d in dims):
                raise ValueError(f"{name} {dims}: every dimension is 1 to 2**31")
        if self.block[0] * self.block[1] * self.block[2] > 1024:
            raise ValueError(f"block {self.block}: more than 1024 work-items")


class Execution(_Frozen):
    """What one launch executed (every wave of every workgroup)."""

    instructions: int = Field(ge=0, le=_U64)
    """Wave instructions executed (one per wave per instruction, whatever EXEC holds)."""
    waves: int = Field(ge=0, le=_U64)
    opcodes: dict[str, int] = Field(default_factory=dict)
    """Mnemonic (lower case, as LLVM spells it) -> times executed."""
    seconds: float = Field(ge=0)
    """Wall time in the emulator, compiles of new instructions included."""


class Fault(_Frozen):
    """Why a kernel stopped before its end: a bad access, the budget, an instruction the
    emulator cannot run."""

    kernel: str = Field(max_length=4096)
    pc: int = Field(ge=-(1 << 63), le=_U64)
    """Byte offset of the faulting instruction from the kernel's first instruction."""
    instruction: str = Field(default="", max_length=4096)
    """The instruction as the emulator decoded it ("" when it could not)."""
    lane: int | None = Field(default=None, ge=0, le=63)
    address: int | None = Field(default=None, ge=0, le=_U64)
    reason: str = Field(max_length=4096)
    """"out of arena", "instruction budget", "unknown instruction", "decoder", … with details."""

    def line(self) -> str:
        """One line naming kernel, PC, instruction, lane and address."""
        where = f"{self.kernel} at pc {self.pc:#x}" if self.pc >= 0 else self.kernel
        what = f" ({self.instruction})" if self.instruction else ""
        lane = f", lane {self.lane}" if self.lane is not None else ""
        addr = f", address {self.address:#x}" if self.address is not None else ""
        return f"{where}{what}{lane}{addr}: {self.reason}"
