"""What executing a library's flash attention on an emulated GPU found (codegen.ship.execute): per
case, each compared tensor's largest error against its tolerance, the kernels that ran and the
instructions they executed, and the fault that stopped one; for the run, the opcodes executed out
of those in the code objects the cases loaded. Pure frozen models; the CLI renders them."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, computed_field


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class TensorCheck(_Frozen):
    """One output against its fp64 reference: `error` the largest absolute difference (inf: a NaN
    or an infinity the reference lacks), `tolerance` the rule's bound (codegen.ship.reference)."""

    name: str
    error: float
    tolerance: float
    magnitude: float   # the largest |reference|

    @computed_field
    @property
    def ok(self) -> bool:
        return math.isfinite(self.error) and self.error <= self.tolerance


class KernelRun(_Frozen):
    """The launches of one kernel in one phase of a case (fwd, bwd, mask)."""

    phase: str
    kernel: str          # the stem it was packed under (dispatch.ImageIndex), else the ELF symbol
    launches: int = 0
    waves: int = 0
    instructions: int = 0
    seconds: float = 0.0


class CaseFault(_Frozen):
    """A launch that did not finish: the emulator's fault report (codegen.models.emulate.Fault) as text."""

    kernel: str
    phase: str
    message: str


class ExecutedCase(_Frozen):
    case: str
    dtype: str
    head_dim: int
    causal: bool
    bias: bool
    dropout: float
    shape: str
    fwd: int | None = None          # the library's HIP error codes (None: never returned)
    bwd: int | None = None
    mask: int | None = None         # debug_simulate_encoded_softmax's, with dropout
    tensors: list[TensorCheck] = []
    kernels: list[KernelRun] = []
    fault: CaseFault | None = None
    seconds: float = 0.0            # wall time of the case, execution and reference

    @computed_field
    @property
    def instructions(self) -> int:
        return sum(k.instructions for k in self.kernels)

    @computed_field
    @property
    def ok(self) -> bool:
        codes = (self.fwd, self.bwd) + ((self.mask,) if self.dropout > 0 else ())
        return (self.fault is None and all(c == 0 for c in codes) and bool(self.tensors)
                and all(t.ok for t in self.tensors)
                and any(k.phase == "fwd" for k in self.kernels) and any(k.phase == "bwd" for k in self.kernels))


class OpcodeCoverage(_Frozen):
    """Per kernel that ran: the distinct opcodes of its code (`present`, from the disassembly) and
    those executed at least once (`executed`)."""

    kernel: str
    present: list[str] = []
    executed: dict[str, int] = {}

    @computed_field
    @property
    def never_executed(self) -> list[str]:
        return sorted(set(self.present) - set(self.executed))


class ExecuteReport(_Frozen):
    label: str
    arch: str
    target: str
    cases: list[ExecutedCase] = []
    opcodes: list[OpcodeCoverage] = []
    packed_kernels: int = 0         # kernels the library's images pack
    returncode: int = 0
    stderr_tail: str = ""
    seconds: float = 0.0
    problems: list[str] = Field(default_factory=list)   # outside any case (the driver, the channel)

    @computed_field
    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.problems and bool(self.cases) and all(c.ok for c in self.cases)

    @computed_field
    @property
    def instructions(self) -> int:
        return sum(c.instructions for c in self.cases)


__all__ = ["CaseFault", "ExecuteReport", "ExecutedCase", "KernelRun", "OpcodeCoverage", "TensorCheck"]
