"""`mi100-codegen plan`: run a tree's own generator for the target GPUs only and list the kernels
`ninja install` would compile (reusable by precompile through `kernel_list`)."""

from codegen.plan.kernel_list import KernelEntry, generate_kernel_list, parse_compile_list
from codegen.plan.summary import PlanSummary, summarize

__all__ = ["KernelEntry", "PlanSummary", "generate_kernel_list", "parse_compile_list", "summarize"]
