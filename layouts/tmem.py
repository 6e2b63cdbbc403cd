# SPDX-License-Identifier: MIT
"""Tensor-memory column maps for block-scaled tcgen05 GEMMs (pure functions, host-provable).

TMEM is 128 lanes x 512 (Rubin: 576) columns of 32 bits per SM. A CTA's fp32 accumulator of
128 rows x N takes N columns (one row per lane). Scale factors arrive by `tcgen05.cp
32x128b.warpx4`: a 512-byte atom (32 rows x 16 bytes, the 128x4 blocked unit) becomes 4 columns,
replicated over the 4 lane quarters, so each 128 rows x 64 K elements (4 UE4M3 scales per row)
of scales cost 4 columns. Accumulators come first, then SFA, then SFB.
"""

from __future__ import annotations

from dataclasses import dataclass

SF_ATOM_ROWS = 128  # rows of one blocked scale atom (32 x 4 lane quarters)
SF_ATOM_K = 64  # K elements one atom column group covers (4 scales of 16)
SF_ATOM_COLUMNS = 4  # TMEM columns one 512-byte atom occupies


@dataclass(frozen=True)
class Region:
    """`columns` 32-bit TMEM columns from `offset` (all 128 lanes); TK's `tt` placement."""

    name: str
    offset: int
    columns: int

    @property
    def end(self) -> int:
        return self.offset + self.columns


def scale_columns(rows: int, k: int) -> int:
    """TMEM columns for the scales of `rows` x `k` FP4 elements (rows rounded up to 128)."""
    return -(-rows // SF_ATOM_ROWS) * (k // SF_ATOM_K) * SF_ATOM_COLUMNS


def nvfp4_columns(m_cta: int, n: int, kb: int, m_mmas: int, acc_stages: int) -> dict:
    """Column map of the NVFP4 GEMM: accumulators, then SFA and SFB for one K stage.

    Args:
        m_cta: rows of A one CTA holds (Mb / 2 on a pair).
        n: tile N (each accumulator takes n columns).
        kb: FP4 elements of K per stage.
        m_mmas: accumulators per stage (2 when two MMAs share B).
        acc_stages: accumulator buffers (2 = double-buffered).
    """
    acc = m_mmas * n * acc_stages
    sfa = scale_columns(m_cta, kb)
    sfb = scale_columns(n, kb)
    return {
        "acc": Region("acc", 0, acc),
        "SFA": Region("SFA", acc, sfa),
        "SFB": Region("SFB", acc + sfa, sfb),
    }
