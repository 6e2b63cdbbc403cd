# SPDX-License-Identifier: MIT
"""The register-A kernels' shared-memory layouts (`kernels/gemm/nvfp4_register_a_sm90.py`,
`nvfp4_register_a_tiled_sm90.py`): where the decode wants each activation's K element (`act_column`,
a permutation of period SUB_K), the row pairing that keeps 16-byte shared accesses free of bank
conflicts (`spread_row`), and the byte offsets of the 128-byte swizzled activation and weight tiles
(`act_offset`, `weight_offset`), and where a wgmma accumulator fragment holds each element
(`acc_coord`: the register-A kernel keeps its partial sums in fragment order). Plain integer
arithmetic, the same on the host and in a kernel; tests/kernels/test_nvfp4_register_a_sm90.py
proves each against the CuTe layout of the kernel's tiles and counts the wavefronts of every
16-byte access."""

from __future__ import annotations

SUB_K = 128  # K per MMA batch (8 wgmma k16 steps) and period of the activation permutation


def act_column(k: int) -> int:
    """Column of a stage's activation tile that holds K element k (of the stage). The decode
    gives thread t, from its word j of codes 32t + 8j .. + 7, the bf16 pairs (i, i + 4) (the
    strided pairing); pair i of word j goes to k16 step 2i + j // 2 of the A operand, in slots
    2t, 2t + 1 (j even) or 2t + 8, 2t + 9 (j odd). So within each 128-K block, element
    32t + 8j + i + 4h (i < 4, h < 2) goes to column 32i + 8j + 2t + h: what `_load_natural`
    and `_store_permuted` do to each landed tile or, once per call, to the activations in
    global memory (the order that makes their 16-byte shared accesses conflict-free)."""
    block, r = divmod(k, SUB_K)
    t, r = divmod(r, 32)
    j, r = divmod(r, 8)
    h, i = divmod(r, 4)
    return block * SUB_K + 32 * i + 8 * j + 2 * t + h


def spread_row(x):
    """Row behind index x: within each 8, indices 2q, 2q + 1 take rows q, q + 4. In a 128-byte
    swizzled tile, rows q and q + 4 place any 16-byte chunk in opposite halves of the banks, so
    the 8 lanes of a quarter-warp that read 4 chunks of each of two such rows hit all 32 banks
    once (the weight reads of `decode`, the activation reads and writes of `_permute`)."""
    return x - x % 8 + (x % 8) // 2 + 4 * (x % 2)


def acc_coord(thread, e):
    """(row, column) of element e of warpgroup thread `thread`'s fp32 accumulator fragment of a
    64-row wgmma: element 4c + 2h + v of warp w's lane 4g + t holds row 16w + g + 8h, column
    8c + 2t + v (the PTX ISA's wgmma D fragment; `rt.accumulator(...).coords()`)."""
    lane = thread % 32
    return (16 * (thread // 32) + lane // 4 + 8 * ((e // 2) % 2),
            8 * (e // 4) + 2 * (lane % 4) + e % 2)


def act_offset(n_act: int, m, col):
    """Byte offset of element (m, col) in an `st(bfloat16, n_act, STAGE_K)` tile: 64-column
    atoms of 8 rows x 128 B stacked along the rows, 16-byte chunks XOR-swizzled by m % 8."""
    return ((col // 64) * n_act + m) * 128 + (((col % 64) // 8) ^ (m % 8)) * 16 + (col % 8) * 2


def weight_offset(r, chunk):
    """Byte offset of 16-byte chunk `chunk` of row r in the stage's weight tile (128-byte rows,
    128-byte swizzle)."""
    return r * 128 + (chunk ^ (r % 8)) * 16
