"""`mi100-codegen plan`: run a tree's own generator for the target GPUs only and list the kernels
`ninja install` would compile (reusable by precompile through `kernel_list`)."""
