"""`flash_ran(fn)`: which attention ran inside an application's own code.

An app (transformers, diffusers, ComfyUI) calls `scaled_dot_product_attention` deep inside its
model, and PyTorch picks a backend per call, falling back to the unfused math kernel without a
word. `flash_ran` runs a callable under torch's profiler (the one `validate`'s proof uses) and
reads two things from it: the ATen op each call dispatched to (`SDPA_OPS`: flash, efficient,
cuDNN, math) and the GPU kernels that ran (`EXPECTED_KERNELS`: AOTriton's `attn_fwd` and
`bwd_kernel*`/`bwd_preprocess` on ROCm, PyTorch's own `flash_fwd`/`flash_bwd` on CUDA).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from codegen.gpu.validate.gpu import detect_platform, profile_run
from codegen.gpu.validate.sdpa import EXPECTED_KERNELS, SDPA_OPS

FUSED = ("flash", "efficient")  # the backends EXPECTED_KERNELS names kernels for


@dataclass(frozen=True)
class AttentionRun:
    platform: str  # "rocm" | "cuda"
    backends: tuple[str, ...]  # what the SDPA calls dispatched to; () when the code made none
    kernels: tuple[str, ...]  # the attention kernels that ran (short names)
    flash: bool  # flash dispatched and its kernels ran: forward, and backward where one ran
    math: bool  # the math fallback ran for at least one call

    def __str__(self) -> str:
        where = "AOTriton" if self.platform == "rocm" else "PyTorch's own CUDA kernels, not AOTriton"
        if not self.backends:
            return ("flash: no. No scaled_dot_product_attention call: this code computes attention "
                    "itself (plain matmul + softmax), so no fused kernel can run")
        return (f"flash: {'yes' if self.flash else 'no'}; math fallback: {'YES' if self.math else 'no'}; "
                f"SDPA dispatched to: {', '.join(self.backends)}; "
                f"flash/efficient kernels ({where}): {', '.join(self.kernels) or 'none in the trace'}")


def read_run(platform: str, kernels: list[str], ops: list[str]) -> AttentionRun:
    """The verdict on one profiled run: `kernels` and `ops` as `profile_run` returns them."""
    backends = sorted({SDPA_OPS[op] for op in ops if op in SDPA_OPS})
    seen: dict[tuple[str, str], set[str]] = {}
    for backend in (b for b in backends if b in FUSED):
        for phase in ("fwd", "bwd"):
            pat = re.compile(rf"\w*(?:{EXPECTED_KERNELS[(platform, backend, phase)]})\w*")
            seen[(backend, phase)] = {m.group(0) for m in map(pat.search, kernels) if m}
    flash_op = next(op for op, b in SDPA_OPS.items() if b == "flash")
    backward = f"{flash_op}_backward" in ops
    flash = bool(seen.get(("flash", "fwd"))) and (not backward or bool(seen.get(("flash", "bwd"))))
    return AttentionRun(platform, tuple(backends), tuple(sorted(set().union(*seen.values()))),
                        flash, "math" in backends)


def flash_ran(fn: Callable[[], object]) -> AttentionRun:
    """Run `fn` (an app's forward, and its backward if it should be checked too) under torch's
    profiler on this machine's GPU and say which attention ran. Raises EnvironmentMissing
    without a GPU."""
    platform = detect_platform().kind
    kernels, ops = profile_run(fn)
    return read_run(platform, kernels, ops)
