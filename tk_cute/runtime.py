"""Running compiled kernels on torch tensors: CuTe views of torch tensors, the current stream,
and a per-process cache of compiled kernels (compile once per configuration and target).

Compile time is kept apart from run time: `KernelCache.compile_seconds` records what each
configuration cost to build, so benchmarks can report it separately.
"""

from __future__ import annotations

import time

import cutlass
import torch
from cutlass.cute.runtime import from_dlpack

# torch dtypes DLPack cannot carry travel as bytes and get their CuTe element type back.
_BYTE_VIEWS = {
    torch.float8_e4m3fn: cutlass.Float8E4M3FN,
    torch.float8_e5m2: cutlass.Float8E5M2,
}


def as_cute(t: torch.Tensor, leading_dim: int | None = None, align: int = 16):
    """A CuTe tensor viewing `t` with a dynamic layout (one compile serves every shape).
    `leading_dim` is the stride-1 mode (default: the last)."""
    view = t.view(torch.uint8) if t.dtype in _BYTE_VIEWS else t
    ct = from_dlpack(view, assumed_align=align)
    ct = ct.mark_layout_dynamic(leading_dim=t.dim() - 1 if leading_dim is None else leading_dim)
    if t.dtype in _BYTE_VIEWS:
        ct.element_type = _BYTE_VIEWS[t.dtype]
    return ct


def batched(t: torch.Tensor) -> torch.Tensor:
    """(rows, cols) -> (rows, cols, 1) with the batch stride of a whole matrix, the (R, C, L)
    form CuTe's TMA helpers take; (L, rows, cols) -> (rows, cols, L)."""
    if t.dim() == 2:
        r, c = t.shape
        return t.as_strided((r, c, 1), (t.stride(0), 1, r * t.stride(0)))
    return t.permute(1, 2, 0)


def stream():
    """The current torch CUDA stream as a CUDA driver stream handle."""
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


class KernelCache:
    """Compiled kernels by key; `get(key, build)` compiles on first use (build() -> callable)."""

    def __init__(self):
        self._kernels: dict = {}
        self.compile_seconds: dict = {}

    def get(self, key, build):
        fn = self._kernels.get(key)
        if fn is None:
            start = time.perf_counter()
            fn = self._kernels[key] = build()
            self.compile_seconds[key] = time.perf_counter() - start
        return fn
