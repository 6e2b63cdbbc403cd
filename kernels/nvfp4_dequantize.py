# SPDX-License-Identifier: MIT
"""NVFP4 block dequantization on the GPU: D[m, k] = e2m1(q[m, k]) * ue4m3(sf[m, k // 16]), bf16.

The global scale is left out on purpose: e2m1 * ue4m3 is exact in bf16 (<= 6 significant
bits, 2^-10 .. 2688), times an fp32 global scale it would not be. A GEMM on two such matrices,
accumulating in fp32 and multiplying by gA * gB in its epilogue, computes what FP4 tensor cores
compute (`kernels/gemm/nvfp4_sm90.py`, path "dequantize").
One thread per 16 packed bytes (32 elements): one 16-byte load, two scale bytes at their
blocked-layout offsets (`tk_cute.layouts.nvfp4_scales.blocked_offset`), the register decode of
`tk_cute.ops.nvfp4`, four 16-byte stores. Memory-bound: 0.5625 B read + 2 B written per element.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import torch
from cutlass import Uint32

from tk_cute.ops import nvfp4 as fp4
from tk_cute.runtime import KernelCache, as_cute, stream

THREADS = 256
ELEMS_PER_THREAD = 32


@cute.kernel
def _dequantize_kernel(data: cute.Tensor, scales: cute.Tensor, out: cute.Tensor):
    rows, k_bytes = data.shape
    chunks_per_row = k_bytes // 16
    c = cute.arch.block_idx()[0] * THREADS + cute.arch.thread_idx()[0]
    if c < rows * chunks_per_row:
        row, q = c // chunks_per_row, c % chunks_per_row
        rk = (k_bytes // 8 + 3) // 4  # scale atoms per 128-row band (ceil(K / 64))
        r = row % 128
        base = (row // 128) * rk * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4
        raw = cute.make_rmem_tensor((16,), cutlass.Uint8)  # 16 bytes = 32 codes, one vector load
        cute.autovec_copy(cute.local_tile(data, (1, 16), (row, q)), raw)
        packed = cute.recast_tensor(raw, Uint32)
        words = cute.make_rmem_tensor((16,), Uint32)
        for g in cutlass.range_constexpr(2):
            kb = q * 2 + g
            sf = fp4.ue4m3_to_bf16x2(Uint32(scales[base + (kb // 4) * 512 + kb % 4]))
            for h in cutlass.range_constexpr(2):
                j = g * 2 + h
                decoded = fp4.e2m1x8_scaled(packed[j], sf, "bf16")
                for t in cutlass.range_constexpr(4):
                    words[j * 4 + t] = decoded[t]
        values = cute.recast_tensor(words, out.element_type)
        cute.autovec_copy(values, cute.local_tile(out, (1, ELEMS_PER_THREAD), (row, q)))


@cute.jit
def _dequantize(data: cute.Tensor, scales: cute.Tensor, out: cute.Tensor, stream):
    chunks = data.shape[0] * (data.shape[1] // 16)
    _dequantize_kernel(data, scales, out).launch(
        grid=((chunks + THREADS - 1) // THREADS, 1, 1), block=(THREADS, 1, 1), stream=stream)


_CACHE = KernelCache()


def dequantize_blocks(q, out: torch.Tensor | None = None) -> torch.Tensor:
    """e2m1 * ue4m3 of a 2-D CUDA NVFP4Tensor as a bf16 (M, K) tensor (global scale NOT applied).

    K must be a multiple of 32 (one thread's 16 packed bytes)."""
    M, K = q.shape
    if q.data.device.type != "cuda":
        raise ValueError(f"dequantize_blocks runs on CUDA tensors, got {q.data.device}")
    if K % 32:
        raise ValueError(f"dequantize_blocks needs K to be a multiple of 32, got K={K}")
    out = torch.empty(M, K, dtype=torch.bfloat16, device=q.data.device) if out is None else out
    args = [as_cute(q.data, leading_dim=1), as_cute(q.scales.reshape(-1), leading_dim=0),
            as_cute(out, leading_dim=1)]
    fn = _CACHE.get("bf16", lambda: cute.compile(_dequantize, *args, stream()))
    fn(*args, stream())
    return out
