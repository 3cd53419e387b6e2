"""The validation matrix (pure data, no torch): which shapes, dtypes, head dims, causal modes.

Sequence lengths are primes, so no tile size (16…256) divides them: every kernel runs its
masked edge blocks. One shape has fewer K/V heads than Q heads (GQA), one has a single query
row (decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.models import TargetSpec
from codegen.models.functional import Functional


@dataclass(frozen=True, order=True)
class Shape:
    batch: int
    heads_q: int
    heads_k: int
    seqlen_q: int
    seqlen_k: int

    @property
    def gqa(self) -> bool:
        return self.heads_q != self.heads_k

    @property
    def tag(self) -> str:
        return f"b{self.batch}h{self.heads_q}k{self.heads_k}.q{self.seqlen_q}k{self.seqlen_k}"


SHAPES: tuple[Shape, ...] = (
    Shape(2, 4, 4, 211, 211),   # square: PyTorch's flash dispatch takes is_causal only when square
    Shape(2, 4, 4, 97, 211),    # seqlen_q < seqlen_k
    Shape(2, 8, 2, 331, 149),   # GQA 4:1, seqlen_q > seqlen_k
    Shape(1, 4, 4, 1, 523),     # one query row (decoding)
)

# Shapes of the Triton-kernel check: fewer (each config compiles its own kernel).
KERNEL_SHAPES: tuple[Shape, ...] = (
    Shape(2, 4, 4, 97, 211),
    Shape(1, 8, 2, 331, 149),
)


def dispatch_limit(backend: str, case: "Case") -> str | None:
    """Why PyTorch's SDPA dispatcher (sdp_utils) may refuse a case for a backend, whatever the
    kernels could do; such refusals are recorded as skips, not failures."""
    if case.shape.gqa:
        return "PyTorch routes GQA (enable_gqa) to a fused backend only on some builds"
    if backend == "flash" and case.dtype == "fp32":
        return "PyTorch's flash dispatch takes fp16/bf16 only"
    if backend == "flash" and case.causal and case.shape.seqlen_q != case.shape.seqlen_k:
        return "PyTorch's flash dispatch takes is_causal only with seqlen_q == seqlen_k"
    return None


@dataclass(frozen=True, order=True, kw_only=True)
class Case(Functional):
    """One SDPA run: a functional key (no dropout, no bias: validate's call passes neither) at a
    shape's batch and heads."""

    batch: int
    heads_q: int
    heads_k: int

    @classmethod
    def at(cls, dtype: str, head_dim: int, causal: bool, shape: Shape) -> "Case":
        return cls(dtype, head_dim, causal, False, False, shape.seqlen_q, shape.seqlen_k, batch=shape.batch,
                   heads_q=shape.heads_q, heads_k=shape.heads_k)

    @property
    def shape(self) -> Shape:
        return Shape(self.batch, self.heads_q, self.heads_k, self.seqlen_q, self.seqlen_k)

    @property
    def name(self) -> str:
        return f"{self.dtype}.d{self.head_dim}.{'causal' if self.causal else 'full'}.{self.shape.tag}"


def sdpa_cases(spec: TargetSpec) -> list[Case]:
    """Validate's matrix, sorted (by key, then batch and heads: SHAPES by their seqlens)."""
    return sorted(Case.at(dtype, hd, causal, shape) for dtype in spec.dtypes for hd in sorted(spec.head_dims)
                  for causal in (False, True) for shape in SHAPES)


# Tolerances: |x - ref| <= atol + rtol * max|ref|, or within FUDGE times the error of PyTorch's
# math backend in the same dtype (the usual bar for fused attention kernels).
TOLERANCES: dict[str, dict[str, tuple[float, float]]] = {
    "fwd": {"fp16": (2e-3, 1e-2), "bf16": (1e-2, 2e-2), "fp32": (1e-4, 1e-4)},
    "bwd": {"fp16": (1e-2, 2e-2), "bf16": (5e-2, 5e-2), "fp32": (5e-4, 5e-4)},
}
FUDGE = 5.0


def tolerance(kind: str, dtype: str, ref_max: float, math_err: float | None) -> float:
    atol, rtol = TOLERANCES[kind][dtype]
    tol = atol + rtol * ref_max
    if math_err is not None:
        tol = max(tol, FUDGE * math_err)
    return tol


# Speed and memory: one larger shape per dtype and head dim, forward + backward.
PERF_SHAPE = Shape(4, 16, 16, 2048, 2048)
