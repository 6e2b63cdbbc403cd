"""Group scope (TK `group<N>`): ops the threads of several warps run together, each thread
taking its share of a tile.

`decode_nvfp4(dst, src, sf, thread, threads)` expands a shared tile of packed NVFP4 bytes into a
bf16 shared tile ready for wgmma: dst[r, k] = e2m1(src[r, k]) * ue4m3(sf of (r, k // 16)) * 2^-8
(`nvfp4.BF16_DECODE_SHIFT`: the re-normalising power of two is folded into the scale, one
multiply per two elements), exact (the product has at most 6 significant bits). `src` is
(rows, Kb / 2) bytes, element 2i in the low nibble; `sf` holds the stage's scale atoms in the
128x4 blocked layout, one 512-byte atom per 128-row band covering 64 K (so Kb == 64); `dst` is
(rows, Kb) bf16, any smem layout (the swizzled wgmma layout in practice). Thread t decodes
16-byte chunks t, t + threads, ...: a warp reads 512 contiguous bytes per step (no bank
conflicts) and writes 16-byte vectors.
"""

from __future__ import annotations

import cutlass.cute as cute
import cutlass
from cutlass import Uint32

from tk_cute.layouts import nvfp4_scales
from tk_cute.ops import nvfp4


@cute.jit
def decode_nvfp4(dst, src, sf, thread, threads: cutlass.Constexpr, share=(0, 1)):
    """dst (bf16) = e2m1(src) * ue4m3(sf) * 2^-8, the group's `threads` threads sharing the
    work. `share` = (lo, hi) restricts the group to that fraction of the tile's chunks (static),
    so that two groups can split one tile."""
    rows, kb = cute.size(dst, mode=[0]), cute.size(dst, mode=[1])
    if cutlass.const_expr(kb != nvfp4_scales.ATOM_K):
        raise ValueError(f"decode_nvfp4 decodes 64-wide K blocks (one scale atom); got {kb}")
    chunks_per_row = kb // 32  # 16 bytes = 32 elements
    first = int(rows * chunks_per_row * share[0])
    chunks = int(rows * chunks_per_row * share[1]) - first
    src32 = cute.recast_tensor(src, Uint32)  # (rows, kb / 8): 8 codes per word (plain layout)
    # dst is written in its own element type: recasting a swizzled tensor does not carry the
    # swizzle over correctly (4.8.1), so 8-element (16-byte) pieces go through the bf16 view.
    sf_bytes = cute.make_tensor(sf.iterator, cute.make_layout(cute.size(sf)))
    for i in cutlass.range_constexpr(-(-chunks // threads)):
        c = thread + i * threads
        if cutlass.const_expr((i + 1) * threads <= chunks):
            _decode_chunk(dst, src32, sf_bytes, first + c, chunks_per_row)
        elif c < chunks:  # the last round, when the chunks do not split evenly
            _decode_chunk(dst, src32, sf_bytes, first + c, chunks_per_row)


def _decode_chunk(dst, src32, sf_bytes, c, chunks_per_row: int):
    """Decode 16-byte chunk `c` (32 elements of one row) into dst."""
    row, q = c // chunks_per_row, c % chunks_per_row
    # The stage holds one atom per 128-row band (Kb == 64): rk = 1.
    words = cute.make_rmem_tensor((16,), Uint32)
    for g in range(2):  # two 16-element scale groups per chunk
        sf = sf_bytes[nvfp4_scales.band_offset(row, q * 2 + g, 1)]
        scale = nvfp4.ue4m3_to_bf16x2_prescaled(Uint32(sf))
        for h in range(2):
            j = g * 2 + h
            out = nvfp4.e2m1x8_scaled_shifted(src32[row, q * 4 + j], scale)
            for t in range(4):
                words[j * 4 + t] = out[t]
    values = cute.recast_tensor(words, dst.element_type)  # 32 bf16 in registers
    for p in range(4):
        piece = cute.local_tile(dst, (1, 8), (row, q * 4 + p))
        cute.autovec_copy(cute.local_tile(values, (8,), (p,)), piece)
