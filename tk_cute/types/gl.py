"""Global layouts (TK `gl`) and tile coordinates (`coord`).

A `gl` is a global tensor viewed in tiles of one shared-tile type, carrying the TMA descriptor
made on the host for that tile (TK builds its descriptors in the `gl` constructor the same way).
The tensor is (rows, cols, batch) with cols contiguous, as CuTe's TMA helpers expect; `coord`
indexes it in units of the tile, like TK's `coord{b, d, r, c}` (no depth dimension here).

`gl` is a `DeviceStruct`: kernels take it as an argument directly. Underneath, `.atom` is the
CuTe TMA copy atom and `.tensor` the TMA coordinate tensor.
"""

from __future__ import annotations

from typing import NamedTuple

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

from tk_cute.types.st import st
from tk_cute.types.struct import DeviceStruct


class coord(NamedTuple):
    """Tile coordinates: row tile, column tile, batch (TK `coord{b, 0, r, c}`)."""

    r: object
    c: object
    b: object = 0


class gl(DeviceStruct):
    """A global tensor in tiles of `tile`, with the TMA descriptor to load or store them."""

    _fields = ("atom", "tensor")

    def __init__(self, atom, tensor, tile: st, multicast: int = 1):
        self.atom, self.tensor, self.tile, self.multicast = atom, tensor, tile, multicast

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
        """The tensor divided into tiles: (rows, cols, row tiles, col tiles, batch)."""
        return cute.local_tile(self.tensor, self.tile.shape, (None, None, None))

    def prefetch(self):
        """Prefetch the TMA descriptor into the constant cache (one thread)."""
        cpasync.prefetch_descriptor(self.atom)


def _check_global(tensor: cute.Tensor, tile: st):
    if tensor.element_type != tile.dtype:
        raise TypeError(
            f"gl of {tensor.element_type} cannot move tiles of {tile.dtype.__name__}"
        )
