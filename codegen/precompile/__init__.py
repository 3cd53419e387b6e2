"""`mi100-codegen precompile`: cross-compile the plan's kernels for the target with Triton on a
CPU, read each code object's resources and judge every config (see docs/precompile.md)."""

from __future__ import annotations

# Lazy: render and apply import codegen.precompile.limits, which must not pull in the compiler
# machinery (prune imports the plan and ruamel).
_LAZY = {"largest_clean_waves_per_eu": "prune", "load_compile_report": "prune"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["largest_clean_waves_per_eu", "load_compile_report"]
