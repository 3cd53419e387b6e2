"""The one dtype table: every spelling of a dtype that some consumer needs, keyed by its short
name (upstream's spelling, the one specs use).

    DTYPE_INFO["fp16"].triton_signature   # '*fp16:16'   (a pointer argument in a kernel signature)
    DTYPE_INFO["fp16"].torch              # 'torch.float16' (the tuning database's inputs$Q_dtype)
    DTYPE_INFO["fp16"].torch_attr         # 'float16' (getattr(torch, ...))
    DTYPE_INFO["fp16"].bytes              # 2
    DTYPE_INFO["fp16"].aotriton_enum      # 'kFloat16' (AOTriton's C++ DType)
    by_torch("torch.bfloat16").short      # 'bf16'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeInfo:
    short: str             # spec / upstream spelling, also the DB-independent short name
    torch: str             # str(torch.<dtype>): what the tuning database stores in inputs$Q_dtype
    triton_signature: str  # pointer argument in a Triton kernel signature
    bytes: int
    aotriton_enum: str     # AOTriton's C++ `DType` enumerator (the generated dispatch tables compare with it)

    @property
    def torch_attr(self) -> str:
        return self.torch.split(".", 1)[1]

    @property
    def db_value(self) -> str:
        """The value of the tuning database's `inputs$Q_dtype` column."""
        return self.torch


DTYPE_INFO: dict[str, DtypeInfo] = {
    d.short: d for d in (
        DtypeInfo("fp16", "torch.float16", "*fp16:16", 2, "kFloat16"),
        DtypeInfo("bf16", "torch.bfloat16", "*bf16:16", 2, "kBFloat16"),
        DtypeInfo("fp32", "torch.float32", "*fp32:16", 4, "kFloat32"),
    )
}


UPSTREAM_BUILDS = ("fp16", "bf16")
"""The dtypes every build compiles whatever the spec says (fp32 only where the spec has it:
AOTRITON_ENABLE_FP32_INPUTS follows `dtypes`); PyTorch sends either to the library."""


def served_dtypes(spec_dtypes) -> list[str]:
    """What a build of a spec serves: its dtypes, then those upstream builds anyway."""
    return list(spec_dtypes) + [d for d in UPSTREAM_BUILDS if d not in spec_dtypes]


def by_torch(spelling: str) -> DtypeInfo | None:
    """The dtype whose torch spelling ('torch.float16' or 'float16') is `spelling`."""
    return next((d for d in DTYPE_INFO.values() if spelling in (d.torch, d.torch_attr)), None)


def by_signature(sig: str) -> DtypeInfo | None:
    return next((d for d in DTYPE_INFO.values() if sig == d.triton_signature), None)
