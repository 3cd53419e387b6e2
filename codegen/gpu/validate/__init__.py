"""`mi100-codegen validate`: prove on a GPU that flash attention runs our kernels and is correct."""
