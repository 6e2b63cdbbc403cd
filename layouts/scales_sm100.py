# SPDX-License-Identifier: MIT
"""Scale-factor layouts of the tcgen05 NVFP4 GEMM: global -> shared -> tensor memory.

One definition per level, used by `kernels/gemm/nvfp4_sm100.py` and proven on the host:
- global: the 128x4 blocked layout (`layouts.nvfp4_scales.blocked_offset`), as CuTe's
  `tile_atom_to_shape_SF(shape, 16)`;
- shared: one K stage of a CTA tile is itself blocked: a (rows/128) x (Kb/64) grid of 512-byte
  atoms, K atoms contiguous inside a 128-row band (`smem_offset`);
- tensor memory: `tcgen05.cp 32x128b.warpx4` turns atom a into 4 columns 4a..4a+3: byte b of the
  atom goes to lane b // 16 (replicated in the 4 lane quarters), column 4a + (b % 16) // 4, byte
  b % 4 of the 32-bit cell (`tmem_address`).
All targets use the K = 64 atom structure (4 scales per row per atom); Rubin's K = 128 MMA reads
two consecutive atoms, i.e. its scale operand starts at column 8j for MMA j of a stage.
"""

from __future__ import annotations

from tk_cute.layouts.nvfp4_scales import band_offset

SF_VEC = 16
ATOM_ROWS, ATOM_K = 128, 64  # one 512-byte atom: 128 rows x 64 K elements (4 scales)
ATOM_BYTES, ATOM_COLUMNS = 512, 4


def smem_offset(r: int, kb: int, rows: int, kb_per_stage: int) -> int:
    """Byte of scale (row r, 16-block kb) inside one shared stage of `rows` x `kb_per_stage`."""
    return band_offset(r, kb, kb_per_stage // 4)


def tmem_address(r: int, kb: int, rows: int, kb_per_stage: int, operand: str):
    """(lane 0..31 of every lane quarter, column from the region start, byte) of scale (r, kb).

    Inside a 4-column group the geometry is the copy's (`tcgen05.cp 32x128b.warpx4`): shared byte
    s of an atom lands in lane (s % 512) // 16, column (s % 16) // 4, byte s % 4. Groups: SFA is
    band-major (each 128-row band is its own MMA's A rows), SFB chunk-major (one MMA reads all
    N / 128 bands of a 64-K chunk side by side).
    """
    bands, chunks = -(-rows // ATOM_ROWS), kb_per_stage // 4
    band, chunk = r // ATOM_ROWS, kb // 4
    group = band * chunks + chunk if operand == "SFA" else chunk * bands + band
    s = smem_offset(r, kb, rows, kb_per_stage) % ATOM_BYTES
    return s // 16, ATOM_COLUMNS * group + (s % 16) // 4, s % 4


def mma_scale_column(operand: str, band: int, j: int, rows: int, kb_per_stage: int,
                     mma_k: int) -> int:
    """First column MMA j (K = `mma_k`) of M band `band` reads; K = 128 reads 2 groups on."""
    bands, chunks, c = -(-rows // ATOM_ROWS), kb_per_stage // 4, mma_k // ATOM_K
    group = band * chunks + j * c if operand == "SFA" else j * c * bands
    return ATOM_COLUMNS * group


# --- the CuTe layouts the kernel builds (call while a @cute.jit function is traced) ----------
def global_layout(shape):
    """SFA/SFB of an (rows, K, L) operand in global memory (the blocked layout)."""
    from cutlass.utils.blockscaled_layout import tile_atom_to_shape_SF

    return tile_atom_to_shape_SF(shape, SF_VEC)


def global_tensor(ptr, shape):
    """SFA/SFB of an (rows, K, L) operand at `ptr` as a CuTe tensor (`global_layout`)."""
    import cutlass.cute as cute

    return cute.make_tensor(ptr, global_layout(shape))


def layout_ops(n: int):
    """The K = 64 MMA ops that give the scale layouts their structure: pair (256 x n) for
    SFA/SFB in shared and tensor memory, one CTA (128 x round_up(n, 128)) for SFB's TMA."""
    import cutlass
    from cutlass.cute.nvgpu import tcgen05

    def op(m, nn, group):
        return tcgen05.MmaMXF4NVF4Op(cutlass.Float8E4M3FN, (m, nn, 64), group,
                                     tcgen05.OperandSource.SMEM)

    return op(256, n, tcgen05.CtaGroup.TWO), op(128, -(-n // 128) * 128, tcgen05.CtaGroup.ONE)


def smem_layout(operand: str, sf_mma, mma_tiler, stages: int):
    """SFA ("A") or SFB ("B") shared layout: ((atom, rest), MMA_M|N, K atoms, stage)."""
    from cutlass.utils import blockscaled_layout as bl

    make = bl.make_smem_layout_sfa if operand == "A" else bl.make_smem_layout_sfb
    return make(sf_mma, mma_tiler, SF_VEC, stages)


def tmem_layout(operand: str, sf_mma, mma_tiler, smem_stage):
    """SFA ("A") / SFB ("B") tensor-memory layout of one stage (byte units: lane << 18 |
    column << 2 | byte) from its shared layout `smem_stage` (stage 0 of `smem_layout`)."""
    from cutlass.utils import blockscaled_layout as bl

    make = bl.make_tmem_layout_sfa if operand == "A" else bl.make_tmem_layout_sfb
    return make(sf_mma, mma_tiler, SF_VEC, smem_stage)
