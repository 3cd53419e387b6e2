"""`mi100-codegen precompile`: cross-compile the plan's kernels for the target with Triton on a
CPU, read each code object's resources and judge every config (see docs/precompile.md)."""

from .prune import largest_clean_waves_per_eu, load_compile_report

__all__ = ["largest_clean_waves_per_eu", "load_compile_report"]
