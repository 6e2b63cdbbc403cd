"""The row pitch of packed NVFP4 codes in global memory, as pure integer functions.

An NVFP4 operand (M, K) stores two E2M1 codes per byte, so a row holds K / 2 bytes of codes.
The TMA (and every 16-byte vector load) needs each row to start on a 16-byte boundary: its
global strides must be multiples of 16 bytes. K % 32 == 0 gives that for free; the format
only asks K % 16 == 0 (one scale per 16 elements), and K = 8208, 2880 + 16, 48 ... leave rows
of K / 2 = 8 mod 16 bytes. So rows of codes are stored `row_pitch(K)` bytes apart: K / 2
rounded up to 16, the bytes past K / 2 padding (zeros, never read as codes). For K % 32 == 0
the pitch is K / 2 and the codes are plainly contiguous, as before.

Batches of an (L, M, K) operand are M * row_pitch(K) bytes apart. The functions take plain
ints or DSL integers alike (kernels evaluate them on device values, tests on ints).
"""

from __future__ import annotations

ROW_ALIGN = 16  # bytes: the TMA's global-stride granularity


def row_pitch(K):
    """Bytes from one row of packed codes to the next: K / 2 rounded up to `ROW_ALIGN`."""
    return (K // 2 + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN


def padded(K) -> bool:
    """Whether rows of K codes carry padding bytes (K % 32 != 0)."""
    return K // 2 % ROW_ALIGN != 0


def strides(M, K, batched: bool = False) -> tuple:
    """Element strides of the codes tensor (..., M, K / 2) of uint8: (M * pitch,) pitch, 1."""
    p = row_pitch(K)
    return (M * p, p, 1) if batched else (p, 1)
