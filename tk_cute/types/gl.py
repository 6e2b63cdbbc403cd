"""Global layouts (TK `gl`) and tile coordinates (`coord`).

A `gl` is a global tensor viewed in tiles of one shared-tile type, carrying the TMA descriptor
made on the host for that tile (TK builds its descriptors in the `gl` constructor the same way).
The tensor is (rows, cols, batch) with cols contiguous, as CuTe's TMA helpers expect; `coord`
indexes it in units of the tile, like TK's `coord{b, d, r, c}` (no depth dimension here).

`gl` is a `DeviceStruct`: kernels take it as an argument directly. Underneath, `.atom` is the
CuTe TMA copy atom and `.tensor` the TMA coordinate tensor.

A `gl` of an `st_mma` tile (a tcgen05 operand or scale tile of a CTA pair, made on the host by
`tk_cute.ops.tma.pair_gl`) is tiled the way the pair's MMA partitions it: `tiles()` is this
CTA's share, (TMA tile modes, row tiles, K tiles, batch), so `coord` and `tma.load_async` work
on it as on a plain tile.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from tk_cute.types.st import st, st_mma
from tk_cute.types.struct import DeviceStruct


class coord(NamedTuple):
    """Tile coordinates: row tile, column tile, batch (TK `coord{b, 0, r, c}`)."""

    r: object
    c: object
    b: object = 0


class gl(DeviceStruct):
    """A global tensor in tiles of `tile`, with the TMA descriptor to load or store them."""

    _fields = ("atom", "tensor")

    def __init__(self, atom, tensor, tile: st | st_mma, multicast: int = 1, cluster=(1, 1)):
        self.atom, self.tensor, self.tile, self.multicast = atom, tensor, tile, multicast
        self.cluster = cluster  # (CLUSTER_M, CLUSTER_N) of an `st_mma` load

    @classmethod
    def load(cls, tensor: cute.Tensor, tile: st, multicast: int = 1) -> "gl":
        """Host side: a TMA load descriptor; `multicast` CTAs share each tile (cluster)."""
        _check_global(tensor, tile)
        op = cpasync.CopyBulkTensorTileG2SOp() if multicast == 1 else (
            cpasync.CopyBulkTensorTileG2SMulticastOp())
        atom, tma_tensor = cpasync.make_tiled_tma_atom(
            op, tensor, cute.slice_(tile.layout(1), (None, None, 0)), tile.shape,
            num_multicast=multicast,
        )
        return cls(atom, tma_tensor, tile, multicast)

    @classmethod
    def store(cls, tensor: cute.Tensor, tile: st) -> "gl":
        """Host side: a TMA store descriptor for tiles of `tile`."""
        _check_global(tensor, tile)
        atom, tma_tensor = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), tensor,
            cute.slice_(tile.layout(1), (None, None, 0)), tile.shape,
        )
        return cls(atom, tma_tensor, tile)

    def tiles(self):
        """The tensor divided into tiles: (rows, cols, row tiles, col tiles, batch); for an
        `st_mma` this CTA's MMA partition of them: ((MMA atom), MMA_M|N, MMA_K, row tiles,
        K tiles, batch)."""
        t = self.tile
        if not isinstance(t, st_mma):
            return cute.local_tile(self.tensor, t.shape, (None, None, None))
        keep = (None, 0, None) if t.operand == "A" else (0, None, None)
        tiles = cute.local_tile(self.tensor, cute.slice_(t.tma_tiler or t.tiler, keep),
                                (None, None, None))
        bidx, _, _ = cute.arch.block_idx()
        thr = t.tma_mma.get_slice(bidx % 2)  # this CTA's half of the pair (block x parity)
        return thr.partition_A(tiles) if t.operand == "A" else thr.partition_B(tiles)

    def tiles_from(self, rows: object, cols: object):
        """`tiles()` of a plain tile type with tile (0, 0) at element (rows, cols): tiles moved
        off the tile grid (an edge tile moved back inside the tensor, so that no TMA box row
        lies past it)."""
        t = self.tile
        return cute.local_tile(cute.domain_offset((rows, cols, 0), self.tensor), t.shape,
                               (None, None, None))

    def num_tiles(self, axis: int):
        """Tiles along `axis` of `tiles()`: 0 rows, 1 columns (K for an MMA operand), 2 batch."""
        first = 3 if isinstance(self.tile, st_mma) else 2
        return cute.size(self.tiles(), mode=[first + axis])

    def cluster_layout(self):
        """(V, M, N, K) layout of the cluster's CTAs around the MMA this `gl` is tiled by."""
        thr = self.tile.tma_mma.thr_id.shape
        return cute.tiled_divide(cute.make_layout((*self.cluster, 1)), (thr,))

    def prefetch(self):
        """Prefetch the TMA descriptor into the constant cache (one thread)."""
        cpasync.prefetch_descriptor(self.atom)


def row_major(ptr, rows, cols, batch=1, pitch=None) -> cute.Tensor:
    """The global tensor (rows, cols, batch) at `ptr`, cols contiguous, rows `pitch` elements
    apart (default cols: packed), batches packed (what `gl.load` / `gl.store` take; TK's
    `gl<T, b, 1, r, c>`)."""
    pitch = cols if pitch is None else pitch
    return cute.make_tensor(ptr, cute.make_layout((rows, cols, batch),
                                                  stride=(pitch, 1, rows * pitch)))


def col_major(ptr, rows, cols, batch=1, pitch=None) -> cute.Tensor:
    """The global tensor (rows, cols, batch) at `ptr`, rows contiguous, columns `pitch`
    elements apart (default rows), batches packed: the transpose of a `row_major` (cols, rows)
    tensor, which is how a kernel computing D^T (A and B swapped) stores D."""
    pitch = rows if pitch is None else pitch
    return cute.make_tensor(ptr, cute.make_layout((rows, cols, batch),
                                                  stride=(1, pitch, cols * pitch)))


def _check_global(tensor: cute.Tensor, tile: st):
    if tensor.element_type != tile.dtype:
        raise TypeError(
            f"gl of {tensor.element_type} cannot move tiles of {tile.dtype.__name__}"
        )
