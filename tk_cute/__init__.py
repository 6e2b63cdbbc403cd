"""tk_cute: ThunderKittens' tile semantics on NVIDIA's CuTe DSL, and the NVFP4 GEMMs built with
them for Hopper (sm_90a), Blackwell (sm_100a, sm_103a) and Rubin (sm_107a).

Public entry points: `tk_cute.gemm` (bf16/fp16/fp8 GEMM), `tk_cute.nvfp4` (the NVFP4 format:
quantize, dequantize, blocked scales, `nvfp4.gemm`). See docs/design.md for the layers.

Importing tk_cute points the CuTe DSL's disk cache of compiled code at a private directory
before anything imports the DSL (`tk_cute.dsl_cache`: the DSL runs what it loads from there).
"""

from tk_cute import dsl_cache as _dsl_cache

_dsl_cache.configure()

__version__ = "0.1.0"


def gemm(a, b, out_dtype=None, config=None, out=None):
    """C = A @ B^T on the GPU; see `tk_cute.dense_gemm.gemm`. out_dtype defaults to `out`'s
    dtype where `out` is given, else bfloat16 (as `tk_cute.nvfp4.gemm`)."""
    import torch

    from tk_cute.dense_gemm import gemm as _gemm

    if out_dtype is None:
        out_dtype = out.dtype if isinstance(out, torch.Tensor) else torch.bfloat16
    return _gemm(a, b, out_dtype, config, out)
