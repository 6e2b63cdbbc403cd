"""Group scope (TK `group<N>`): ops the threads of several warps run together, each thread
taking its share of a tile.

`decode_nvfp4(dst, src, sf, thread, threads)` expands a shared tile of packed NVFP4 bytes into a
bf16 shared tile ready for wgmma: dst[r, k] = e2m1(src[r, k]) * ue4m3(sf of (r, k // 16)),
exact (the product has at most 6 significant bits). `src` is (rows, Kb / 2) bytes, element 2i in
the low nibble; `sf` holds the stage's scale atoms in the 128x4 blocked layout, one 512-byte
atom per 128-row band covering 64 K (so Kb == 64); `dst` is (rows, Kb) bf16, any smem layout
(the swizzled wgmma layout in practice). Thread t decodes 16-byte chunks t, t + threads, ...:
a warp reads 512 contiguous bytes per step (no bank conflicts) and writes 16-byte vectors.
"""

from __future__ import annotations

import cutlass.cute as cute
from cutlass import Uint32

from tk_cute.ops import nvfp4

SCALE_ATOM_BYTES = 512  # 128 rows x 4 scales (64 K elements), the blocked layout's unit
K_PER_ATOM = 64


def decode_nvfp4(dst, src, sf, thread, threads: int):
    """dst (bf16) = e2m1(src) * ue4m3(sf), the group's `threads` threads sharing the work."""
    rows, kb = cute.size(dst, mode=[0]), cute.size(dst, mode=[1])
    if kb != K_PER_ATOM:
        raise ValueError(f"decode_nvfp4 decodes 64-wide K blocks (one scale atom); got {kb}")
    chunks_per_row = kb // 32  # 16 bytes = 32 elements
    if (rows * chunks_per_row) % threads:
        raise ValueError(f"{rows} x {chunks_per_row} chunks do not split over {threads} threads")
    src32 = cute.recast_tensor(src, Uint32)  # (rows, kb / 8): 8 codes per word
    dst32 = cute.recast_tensor(dst, Uint32)  # (rows, kb / 2): 2 bf16 per word
    sf_bytes = cute.make_tensor(sf.iterator, cute.make_layout(cute.size(sf)))
    for i in range(rows * chunks_per_row // threads):
        c = thread + i * threads
        row, q = c // chunks_per_row, c % chunks_per_row
        r = row % 128
        base = (row // 128) * SCALE_ATOM_BYTES + (r % 32) * 16 + ((r // 32) % 4) * 4
        words = cute.make_rmem_tensor((16,), Uint32)
        for g in range(2):  # two 16-element scale groups per chunk
            scale = nvfp4.ue4m3_to_bf16x2(Uint32(sf_bytes[base + q * 2 + g]))
            for h in range(2):
                j = g * 2 + h
                out = nvfp4.e2m1x8_scaled(src32[row, q * 4 + j], scale, "bf16")
                for t in range(4):
                    words[j * 4 + t] = out[t]
        for v in range(16):
            dst32[row, q * 16 + v] = words[v]


