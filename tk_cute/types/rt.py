"""Register tiles (TK `rt`, `rv`): fragments of a tile spread over the threads of a scope.

An `rt` is a CuTe register tensor (`.frag`) plus the tiled MMA whose thread layout places it:
`rt.accumulator(tiled_mma, thread, rows, cols)` is the fp32 accumulator a warpgroup MMA writes
(TK `rt_fl`), in wgmma's C layout: each warp owns 16 rows of every 64; lane l holds rows
l/4 and l/4 + 8 of its warp's 16, and columns 2(l%4) + {0, 1} of every 8 (TK's base-tile layout).
`rv` is a per-row or per-column vector of such a tile (TK `col_vec` / `row_vec`): one register
for every distinct row (column) the thread touches.

Element-wise ops (`zero`, `copy`, `mul`, `add`, `mul_row`, `mul_col`) and reductions (`row_max`,
`row_sum`, `col_max`, `col_sum`) live in `tk_cute.ops.register`.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute


class rt:
    """A register tile: `frag` (CuTe rmem tensor) laid out by `tiled_mma` for one thread."""

    def __init__(self, frag, tiled_mma, thr_mma, rows: int, cols: int):
        self.frag, self.tiled_mma, self.thr_mma = frag, tiled_mma, thr_mma
        self.rows, self.cols = rows, cols

    @classmethod
    def accumulator(cls, tiled_mma, thread, rows: int, cols: int, dtype=cutlass.Float32):
        """The (rows, cols) accumulator tile `tiled_mma` produces, for thread `thread` of the
        MMA's threads (0-based within the consumer warpgroups)."""
        thr = tiled_mma.get_slice(thread)
        shape = thr.partition_shape_C((rows, cols))
        return cls(cute.make_rmem_tensor(shape, dtype), tiled_mma, thr, rows, cols)

    def coords(self):
        """(row, col) of each of this thread's elements, as a tensor shaped like `frag`."""
        return self.thr_mma.partition_C(cute.make_identity_tensor((self.rows, self.cols)))

    def like(self, dtype=None):
        """A new tile with the same layout (and `dtype`, default the same)."""
        frag = cute.make_rmem_tensor(self.frag.shape, dtype or self.frag.element_type)
        return rt(frag, self.tiled_mma, self.thr_mma, self.rows, self.cols)

    @property
    def dtype(self):
        return self.frag.element_type


class rv:
    """A vector of one value per distinct row (or column) of an `rt` held by this thread.

    `index[i]` is, for element i of the tile's fragment, the vector slot it belongs to; `lanes`
    are the lane-xor distances over which threads share a row (column) of the tile."""

    def __init__(self, frag, index: list[int], lanes: tuple[int, ...]):
        self.frag, self.index, self.lanes = frag, index, lanes
