"""`stream_read(a, b)`: the torch entry of the speed-of-light read (`kernels/stream_read.py`),
the yardstick the NVFP4 bench times beside the memory-bound GEMMs."""

from __future__ import annotations

import functools

import torch

from tk_cute.kernels import stream_read as sr
from tk_cute.runtime import device_index, output, raw_stream
from tk_cute.launcher import KernelCache

_CACHE = KernelCache()  # device index -> Launcher


@functools.cache
def ctas(index: int) -> int:
    """The grid: CTAS_PER_SM CTAs on every SM of the device."""
    return sr.CTAS_PER_SM * torch.cuda.get_device_properties(index).multi_processor_count


def stream_read(a: torch.Tensor, b: torch.Tensor | None = None, *, out=None) -> torch.Tensor:
    """Read every byte of CUDA tensors `a` (and `b`) once; returns int32 (ctas * WARPS,) whose
    XOR is the XOR of all their 32-bit words. Each tensor must be contiguous, of a whole
    number of 16-byte pieces, on one device; `out` (optional) receives the result."""
    tensors = [t for t in (a, b) if t is not None]
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
            raise ValueError(f"stream_read: tensors must be CUDA tensors, got "
                             f"{getattr(t, 'device', type(t).__name__)}")
        if t.device != a.device:
            raise ValueError(f"stream_read: tensors on different devices: {a.device} and "
                             f"{t.device}")
        nbytes = t.numel() * t.element_size()
        if not t.is_contiguous() or nbytes % sr.PIECE or t.data_ptr() % sr.PIECE:
            raise ValueError(f"stream_read: tensors must be contiguous, {sr.PIECE}-byte aligned "
                             f"and a multiple of {sr.PIECE} bytes, got {tuple(t.shape)} "
                             f"{t.dtype} ({nbytes} bytes at address % {sr.PIECE} = "
                             f"{t.data_ptr() % sr.PIECE})")
    index = device_index(a.device)
    grid = ctas(index)
    out = output(out, (grid * sr.WARPS,), torch.int32, a.device, "stream_read")
    views = tensors + [a]  # without b the kernel's second buffer is a again, with 0 pieces
    pieces = [t.numel() * t.element_size() // sr.PIECE for t in tensors] + [0]
    _CACHE.get(index, sr.compile_launcher)(
        a=views[0].data_ptr(), a_pieces=pieces[0], b=views[1].data_ptr(), b_pieces=pieces[1],
        out=out.data_ptr(), ctas=grid, stream=raw_stream(index))
    return out
