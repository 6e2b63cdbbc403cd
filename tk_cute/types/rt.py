"""Register tiles (TK `rt`, `rv`): fragments of a tile spread over the threads of a scope.

An `rt` is a CuTe register tensor (`.frag`) plus the tiled MMA whose thread layout places it:
`rt.accumulator(tiled_mma, thread, rows, cols)` is the fp32 accumulator a warpgroup MMA writes
(TK `rt_fl`), in wgmma's C layout: each warp owns 16 rows of every 64; lane l holds rows
l/4 and l/4 + 8 of its warp's 16, and columns 2(l%4) + {0, 1} of every 8 (TK's base-tile layout).
`rt.operand_A(tiled_mma, thread, rows, cols, dtype)` is a 16-bit A operand tile in the layout a
register-sourced (RS) wgmma reads (TK's `rt_bf` as an MMA A input); `warpgroup.load` fills it from
a shared tile with ldmatrix. The accumulator's rows are a multiple of 64 (one wgmma M per
warpgroup) and its columns a multiple of 8 (wgmma's N step): other shapes fail at trace time.
`rv` is a per-row or per-column vector of such a tile (TK `col_vec` / `row_vec`): one register
for every distinct row (column) the thread touches.

Element-wise ops (`zero`, `copy`, `mul`, `add`, `mul_row`, `mul_col`) and reductions (`row_max`,
`row_sum`, `col_max`, `col_sum`) live in `tk_cute.ops.register`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.cute.nvgpu import OperandMajorMode
from cutlass.cute.nvgpu.warpgroup import OperandSource

WGMMA_M = 64  # rows of one wgmma (one warpgroup)
WGMMA_N_STEP = 8  # wgmma N is a multiple of 8 (8..256)


class rt:
    """A register tile: `frag` (CuTe rmem tensor) laid out by `tiled_mma` for one thread."""

    def __init__(self, frag, tiled_mma, thr_mma, rows: int, cols: int, operand: str = "C"):
        self.frag, self.tiled_mma, self.thr_mma = frag, tiled_mma, thr_mma
        self.rows, self.cols = rows, cols
        self.operand = operand  # "C": accumulator layout; "A": wgmma register A operand

    @classmethod
    def accumulator(cls, tiled_mma, thread, rows: int, cols: int, dtype=cutlass.Float32):
        """The (rows, cols) accumulator tile `tiled_mma` produces, for thread `thread` of the
        MMA's threads (0-based within the consumer warpgroups)."""
        _check_tile("rt.accumulator", tiled_mma, rows, cols, mode=1)
        thr = tiled_mma.get_slice(thread)
        shape = thr.partition_shape_C((rows, cols))
        return cls(cute.make_rmem_tensor(shape, dtype), tiled_mma, thr, rows, cols)

    @classmethod
    def operand_A(cls, tiled_mma, thread, rows: int, cols: int, dtype=None):
        """A (rows, cols = K) A operand tile in registers for `tiled_mma`'s MMAs (the RS form:
        `warpgroup.mma_ABt(acc, this, b)`), 16-bit types only; fill it with `warpgroup.load`."""
        dtype = dtype or tiled_mma.op.a_dtype
        if dtype.width != 16:
            raise TypeError(f"rt.operand_A: wgmma takes A from registers for 16-bit types only "
                            f"(bf16/fp16); got {dtype.__name__}")
        rs = wgmma_variant(tiled_mma, a_from_registers=True)
        _check_tile("rt.operand_A", rs, rows, cols, mode=2)
        thr = rs.get_slice(thread)
        frag = rs.make_fragment_A(thr.partition_shape_A((rows, cols)))
        return cls(frag, rs, thr, rows, cols, operand="A")

    def coords(self):
        """(row, col) of each of this thread's elements, as a tensor shaped like `frag`."""
        return self.thr_mma.partition_C(cute.make_identity_tensor((self.rows, self.cols)))

    def like(self, dtype=None):
        """A new tile with the same layout (and `dtype`, default the same)."""
        frag = cute.make_rmem_tensor(self.frag.shape, dtype or self.frag.element_type)
        return rt(frag, self.tiled_mma, self.thr_mma, self.rows, self.cols, self.operand)

    @property
    def dtype(self):
        return self.frag.element_type


def _check_tile(what: str, tiled_mma, rows: int, cols: int, mode: int):
    """Trace-time shape rules of a wgmma tile: rows a multiple of 64 per warpgroup of the tiled
    MMA, columns (mode 1: N) a multiple of 8 and of the tiled MMA's N, or (mode 2: K) of its K."""
    tile_m = tiled_mma.get_tile_size(0)
    if rows <= 0 or rows % WGMMA_M or rows % tile_m:
        raise ValueError(f"{what}: rows={rows} must be a positive multiple of {tile_m} (the base "
                         f"tile: wgmma M = {WGMMA_M} rows per warpgroup)")
    step = WGMMA_N_STEP if mode == 1 else tiled_mma.shape_mnk[2]
    if cols <= 0 or cols % step or cols % tiled_mma.get_tile_size(mode):
        raise ValueError(f"{what}: cols={cols} must be a positive multiple of "
                         f"{max(step, tiled_mma.get_tile_size(mode))} (the base tile: wgmma "
                         f"{'N is a multiple of 8' if mode == 1 else 'K per instruction'} and the "
                         f"tiled MMA's {'N' if mode == 1 else 'K'} tile)")


def wgmma_variant(tiled_mma, a_from_registers: bool = False, b_mn_major: bool = False,
                  fresh: bool = False):
    """`tiled_mma` (a Hopper wgmma tiled MMA) with A read from registers and/or B MN-major; the
    same atoms, thread layout and accumulator (C) layout. The op itself decides these modes in
    TK, so the MMA functions derive them here instead of asking the caller for another MMA.
    `fresh`: always a new object, never `tiled_mma` itself (an MMA call sets its accumulate
    field; on the tile's own MMA that state would escape the K loop into the epilogue, which
    then fails to build: "operand does not dominate")."""
    op = tiled_mma.op
    a_src = OperandSource.RMEM if a_from_registers else op.a_src
    b_major = OperandMajorMode.MN if b_mn_major else op.b_major_mode
    if a_src == op.a_src and b_major == op.b_major_mode and not fresh:
        return tiled_mma
    vmnk = tiled_mma.thr_layout_vmnk
    atoms = tuple(cute.size(vmnk, mode=[i]) for i in (1, 2, 3))
    return sm90_utils.make_trivial_tiled_mma(
        op.a_dtype, op.b_dtype, op.a_major_mode, b_major, op.acc_dtype, atoms,
        tiler_mn=tuple(op.shape_mnk[:2]), a_source=a_src)


class rv:
    """A vector of one value per distinct row (or column) of an `rt` held by this thread.

    `index[i]` is, for element i of the tile's fragment, the vector slot it belongs to; `lanes`
    are the lane-xor distances over which threads share a row (column) of the tile."""

    def __init__(self, frag, index: list[int], lanes: tuple[int, ...]):
        self.frag, self.index, self.lanes = frag, index, lanes
