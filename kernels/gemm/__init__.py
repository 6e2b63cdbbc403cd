"""GEMM kernels, one module per architecture."""
