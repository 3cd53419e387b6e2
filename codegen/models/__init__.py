"""Data models of mi100-codegen: the spec, and every record and state file we read (frozen, pure;
the one I/O is `records.read_record`, the single reader of one bounded record file)."""

from codegen.models.checks import Diagnostic, check_target
from codegen.models.space import KernelConfig, expand_family, expand_space
from codegen.models.target import DTYPES, FAMILIES, FamilySpace, TargetSpec

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
