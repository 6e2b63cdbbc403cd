"""Shared tiles (TK `st`, `sv`): typed, swizzled shared-memory tiles and their allocation.

`st(dtype, rows, cols)` is a tile *type*: rows x cols elements, row-major (the column index
contiguous), stored in the widest swizzle (32/64/128 B) the row width allows, which is the layout
TMA writes and wgmma/UMMA read (CuTe's `warpgroup.make_smem_layout_atom`). `Shared.alloc(tile,
stages)` places `stages` copies in shared memory and returns the staged CuTe tensor
(rows, cols, stages); `[None, None, i]` is stage i. `sv(dtype, n)` is a shared vector.
`Shared` counts what it places and raises at trace time once a kernel asks for more shared
memory than the compile target has (`check_smem`).

As the B operand of `warpgroup.mma_AB`, an `st(dtype, K, N)` (N contiguous) is read MN-major:
its layout is CuTe's MN-major wgmma layout transposed, so no second tile kind is needed.

TK names its K-major operand tiles the same way: an A tile is (Mb, Kb), a B tile of an ABt
product is (Nb, Kb).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass.memory import SmemAllocator
from cutlass.utils import LayoutEnum

from tk_cute.arch import TARGETS, target

# mbarriers and other small objects are 8-byte aligned; swizzled tiles need 1024-byte alignment
# (the swizzle pattern repeats every 1024 bytes and TMA/wgmma address it from the tile base).
TILE_ALIGN = 1024


@dataclass(frozen=True)
class st:
    """Shared tile type: `rows` x `cols` of `dtype`, row-major, automatically swizzled."""

    dtype: type
    rows: int
    cols: int
    swizzle: bool = True  # False: plain row-major (tiles only threads read, e.g. FP4 bytes)

    def __post_init__(self):
        row_bytes = self.cols * self.dtype.width // 8
        if not self.swizzle:
            if row_bytes % 16:
                raise ValueError(f"st row of {row_bytes} bytes: TMA rows are multiples of 16 B")
            return
        if self.rows % 8 or self.cols <= 0:
            raise ValueError(f"st rows must be a positive multiple of 8 (seen {self.rows})")
        if row_bytes % 32:
            raise ValueError(
                f"st row of {self.cols} x {self.dtype.__name__} is {row_bytes} bytes: a swizzled "
                "tile row must be a multiple of 32 bytes"
            )

    @property
    def bytes(self) -> int:
        return self.rows * self.cols * self.dtype.width // 8

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    def layout(self, stages: int = 1):
        """The staged layout (rows, cols, stages): a CuTe ComposedLayout when swizzled."""
        if not self.swizzle:
            return cute.make_layout((self.rows, self.cols, stages),
                                    stride=(self.cols, 1, self.rows * self.cols))
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, self.dtype, self.cols),
            self.dtype,
        )
        return cute.tile_to_shape(atom, (self.rows, self.cols, stages), order=(0, 1, 2))


@dataclass(frozen=True)
class sv:
    """Shared vector type: `n` elements of `dtype`."""

    dtype: type
    n: int

    @property
    def bytes(self) -> int:
        return self.n * self.dtype.width // 8


class Shared:
    """Shared-memory allocation inside a kernel (TK's `shared_allocator`)."""

    def __init__(self):
        self._alloc = SmemAllocator()
        self.bytes = 0  # an upper bound of what is placed so far (smem_bytes' rule)

    def _count(self, nbytes: int, align: int):
        self.bytes = -(-self.bytes // align) * align + nbytes
        from cutlass.cutlass_dsl import CuTeDSL

        arch = str(CuTeDSL._get_dsl().get_arch_enum())
        if arch in TARGETS:
            check_smem(self.bytes, arch)

    def alloc(self, tile: st | sv, stages: int = 1):
        """`stages` copies of a tile (a (rows, cols, stages) tensor) or a vector (n, stages)."""
        self._count(tile.bytes * stages, 16 if isinstance(tile, sv) else
                    TILE_ALIGN if tile.swizzle else 128)
        if isinstance(tile, sv):
            return self._alloc.allocate_tensor(
                tile.dtype, cute.make_layout((tile.n, stages)), byte_alignment=16
            )
        layout = tile.layout(stages)
        if not tile.swizzle:
            return self._alloc.allocate_tensor(tile.dtype, layout, byte_alignment=128)
        return self._alloc.allocate_tensor(
            tile.dtype, layout.outer, byte_alignment=TILE_ALIGN, swizzle=layout.inner
        )

    def barriers(self, n: int):
        """Storage for `n` mbarriers (Int64 each); see `tk_cute.types.semaphore`."""
        self._count(8 * n, 8)
        return self._alloc.allocate_array(cutlass.Int64, n)


def smem_bytes(*tiles: tuple[st | sv, int], barriers: int = 0) -> int:
    """Shared memory a kernel uses for (tile, stages) pairs and `barriers` mbarriers, counting
    the 1024-byte alignment of every swizzled tile (an upper bound of the allocator's layout)."""
    total = 8 * barriers
    for tile, stages in tiles:
        if isinstance(tile, st):
            align = TILE_ALIGN if tile.swizzle else 128
            total = -(-total // align) * align
        total += tile.bytes * stages
    return total


def check_smem(nbytes: int, arch: str) -> int:
    """Raise ValueError when `nbytes` of shared memory exceed what one block may use on `arch`
    (`tk_cute.arch.Target.smem_bytes`); returns `nbytes` otherwise."""
    capacity = target(arch).smem_bytes
    if nbytes > capacity:
        raise ValueError(f"shared memory budget exceeded: {nbytes} bytes requested, {arch} gives a "
                         f"block at most {capacity} bytes")
    return nbytes
