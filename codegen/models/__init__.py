"""Pure data models of mi100-codegen (no I/O)."""

from .checks import Diagnostic, check_target
from .space import KernelConfig, expand_family, expand_space
from .target import DTYPES, FAMILIES, FamilySpace, TargetSpec

__all__ = [
    "DTYPES",
    "FAMILIES",
    "Diagnostic",
    "FamilySpace",
    "KernelConfig",
    "TargetSpec",
    "check_target",
    "expand_family",
    "expand_space",
]
