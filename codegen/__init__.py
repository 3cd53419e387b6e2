"""mi100-codegen: an overlay of AOTriton's rules for GPUs AMD ships no FlashAttention kernels for."""

__version__ = "0.1.0"
