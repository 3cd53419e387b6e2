"""`mi100-codegen precompile`: cross-compile the plan's kernels for the target with Triton on a
CPU, read each code object's resources and judge every config (see docs/precompile.md)."""
